"""Trained models you can open: every finished pack keeps its weights (DIR/packs/<i>/weights.safetensors), and
run.model(i) is model i alone as a plain module. Checked against what the sweep itself computed inside the pack
(its results' scores and its mean attention maps, written before any weights were read back) and against the
stacked model rebuilt from the file, for every PE kind; hooks against the values they must hold; the weights
file's trust boundary against truncated, tampered and foreign files."""
from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import pe_fast
import pe_fast.sweep
from pe_fast import report
from pe_fast.models.transformer import PE_KINDS
from pe_fast.results import run_folder, weights
from pe_fast.results.reading import ModelNotFound, NoPETable, ReportError
from pe_fast.sweep import UsageError

LST_KINDS = ("learned", "random", "sin1d", "sin2d", "none", "rope", "rope2d", "relative")
# the cpu preset narrowed: the round trip is what is tested, two blocks keep the first and the last apart
TINY = dict(preset="cpu", steps=6, eval_every=3, seeds=1, threads=1, no_report=True, width=16, depth=2, mlp_width=32)


def test_every_pe_kind_is_tried():
    assert set(LST_KINDS) | {"sinnd"} == set(PE_KINDS)  # sinnd: over the fMRI regions' centroids (below)


@pytest.fixture(scope="module")
def lst_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("open") / "lst"
    pe_fast.sweep.run(task="lst", pe=list(LST_KINDS), sigmas=[0.2, 2.0], out=str(out), **TINY)
    return pe_fast.load_run(out)


@pytest.fixture(scope="module")
def fmri_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("open") / "fmri"
    pe_fast.sweep.run(task="fmri", pe=["learned", "sinnd"], sigmas=[0.5], steps=4, eval_every=2, seeds=1,
                      threads=1, no_report=True, out=str(out))
    return pe_fast.load_run(out)


def test_each_model_alone_scores_what_the_sweep_scored_in_its_pack(lst_run):
    """The test accuracy of run.model(i) on the test split, computed here, is the sweep's own for model i; its
    outputs equal the stacked model's rebuilt from the pack's file; its mean attention maps equal the ones the
    sweep computed inside the pack."""
    task = lst_run.task()
    test = lst_run.task_inputs("test")
    results = lst_run.results.set_index("model_id")
    for model_id, model in lst_run.models():
        assert model.config.pe == results.loc[model_id, "pe"]
        with torch.no_grad():
            outputs = model(test)
        score = task.score(outputs[None], "test", torch.arange(len(test)))[0]  # the task's scoring, as the sweep's
        assert score["test_acc"] == pytest.approx(results.loc[model_id, "test_acc"], abs=1e-6)
        maps = model.attention(lst_run.task_inputs(task.attention_split)).mean(dim=(1, 2)).numpy()  # [L, N, N]
        np.testing.assert_allclose(maps, lst_run.pe_tables[f"{run_folder.ATTENTION_MAP}{model_id}"], atol=2e-6)
    for index in range(len(lst_run.config["packs"])):
        pack = lst_run.pack(index)
        with torch.no_grad():
            stacked, _ = pack.model(test[:50].expand(pack.model.num_models, 50, *test.shape[1:]))
            for position, model_id in enumerate(pack.model_ids):
                np.testing.assert_allclose(lst_run.model(model_id)(test[:50]), stacked[position], atol=1e-5)


def test_a_model_that_predicts_every_token_round_trips(fmri_run):
    """fMRI: no readout token, one prediction per token, the N-dimensional sinusoidal PE (the regions' centroids)."""
    results = fmri_run.results.set_index("model_id")
    test = fmri_run.task_inputs("test")
    for model_id, model in fmri_run.models():
        with torch.no_grad():
            outputs = model(test)
        assert outputs.shape == (len(test), test.shape[1], 1)
        maps = model.attention(fmri_run.task_inputs(fmri_run.task().attention_split)).mean(dim=(1, 2)).numpy()
        np.testing.assert_allclose(maps, fmri_run.pe_tables[f"{run_folder.ATTENTION_MAP}{model_id}"], atol=2e-6)
        task = fmri_run.task()
        score = task.score(outputs[None], "test", torch.arange(len(test)))[0]
        assert score["test_r2"] == pytest.approx(results.loc[model_id, "test_r2"], abs=1e-5)


def test_the_hooks_hold_the_forwards_values_and_an_edit_changes_the_output(lst_run):
    learned = next(i for i, row in lst_run.results.iterrows() if row.pe == "learned")
    model = lst_run.model(int(lst_run.results.loc[learned, "model_id"]))
    x = lst_run.task_inputs("test")[:32]
    out, cache = model.run_with_cache(x)
    names = {"hook_embed"} | {f"blocks.{l}.{n}" for l in range(model.config.depth) for n in (
        "hook_pos_embed", "attn.hook_pattern", "attn.hook_z", "hook_attn_out", "hook_resid_mid", "hook_mlp_out",
        "hook_resid_post", "attn.hook_q", "attn.hook_k", "attn.hook_v")}
    assert names <= set(cache)
    np.testing.assert_allclose(cache["blocks.0.hook_pos_embed"][0], model.pos_embed[0].detach())
    np.testing.assert_allclose(cache["blocks.0.attn.hook_pattern"].sum(-1), 1.0, atol=1e-6)
    last = model.config.depth - 1
    readout = cache[f"blocks.{last}.hook_resid_post"][:, model.config.readout_token]
    np.testing.assert_allclose(model.head(readout).detach(), out, atol=1e-6)
    # the PE zeroed at every block, by a test of the name: the output changes, and equals a model whose PE is 0
    no_pe = model.run_with_hooks(x, [(lambda name: name.endswith("hook_pos_embed"), lambda v, hook: v * 0)])
    assert not torch.allclose(no_pe, out, atol=1e-4)
    with torch.no_grad():
        for table in model.pos_embed:
            table.zero_()
        np.testing.assert_allclose(model(x), no_pe.detach(), atol=1e-6)
    # one head's pattern replaced by the uniform one
    uniform = lambda v, hook: torch.full_like(v, 1.0 / v.shape[-1])  # noqa: E731
    assert not torch.allclose(model.run_with_hooks(x, [("blocks.0.attn.hook_pattern", uniform)]), no_pe, atol=1e-4)
    with pytest.raises(ValueError, match="fwd_hooks: no hook point"):
        model.run_with_hooks(x, [("blocks.0.hook_nothing", uniform)])
    with pytest.raises(TypeError, match="fwd_hooks: a list of"):  # 'NoneType' object is not iterable
        model.run_with_hooks(x, None)


