"""--tensorboard (pe_fast.sweep.live_curves): the event files, read back with TensorBoard's own reader, hold what
curves.parquet holds, model by model and step by step; a resumed pack shows no step twice; without TensorBoard
the flag is one error line."""
import importlib.util

import pandas as pd
import pytest

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from pe_fast.sweep.cli import main as sweep_main  # noqa: E402
from pe_fast.sweep.live_curves import FOLDER, LiveCurves, run_name, tag  # noqa: E402
from sweep_harness import run_sweep  # noqa: E402

TINY = ["--task", "lst", "--steps", "4", "--eval-every", "2", "--width", "16", "--depth", "1", "--batch-size", "16",
        "--seeds", "2", "--pe", "learned,sin2d", "--sigmas", "0.1,2", "--lr", "1e-3,3e-3", "--no-report"]


def scalars(run_dir) -> dict[str, dict[int, float]]:
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {t: {e.step: e.value for e in events.Scalars(t)} for t in events.Tags()["scalars"]}


def test_event_files_hold_the_curves(tmp_path):
    out = tmp_path / "run"
    proc = run_sweep(*TINY, "--tensorboard", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    curves = pd.read_parquet(out / "curves.parquet")
    models = curves.drop_duplicates("model_id")
    assert len(models) == 2 * 2 * 2 + 2 * 2  # learned: σ × lr × seed; sin2d: lr × seed
    assert models["pe"].value_counts()["sin2d"] == 4
    for _, model in models.iterrows():
        name = run_name({**model, "sigma": None if model["pe"] == "sin2d" else model["sigma"]}, ("lr",))
        assert ("sigma=" in name) == (model["pe"] == "learned") and "lr=" in name
        logged = scalars(out / FOLDER / name)
        rows = curves[curves["model_id"] == model["model_id"]]
        for column in ("train_loss", "ood_acc", "test_acc", "attn_l0_h0_entropy", "ood_attn_l0_h0_max_prob"):
            expected = {int(r.step): float(getattr(r, column)) for r in rows.itertuples() if pd.notna(getattr(r, column))}
            got = logged[tag(column)]
            assert got.keys() == expected.keys(), column
            assert list(got.values()) == pytest.approx(list(expected.values()), rel=1e-6), column
        assert logged["final/ood_acc"] == {4: pytest.approx(rows[rows.step == 4]["ood_acc"].item(), rel=1e-6)}


def test_a_resumed_pack_shows_no_step_twice(tmp_path):
    pack = [dict(pe="learned", sigma=0.5, seed=1, optimizer="adamw", lr=1e-3, weight_decay=0.0, momentum=None)]
    killed = LiveCurves(tmp_path, pack, (), resumed_at=0)
    for step, value in ((0, 1.0), (2, 2.0), (4, 3.0)):  # the killed process got to step 4, its checkpoint to 2
        killed.evaluation([{"model": 0, "step": step, "loss": value}])
    resumed = LiveCurves(tmp_path, pack, (), resumed_at=2)
    resumed.evaluation([{"model": 0, "step": 4, "loss": 30.0}])
    resumed.evaluation([{"model": 0, "step": 6, "loss": 40.0}])
    assert scalars(tmp_path / FOLDER / "learned/sigma=0.5/seed=1")["loss"] == {0: 1.0, 2: 2.0, 4: 30.0, 6: 40.0}


def test_without_tensorboard_the_flag_is_one_error_line(tmp_path, capsys, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else
                        find_spec(name, *a))
    code = sweep_main([*TINY, "--tensorboard", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "pe_fast[tensorboard]" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("in_the_way", ["tensorboard", "tensorboard/learned"])
def test_a_file_where_a_run_goes_is_refused_before_the_resume_starts(in_the_way, tmp_path, capsys):
    """A file at DIR/tensorboard (or deeper, where a model's run goes): the resumed sweep printed its start line,
    then ended with the disk-full line, exit 1."""
    import shutil
    out = tmp_path / "run"
    assert sweep_main([*TINY, "--out", str(out)]) == 0
    for name in ("results.parquet", "curves.parquet", "pe_tables.npz", "summary.txt", "digests.json"):
        (out / name).unlink()
    shutil.rmtree(out / "packs")  # an unfinished sweep: config.json alone
    (out / in_the_way).parent.mkdir(parents=True, exist_ok=True)
    (out / in_the_way).write_text("x")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    capsys.readouterr()
    assert sweep_main(["--resume", "--tensorboard", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {out / in_the_way} is not a folder; --tensorboard writes each model's curves under " \
                  f"{out / FOLDER}: move it away\n", err
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