@pytest.mark.parametrize("index, error", [(-1, ValueError), ("0", TypeError), (1.0, TypeError), (True, TypeError),
                                          (99, ValueError)])
def test_a_single_model_of_a_pack_names_a_bad_index(index, error, lst_run):
    """An IndexError, a str compared with an int, and 1.0 or True taken as a place in the pack."""
    from pe_fast.models.single import SingleTransformer
    with pytest.raises(error, match="index"):
        SingleTransformer(lst_run.pack(0).model, index)


@pytest.mark.parametrize("returned, error, why", [
    # one item's residual broadcast over every item: accepted, the output changed without a word
    (lambda v: v[:1], ValueError, r"returned \[1, 16, 16\] torch.float32 on cpu, where the value is \[4, 16, 16\]"),
    # torch's RuntimeError deep in the forward
    (lambda v: v[..., :3], ValueError, r"returned \[4, 16, 3\] .*, where the value is"),
    (lambda v: v.double(), ValueError, "returned .* torch.float64 on cpu, where the value is"),
    (lambda v: 0.5, TypeError, "returned float; return a tensor"),  # accepted
    (lambda v: "x", TypeError, "returned str"),
    # RuntimeErrors deep in the forward
    (lambda v: v.to_sparse(), TypeError, "returned a torch.sparse_coo tensor; return a dense one"),
    (lambda v: torch.nested.nested_tensor(list(v)), TypeError, "returned a nested tensor"),
])
def test_a_hook_returning_what_its_point_does_not_hold_is_named(returned, error, why, lst_run):
    model = lst_run.model(int(lst_run.results.query("pe == 'learned'")["model_id"].iloc[0]))
    x = lst_run.task_inputs("test")[:4]
    with pytest.raises(error, match=f"fwd_hooks: the hook at blocks.0.hook_resid_pre {why}"):
        model.run_with_hooks(x, [("blocks.0.hook_resid_pre", lambda v, hook: returned(v))])
    kept = model.run_with_hooks(x, [("blocks.0.hook_resid_pre", lambda v, hook: None)])  # None keeps the value
    torch.testing.assert_close(kept, model(x))


def test_names_filter_takes_names_or_a_test_and_names_itself_when_wrong(lst_run):
    """TransformerLens's names_filter is a name, names or a test; a wrong one blamed fwd_hooks, which the caller
    never passed."""
    model = lst_run.model(int(lst_run.results.query("pe == 'learned'")["model_id"].iloc[0]))
    x = lst_run.task_inputs("test")[:2]
    for names in ("hook_embed", ["hook_embed"], lambda name: name == "hook_embed", frozenset({"hook_embed"}),
                  (n for n in ["hook_embed"]), {"hook_embed": 1}.keys()):
        assert set(model.run_with_cache(x, names_filter=names)[1]) == {"hook_embed"}
    for none in ([], lambda name: False):  # none selected: an empty cache, as TransformerLens gives
        out, cache = model.run_with_cache(x, names_filter=none)
        assert cache == {} and torch.equal(out, model(x).detach())
    with pytest.raises(ValueError, match="names_filter: no hook point 'nope'"):
        model.run_with_cache(x, names_filter=["nope"])
    with pytest.raises(TypeError, match="names_filter: a hook point's name, names, or a test of a name, got 5"):
        model.run_with_cache(x, names_filter=5)


def test_a_model_moves_to_another_dtype_and_device_whole(lst_run):
    """A device move tested as a dtype move (CI has no GPU): every weight and PE buffer goes along."""
    model = lst_run.model(int(lst_run.results.query("pe == 'sin2d'")["model_id"].iloc[0]))
    x = lst_run.task_inputs("test")[:16]
    wide = model.to(torch.float64)
    assert {t.dtype for t in [*wide.parameters(), *wide.buffers()] if t.is_floating_point()} == {torch.float64}
    np.testing.assert_allclose(wide(x.double()).detach(), lst_run.model(model_id=int(
        lst_run.results.query("pe == 'sin2d'")["model_id"].iloc[0]))(x).detach(), atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bench/gpu/gpu_check.sh's tests step)")
@pytest.mark.parametrize("kind", LST_KINDS)
def test_a_model_opened_on_cuda_computes_what_it_computes_on_the_cpu(lst_run, kind):
    """run.model(i, "cuda"): every PE kind's model on the GPU gives its CPU outputs (float32 rounding: torch's
    matmuls and the Triton kernels' dots stay IEEE float32 unless asked otherwise)."""
    model_id = int(lst_run.results.query("pe == @kind")["model_id"].iloc[0])
    x = lst_run.task_inputs("test")[:16]
    on_gpu = lst_run.model(model_id, "cuda")
    assert {t.device.type for t in [*on_gpu.parameters(), *on_gpu.buffers()]} == {"cuda"}
    got = on_gpu(x.cuda()).detach().cpu()
    np.testing.assert_allclose(got, lst_run.model(model_id)(x).detach(), rtol=1e-4, atol=1e-5)


def test_a_pooled_folder_opens_its_models_where_they_were_trained(tmp_path, lst_run):
    other = tmp_path / "other"
    pe_fast.sweep.run(task="lst", pe=["learned"], sigmas=[0.2, 2.0], seed_values=[6312], out=str(other), **{
        k: v for k, v in TINY.items() if k != "seeds"})
    first = tmp_path / "first"
    shutil.copytree(lst_run.path, first)
    from pe_fast.report.pooling import pool
    pooled = pe_fast.load_run(pool([first, other], tmp_path / "pooled"))
    x = lst_run.task_inputs("test")[:8]
    source = pe_fast.load_run(other)
    for row in pooled.results.query("seed == 6312").itertuples():
        mine = source.results.query(f"sigma == {row.sigma}")["model_id"].iloc[0]
        np.testing.assert_array_equal(pooled.model(int(row.model_id))(x).detach(),
                                      source.model(int(mine))(x).detach())
    # no packs of its own: it said "has packs 0 to -1"
    with pytest.raises(ModelNotFound, match="pools finished sweeps and has no packs of its own: open its models "
                                            r"with run.model\(i\), or the packs of its sources"):
        pooled.pack(0)


def test_models_of_a_stopped_sweep_are_those_of_its_finished_packs(tmp_path, lst_run):
    """run.models() on a sweep still running or stopped: it failed at the first pack not finished ("pack 1 has no
    weights.safetensors"), though run.model(i) opened each finished model."""
    folder = tmp_path / "stopped"
    shutil.copytree(lst_run.path, folder)
    for name in ("results.parquet", "curves.parquet", "pe_tables.npz", "summary.txt", "digests.json"):
        (folder / name).unlink()
    shutil.rmtree(folder / "packs" / "1")  # pack 1 not finished
    run = pe_fast.load_run(folder)
    finished = sorted(i for pack in lst_run.config["packs"][:1] + lst_run.config["packs"][2:] for i in pack)
    assert [model_id for model_id, _ in run.models()] == finished


def test_no_weights_keeps_none_and_says_so(tmp_path):
    out = tmp_path / "run"
    pe_fast.sweep.run(task="lst", pe=["none"], no_weights=True, out=str(out), **TINY)
    assert not (out / "packs" / "0" / run_folder.WEIGHTS).exists()
    with pytest.raises(ReportError, match="--no-weights"):
        pe_fast.load_run(out).model(0)


def test_a_model_a_run_does_not_have_is_a_value_error_naming_it(lst_run):
    for bad in (10**6, "0", True, -1):
        with pytest.raises(ModelNotFound, match="model_id"):
            lst_run.model(bad)
    with pytest.raises(ValueError, match="split 'nope'"):
        lst_run.task_inputs("nope")
    # torch's RuntimeError and AssertionError ("Torch not compiled with CUDA enabled") named no argument
    for device in ("nonsense", "cuda:1000", "meta"):  # meta: NotImplementedError once the weights were copied
        with pytest.raises(ValueError, match=f"device '{device}'"):
            lst_run.model(0, device)


def test_a_pe_table_takes_the_model_ids_a_model_takes(lst_run):
    """pe_table("0") once returned model 0's table where model("0") refused the string."""
    for bad in ("0", True, 0.0):
        with pytest.raises(ModelNotFound, match=f"model_id {bad!r}: expected a model id"):
            lst_run.pe_table(bad)
    np.testing.assert_array_equal(lst_run.pe_table(np.int64(0)), lst_run.pe_table(0))


@pytest.mark.parametrize("inputs, error, why", [
    ("abc", TypeError, "not a tensor"),
    (torch.zeros(2, 16, 5, dtype=torch.complex64), TypeError, "complex"),  # its imaginary part once dropped
    # a mask taken as 0 / 1 tokens without a word (held-out round, issue 55)
    (torch.zeros(2, 16, 5, dtype=torch.bool), TypeError, "torch.bool values are a mask"),
    (torch.zeros(2, 16, 5).to_sparse(), TypeError, "a sparse_coo tensor; pass a dense one"),  # torch's RuntimeError
    (torch.zeros(2, 7), ValueError, "must be"),  # the model's own message named `tokens`
    (torch.zeros(2, 16, 5, device="meta"), ValueError, "meta"),  # torch's RuntimeError
    # a view of no memory whose attention would need terabytes: it once ran until the allocator failed
    (torch.zeros(1, 16, 5).expand(10**9, 16, 5), ValueError, "1,000,000,000 items need about .* GiB"),
    # its attention was NaN, returned without a word
    (torch.zeros(3, 16, 5).index_fill_(0, torch.tensor([2]), float("nan")), ValueError, "item 2 holds NaN or Inf"),
    # the model's reshapes failed deep inside on these (RuntimeError)
    (torch.nested.nested_tensor([torch.zeros(16, 5)] * 2), TypeError, "a nested tensor"),
    (torch.quantize_per_tensor(torch.zeros(2, 16, 5), 0.1, 0, torch.quint8), TypeError, "a quantized tensor"),
    # finite, but beyond float32's arithmetic inside the model: NaN again
    (torch.ones(3, 16, 5).index_fill_(0, torch.tensor([1]), 1e30), ValueError, "item 1 overflows model"),
    # float64 beyond float32: said to hold Inf, which they do only once cast (round 15)
    (torch.ones(3, 16, 5, dtype=torch.float64) * 1e39, ValueError, "values beyond torch.float32's range"),
])
def test_bad_attention_inputs_are_an_error_naming_them(inputs, error, why, lst_run):
    with pytest.raises(error, match=f"inputs.*{why}"):
        lst_run.attention(0, inputs)


def test_a_sweep_s_packs_folder_names_the_sweep(lst_run):
    """DIR/packs given for DIR read as a sweep with no results yet."""
    with pytest.raises(ReportError, match=f"holds the packs of the sweep {lst_run.path.resolve()}; pass that folder"):
        pe_fast.load_run(lst_run.path / "packs")


def test_a_model_listed_in_another_pack_than_its_packs_say_is_refused(tmp_path, lst_run):
    """config.json lists each model's pack twice (its models' pack, its packs): the two disagreeing passed, the
    readers going by packs alone."""
    folder = tmp_path / "edited"
    shutil.copytree(lst_run.path, folder)
    config = json.loads((folder / "config.json").read_text())
    first = config["models"][0]
    first["pack"] = (first["pack"] + 1) % len(config["packs"])
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ReportError, match=f"models lists model {first['model_id']} in pack {first['pack']}, where "
                                          f"its packs hold it in pack"):
        pe_fast.load_run(folder)


def test_a_data_file_changed_after_the_sweep_is_named_by_the_run(tmp_path):
    """Two regions of the --data file swapped after the sweep (its sizes unchanged): task_inputs and attention
    served the new data as the run's, without a word."""
    data = tmp_path / "series.npy"
    series = np.load(Path(__file__).parents[1] / "docs" / "example-fmri" / "series.npy")
    np.save(data, series)
    out = tmp_path / "run"
    pe_fast.sweep.run(task="fmri", data=str(data), pe="learned", sigmas=0.5, steps=4, eval_every=2, seeds=1,
                      threads=1, no_report=True, width=8, depth=1, mlp_width=16, out=str(out))
    assert pe_fast.load_run(out).task_inputs("test").shape[0] > 0
    np.save(data, series[:, :, [1, 0, *range(2, series.shape[2])]])
    with pytest.raises(ReportError, match=f"the task's data \\(--data {data}\\) changed since the sweep started"):
        pe_fast.load_run(out).task_inputs("test")


@pytest.mark.parametrize("edit", [lambda task: task["sizes"].update(train=5), lambda task: task.update(sizes=[1])],
                         ids=["a size", "sizes of another kind"])
def test_the_task_a_run_describes_is_the_task_its_inputs_come_from(edit, tmp_path, lst_run):
    """config.json's task description edited (8,100 training puzzles said to be 5): --resume refused it, while
    task_inputs served the loaded task's items as the run's. The folder's record of its files says so first; with
    that record rewritten too, the task loaded from the settings does."""
    folder = tmp_path / "edited"
    shutil.copytree(lst_run.path, folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config["task"])
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ReportError, match="config.json: its task, the description of the sweep's data, has changed"):
        pe_fast.load_run(folder)
    run_folder.write_digests(folder)
    with pytest.raises(ReportError, match="config.json: its task has sizes .*, where the task its settings load has"):
        pe_fast.load_run(folder).task_inputs("test")


def test_a_diverged_model_s_attention_is_its_weights_fault_not_the_inputs(tmp_path):
    """A model whose training diverged (its weights NaN) gave a NaN pattern, blamed on the task's own inputs as an
    overflow of the model's arithmetic."""
    out = tmp_path / "diverged"
    pe_fast.sweep.run(task="lst", pe="learned", sigmas=0.2, optimizer="sgd", lr=1e30,
                      **{**TINY, "depth": 1, "steps": 4, "eval_every": 2}, out=str(out))
    run = pe_fast.load_run(out)
    assert not all(bool(p.isfinite().all()) for p in run.model(0).parameters())
    with pytest.raises(ValueError, match="model_id 0: its weights hold NaN or Inf"):
        run.attention(0, run.task_inputs("test")[:2])
    # its table is in pe_tables.npz, all NaN: said so (held-out round, issue 55: "does not hold its table")
    with pytest.raises(NoPETable, match="model 0's PE table in .* holds NaN or inf: its training diverged"):
        run.pe_table(0)


def with_pack_0_weights_edited(run, tmp_path, edit):
    """A copy of the run whose pack 0 weights file is rewritten as safetensors writes it, after edit(tensors,
    metadata) changed them in place, and its digests.json rewritten to match (as whoever edits a folder can)."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    folder = tmp_path / "edited"
    shutil.copytree(run.path, folder)
    path = folder / "packs" / "0" / run_folder.WEIGHTS
    with safe_open(str(path), "pt") as file:
        metadata = file.metadata()
        tensors = {name: file.get_tensor(name) for name in file.keys()}
    edit(tensors, metadata)
    save_file(tensors, str(path), metadata=metadata)
    run_folder.write_digests(path.parent)
    return folder


@pytest.mark.parametrize("value, why", [
    (float("nan"), "weights that hold NaN or inf, where its train_loss in the results is"),
    (-float("inf"), "weights that hold NaN or inf, where its train_loss in the results is"),
    (3e38, "its torch.float32 arithmetic overflows on item 0, whose values lie within"),
])
def test_weights_edited_past_a_trained_model_s_are_blamed_not_the_inputs(value, why, tmp_path, lst_run, capsys):
    """Held-out rounds (issue 55): a weight set to NaN or -inf (the results show a finite loss: not a diverged
    model), digests.json rewritten to match, was opened by the report and --resume and blamed by run.attention on
    training that diverged; one set to 3e38 was blamed on the task's own inputs."""
    def edit(tensors, metadata):
        tensors["embed.weight"][0, 0, 0] = value
    folder = with_pack_0_weights_edited(lst_run, tmp_path, edit)
    if not np.isfinite(value):  # every reader refuses the folder, naming the file
        assert report.main([str(folder)]) == 2 and why in capsys.readouterr().err
        with pytest.raises(ReportError, match=f"{run_folder.WEIGHTS}: its models have for model .* {why}"):
            pe_fast.load_run(folder)
        return
    run = pe_fast.load_run(folder)
    model_id = run.config["packs"][0][0]
    with pytest.raises(ReportError, match=why):
        run.attention(model_id, run.task_inputs("test")[:2])


def test_a_model_id_from_the_runs_own_table_opens_it(lst_run):
    """run.results' model_id column holds numpy integers: each opens its model, as a Python int does."""
    model_id = lst_run.results.query("pe == 'learned'")["model_id"].iloc[0]
    assert not isinstance(model_id, int)
    x = lst_run.task_inputs("test")[:4]
    np.testing.assert_array_equal(lst_run.model(model_id)(x).detach(), lst_run.model(int(model_id))(x).detach())
    assert lst_run.pack(np.int64(0)).model_ids == lst_run.config["packs"][0]


def spoiled(tmp_path, lst_run, spoil) -> Path:
    """A copy of the run with pack 0's weights spoiled: load_run refuses it where the header gives it away (as the
    report does), run.model where only the tensors do."""
    folder = tmp_path / "spoiled"
    shutil.copytree(lst_run.path, folder)
    spoil(folder / "packs" / "0" / run_folder.WEIGHTS)
    return folder


def rewrite_header(path, change):
    """The safetensors file with its JSON header changed (8-byte length, then the header, then the data)."""
    data = path.read_bytes()
    length = struct.unpack("<Q", data[:8])[0]
    header = change(json.loads(data[8:8 + length]))
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length:])


def bigger_model(header):
    meta = json.loads(header["__metadata__"]["pe_fast"])
    meta["model_config"]["width"] = 2**20  # would be terabytes if it were built
    header["__metadata__"]["pe_fast"] = json.dumps(meta)
    return header


def retyped(name, dtype):
    """A tensor's declared dtype changed to one of the same width: the same bytes, read as other numbers."""
    def change(header):
        header[name]["dtype"] = dtype
        return header
    return change


def nested_metadata(header):
    header["__metadata__"]["pe_fast"] = "[" * 100_000 + "]" * 100_000
    return header


def metadata_key_twice(header):
    """pe_fast's metadata naming its step twice: JSON readers keep the last, whatever the first said."""
    meta = header["__metadata__"]["pe_fast"]
    header["__metadata__"]["pe_fast"] = meta.replace('"step": ', '"step": 999999, "step": ', 1)
    return header


def header_key_twice(path):
    """The header's __metadata__ given twice, the first one empty."""
    data = path.read_bytes()
    length = struct.unpack("<Q", data[:8])[0]
    text = b'{"__metadata__": {}, ' + data[9:8 + length]
    text += b" " * ((8 - len(text) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length:])


SPOILS = {
    "a metadata key named twice": lambda path: rewrite_header(path, metadata_key_twice),
    "a header key named twice": header_key_twice,
    "truncated": lambda path: path.write_bytes(path.read_bytes()[:1000]),
    "a pickle": lambda path: torch.save({"model": torch.zeros(3)}, path),
    "empty": lambda path: path.write_bytes(b""),
    "no metadata": lambda path: rewrite_header(path, lambda h: {k: v for k, v in h.items() if k != "__metadata__"}),
    "a model too big": lambda path: rewrite_header(path, bigger_model),
    "a tensor missing": lambda path: rewrite_header(path, lambda h: {k: v for k, v in h.items()
                                                                       if k != "head.bias"}),
    "a folder": lambda path: (path.unlink(), path.mkdir()),
    # integers where the model keeps floats: load_state_dict converted them without a word
    "a tensor of another dtype": lambda path: rewrite_header(path, retyped("head.weight", "I32")),
    "metadata nested too deep": lambda path: rewrite_header(path, nested_metadata),  # was a RecursionError
}


@pytest.mark.parametrize("spoil", SPOILS)
def test_a_spoiled_weights_file_is_one_error_naming_it(spoil, tmp_path, lst_run):
    folder = spoiled(tmp_path, lst_run, SPOILS[spoil])
    model_id = lst_run.config["packs"][0][0]
    with pytest.raises(ReportError, match=run_folder.WEIGHTS):
        pe_fast.load_run(folder).model(model_id)


def test_models_swapped_inside_a_weights_file_are_found_out(tmp_path, lst_run):
    """Two models' tensors swapped along the model axis, digests.json rewritten to match (it is no signature): each
    opened as the other. Their PEs are not the ones pe_tables.npz holds for their ids."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    index, ids = next((i, pack) for i, pack in enumerate(lst_run.config["packs"]) if len(pack) >= 2
                      and lst_run.results.set_index("model_id").loc[pack[0], "pe"] == "learned")
    folder = tmp_path / "swapped"
    shutil.copytree(lst_run.path, folder)
    path = folder / "packs" / str(index) / run_folder.WEIGHTS
    with safe_open(str(path), "pt") as file:
        metadata = file.metadata()
        tensors = {name: file.get_tensor(name) for name in file.keys()}
    models = len(ids)
    swapped = {name: tensor[[1, 0, *range(2, models)]].contiguous()
               if tensor.ndim and tensor.shape[0] == models and name != weights.COORDINATES else tensor
               for name, tensor in tensors.items()}
    save_file(swapped, str(path), metadata=metadata)
    run_folder.write_digests(path.parent)
    with pytest.raises(ReportError, match=f"its models have for model {ids[0]} a PE other than the one "
                                          f"pe_tables.npz holds for it: not this run's pack"):
        pe_fast.load_run(folder)  # the header is as it was: the tensors give it away, as each reader loads them
    assert pe_fast.load_run(lst_run.path).model(ids[0]) is not None  # untouched, it opens


def set_meta(path: str, value):
    """A header edit: pe_fast's metadata at path (keys joined by dots) set to value."""
    def edit(header):
        meta = json.loads(header["__metadata__"]["pe_fast"])
        *keys, last = path.split(".")
        owner = meta
        for key in keys:
            owner = owner[key]
        owner[last] = value
        header["__metadata__"]["pe_fast"] = json.dumps(meta)
        return header
    return edit


# each once opened as given (digests.json rewritten to match): run.pack(i).step read 10**30, and a model of another
# σ, PE placement or PE dropout computed other outputs than the trained one
@pytest.mark.parametrize("path, value, why", [
    ("step", 10**30, f"its weights were taken at step {10**30}, where the results say its models trained 6 steps"),
    ("step", 3, "its weights were taken at step 3"),
    ("sigmas", None, "with PE .* σ .*, where config.json lists PE"),
    # a sinusoidal PE keeps no tables: added at the input only, its tensors are the same
    ("model_config.pe_at", "input", "its models add the PE at 'input', where config.json's settings say 'every'"),
    ("model_config.pe_dropout", 0.5, "its models train with PE dropout 0.5"),
    # held-out round (issue 55): a model reading out another token, or built for another backend, opened silently
    ("model_config.readout_token", 3, "its models predict at token 3, where task lst's predict at token 15"),
    ("model_config.backend", "triton", "its models were built for backend 'triton', where config.json's settings"),
    ("evil", "x", "its metadata holds the key 'evil', which pe_fast does not write"),
])
def test_weights_whose_header_disagrees_with_the_run_are_found_out(path, value, why, tmp_path, lst_run):
    pe = "sin1d" if path == "model_config.pe_at" else "learned"
    index = next(i for i, pack in enumerate(lst_run.config["packs"])
                 if lst_run.results.set_index("model_id").loc[pack[0], "pe"] == pe)
    if path == "sigmas":  # one σ per model, every one other than the run's
        value = [7.5] * len(lst_run.config["packs"][index])
    folder = tmp_path / "edited"
    shutil.copytree(lst_run.path, folder)
    rewrite_header(folder / "packs" / str(index) / run_folder.WEIGHTS, set_meta(path, value))
    run_folder.write_digests(folder / "packs" / str(index))
    with pytest.raises(ReportError, match=why):
        pe_fast.load_run(folder)


@pytest.mark.parametrize("dims, why", [
    ((6, 4), "its models take 6 values a token and predict 4, where task lst's take 5 and predict 4"),
    ((5, 7), "its models take 5 values a token and predict 7")])
def test_weights_of_another_tasks_tokens_are_found_out(dims, why, tmp_path, lst_run):
    """Held-out round (issue 55): the header's token_dim or out_dim edited and the embedding or head widened to
    match, digests rewritten: a file consistent in itself, opened as this run's models, whose inputs the task's
    items then did not fit."""
    def edit(tensors, metadata):
        (M, token_dim, D), out_dim = tensors["embed.weight"].shape, tensors["head.bias"].shape[1]
        tensors["embed.weight"] = torch.zeros(M, dims[0], D)
        tensors["head.weight"], tensors["head.bias"] = torch.zeros(M, D, dims[1]), torch.zeros(M, dims[1])
        meta = json.loads(metadata["pe_fast"])
        assert (meta["model_config"]["token_dim"], meta["model_config"]["out_dim"]) == (token_dim, out_dim) == (5, 4)
        meta["model_config"].update(token_dim=dims[0], out_dim=dims[1])
        metadata["pe_fast"] = json.dumps(meta)
    folder = with_pack_0_weights_edited(lst_run, tmp_path, edit)
    with pytest.raises(ReportError, match=why):
        pe_fast.load_run(folder)


def test_a_pe_table_added_for_a_model_without_one_is_found_out(tmp_path, lst_run):
    """Held-out round (issue 55): a table under the id of a model whose PE adds none, added to the folder's
    pe_tables.npz with its digests rewritten, was drawn by the report and returned by run.pe_table(i)."""
    model_id = int(lst_run.results.query("pe == 'none'")["model_id"].iloc[0])
    folder = tmp_path / "added"
    shutil.copytree(lst_run.path, folder)
    path = folder / run_folder.PE_TABLES
    with np.load(path) as stored:
        tables = {key: stored[key] for key in stored.files}
    tables[run_folder.pe_table_key(model_id)] = next(t for k, t in tables.items() if k.startswith("model_"))
    np.savez_compressed(path, **tables)
    run_folder.write_digests(folder)
    with pytest.raises(ReportError, match=f"entry model_{model_id} is a PE table of model {model_id}, whose PE "
                                          "'none' adds none"):
        pe_fast.load_run(folder)


@pytest.mark.parametrize("edit, why", [
    # a sweep's folder said to pool others: run.model(0) then said the run had no model 0
    (lambda config: config.update(pooled_from=["/etc"]), "names the sweeps it pools .*, and the folder holds packs of "
                                                         "its own"),
    # a setting removed from config.json: the pack's untouched trained_with.json was blamed
    (lambda config: config["settings"].pop("lr"), "config.json says no --lr, not .* as .*trained_with.json records"),
], ids=["pooled_from added", "a setting removed"])
def test_config_json_edited_is_named_not_the_files_beside_it(edit, why, tmp_path, lst_run, capsys):
    """Held-out round (issue 55)."""
    folder = tmp_path / "edited"
    shutil.copytree(lst_run.path, folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ReportError, match=why):
        pe_fast.load_run(folder)
    assert report.main([str(folder)]) == 2 and capsys.readouterr().err.count("\n") == 1


def test_pe_tables_swapped_between_models_are_found_out(tmp_path, lst_run):
    """Two models' tables swapped in pe_tables.npz (the pack's and the folder's), digests rewritten to match:
    run.pe_table(i) returned the other model's table without a word, and --resume took the pack as finished."""
    index, ids = next((i, pack) for i, pack in enumerate(lst_run.config["packs"]) if len(pack) >= 2
                      and lst_run.results.set_index("model_id").loc[pack[0], "pe"] == "learned")
    folder = tmp_path / "swapped"
    shutil.copytree(lst_run.path, folder)
    for path in (folder / "packs" / str(index) / run_folder.PE_TABLES, folder / run_folder.PE_TABLES):
        with np.load(path) as stored:
            tables = {key: stored[key] for key in stored.files}
        first, second = (run_folder.pe_table_key(i) for i in ids[:2])
        tables[first], tables[second] = tables[second], tables[first]
        np.savez(path, **tables)
        run_folder.write_digests(path.parent)
    with pytest.raises(ReportError, match=f"for model {ids[0]} a PE other than the one pe_tables.npz holds"):
        pe_fast.load_run(folder)
    for name in (run_folder.RESULTS, run_folder.CURVES, run_folder.PE_TABLES, "summary.txt", run_folder.DIGESTS):
        (folder / name).unlink()
    with pytest.raises(UsageError, match=f"for model {ids[0]} a PE other than the one pe_tables.npz holds"):
        pe_fast.sweep.run(resume=True, out=str(folder))


def test_weights_follow_the_umask(lst_run):
    mode = os.stat(lst_run.path / "packs" / "0" / run_folder.WEIGHTS).st_mode & 0o777
    assert mode == os.stat(lst_run.path / "packs" / "0" / run_folder.RESULTS).st_mode & 0o777


def test_without_pe_is_the_model_with_its_pe_set_to_nothing(lst_run):
    """without_pe against each PE family's own zero: the added tables zeroed, the relative bias zeroed, RoPE's
    rotation by angle 0."""
    x = lst_run.task_inputs("test")[:16]
    for kind in ("learned", "sin2d", "relative", "rope2d"):
        model = lst_run.model(int(lst_run.results.query(f"pe == '{kind}'")["model_id"].iloc[0]))
        ablated = model.without_pe(x).detach()
        with torch.no_grad():
            for table in [*model.pos_embed.parameters(), *model.pos_embed.buffers()] if model.pe_blocks else []:
                table.zero_()
            for table in model.relative_bias or []:
                table.zero_()
            if model.rope_cos is not None:
                model.rope_cos.fill_(1.0)
                model.rope_sin.zero_()
            np.testing.assert_allclose(model(x), ablated, atol=1e-6)


def test_read_only_coordinates_are_saved_without_a_warning(tmp_path, recwarn):
    """The tasks hand out read-only coordinate arrays; torch warns on the user's screen about a tensor that shares
    one (seen in the main job's output), so the file gets a copy, and the same values come back."""
    from pe_fast.models import ModelConfig, StackedTransformer
    from pe_fast.results.weights import load_pack_weights, save_pack_weights
    coordinates = np.random.default_rng(0).normal(size=(5, 3))
    coordinates.flags.writeable = False
    config = ModelConfig(num_tokens=5, token_dim=2, out_dim=1, width=8, depth=1, mlp_width=8, pe="sinnd")
    model = StackedTransformer(config, seeds=[1, 2], sigmas=[None, None], coordinates=coordinates)
    save_pack_weights(tmp_path / "w.safetensors", model, [0, 1], step=3, coordinates=coordinates)
    assert not [w for w in recwarn if "not writable" in str(w.message)]
    loaded = load_pack_weights(tmp_path / "w.safetensors")
    x = torch.randn(2, 4, 5, 2)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(x)[0], model(x)[0])


def test_a_model_takes_its_tokens_in_any_real_form_and_refuses_the_rest_naming_them(lst_run):
    """The single model's forward, run.attention and the hooks take the tokens as a tensor of another dtype, a
    numpy array (big-endian too), a nested list or integers, each equal to the float32 tensor's result; complex
    values, a mask, text, a meta tensor and a malformed hook are a TypeError or ValueError naming the argument."""
    model = lst_run.model(0)
    x = lst_run.task_inputs("test")[:5]
    expected = model(x).detach()
    assert torch.equal(x, x.round())  # the LST's one-hot tokens: as integers, the same numbers
    for same in (x.double(), x.numpy(), x.numpy().astype(">f4"), x.tolist(), x.long(), x.to(torch.int32)):
        torch.testing.assert_close(model(same).detach(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lst_run.attention(0, x.numpy().astype(">f8")), lst_run.attention(0, x))
    refused = [(x.to(torch.complex64), TypeError, "tokens: torch.complex64 values are complex"),
               ("x", TypeError, "tokens: not a tensor or array of numbers"),
               (x.to("meta"), ValueError, "tokens on the meta device"),
               (x > 0, TypeError, "tokens: torch.bool values are a mask")]
    for tokens, error, message in refused:
        with pytest.raises(error, match=message):
            model(tokens)
    with pytest.raises(ValueError, match="inputs on the meta device"):
        lst_run.attention(0, x.to("meta"))
    with pytest.raises(TypeError, match="fwd_hooks: each item must be"):
        model.run_with_hooks(x, ["blocks.0.attn.hook_pattern"])


# ---- a configuration that asks for more than its file holds (hostile cases W01-W03): the metadata is checked
# against the tensors before any model is built, so the refusal costs no memory of the size the metadata names

def peak_growth_mib(action) -> float:
    """How far this process's peak resident memory rose above its resident memory at the start while `action` ran,
    in MiB (Linux: the peak is reset first through /proc/self/clear_refs; elsewhere getrusage's lifetime peak). The
    free memory malloc keeps (a sweep in this process turns glibc's trimming off: pe_fast.memory) is given back
    first, or an allocation would reuse it unseen."""
    import ctypes
    import ctypes.util
    import resource

    try:
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    except (OSError, AttributeError, TypeError):  # not glibc
        pass

    def status(key):
        with open("/proc/self/status") as file:
            return next(int(line.split()[1]) for line in file if line.startswith(key + ":")) / 1024
    try:
        with open("/proc/self/clear_refs", "w") as file:
            file.write("5")  # the peak (VmHWM) from now on
        start, peak = status("VmRSS"), lambda: status("VmHWM")
    except OSError:
        start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # noqa: E731
    action()
    return peak() - start


def pe_tensors_dropped(pe, num_tokens):
    """The weights file's configuration changed to PE `pe` over `num_tokens` tokens, with no PE tensor and no
    coordinates left (the data repacked, so the file is a well-formed safetensors file): the sizes are the
    metadata's alone."""
    def spoil(path):
        data = path.read_bytes()
        length = struct.unpack("<Q", data[:8])[0]
        header, body = json.loads(data[8:8 + length]), data[8 + length:]
        meta = json.loads(header["__metadata__"]["pe_fast"])
        meta["model_config"].update(pe=pe, num_tokens=num_tokens, readout_token=0)
        if pe not in ("learned", "random"):
            meta["sigmas"] = [None] * len(meta["model_ids"])
        kept, out = {"__metadata__": dict(header["__metadata__"], pe_fast=json.dumps(meta))}, b""
        for name, entry in sorted(((n, e) for n, e in header.items() if n != "__metadata__"),
                                  key=lambda item: item[1]["data_offsets"][0]):
            if name.split(".")[0] in ("absolute", "rotary", "relative", "task"):
                continue
            start, end = entry["data_offsets"]
            kept[name] = dict(entry, data_offsets=[len(out), len(out) + end - start])
            out += body[start:end]
        text = json.dumps(kept).encode()
        text += b" " * ((8 - len(text) % 8) % 8)
        path.write_bytes(struct.pack("<Q", len(text)) + text + out)
    return spoil


@pytest.mark.parametrize("pe, num_tokens, missing", [
    ("learned", 1_000_000, "absolute.tables.0"),  # W01: was the tables built from num_tokens (GBs at 3e7)
    ("relative", 4_000, "relative.index"),        # W02: was numpy's [N, N] offsets, a MemoryError at N = 40000
    ("rope", 8_000_000, "rotary.cos"),            # W03: was the [N, head_dim/2] angles, a MemoryError at 5e7
])
def test_a_configuration_larger_than_its_tensors_is_refused_before_any_model_is_built(
        pe, num_tokens, missing, tmp_path, lst_run):
    folder = spoiled(tmp_path, lst_run, pe_tensors_dropped(pe, num_tokens))
    model_id = lst_run.config["packs"][0][0]
    errors = []

    def open_model():
        try:
            pe_fast.load_run(folder).model(model_id)
        except Exception as error:  # noqa: BLE001 (which one is asserted below, after the memory)
            errors.append(error)
    assert peak_growth_mib(open_model) < 64  # each took hundreds of MiB (GBs at the tester's sizes) to be refused
    assert len(errors) == 1 and isinstance(errors[0], ReportError), errors
    assert run_folder.WEIGHTS in str(errors[0]) and missing in str(errors[0])
    assert len(str(errors[0]).splitlines()) == 1


def test_a_hook_may_edit_its_value_in_place_at_every_point(lst_run):
    """An edit in place (TransformerLens's `value[...] = 0`, returning None) does what returning the edited value
    does, at every hook point and with gradients on: each hook gets a tensor of its own, not a view of q, k, v or
    of a parameter, nor a value the backward needs."""
    x = lst_run.task_inputs("test")[:8]

    def zero_in_place(value, hook):
        value.zero_()

    for model_id, model in lst_run.models():  # every PE kind: each adds its PE its own way
        for name in model.hook_points():
            edited = model.run_with_hooks(x, [(name, zero_in_place)])
            edited.sum().backward()  # the autograd graph took the edit
            returned = model.run_with_hooks(x, [(name, lambda v, hook: torch.zeros_like(v))])
            np.testing.assert_array_equal(edited.detach(), returned.detach(), err_msg=f"{model.config.pe} {name}")
