"""The Python API (pe_fast.sweep.run, pe_fast.load_run) and the pe-fast command: the same validation and the same
results folder as the command line, which is the reference here."""
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from sweep_harness import TINY_NETSIM, run_sweep

import pe_fast
import pe_fast.sweep
from pe_fast import cli
from pe_fast.sweep import api
from pe_fast.sweep.settings import UsageError

ROOT = Path(__file__).resolve().parents[1]
# TINY_NETSIM's flags as keyword arguments
TINY = dict(task="netsim", nodes=12, modules=3, timepoints=200, runs=4, width=16, depth=1, batch_size=16)


@pytest.fixture
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_run_from_python_equals_the_command_line(tmp_path, keep_threads):
    flags = ["--pe", "learned,none", "--sigmas", "0.1,2", "--seeds", "2", "--steps", "6", "--eval-every", "3"]
    typed = run_sweep(*TINY_NETSIM, *flags, "--no-report", "--out", str(tmp_path / "cli"))  # the command as typed
    assert typed.returncode == 0, typed.stderr
    reference = pd.read_parquet(tmp_path / "cli" / "results.parquet")
    run = pe_fast.sweep.run(**TINY, pe=["learned", "none"], sigmas=[0.1, 2], seeds=2, steps=6, eval_every=3,
                            no_report=True, out=str(tmp_path / "api"))
    assert run.path == tmp_path / "api"
    columns = [c for c in reference.columns if c != "train_seconds"]
    pd.testing.assert_frame_equal(run.results[columns], reference[columns])
    again = pe_fast.load_run(tmp_path / "api")
    assert again.settings["sigmas"] == [0.1, 2.0] and again.settings["seeds"] == 2
    assert len(again.curves) == (2 * 2 + 2) * 3  # 4 learned models and 2 without a PE, evaluated at 0, 3 and 6
    learned = again.results.query("pe == 'learned'")["model_id"]
    assert all(again.pe_table(i).shape[-2:] == (12, 16) for i in learned)
    without = int(again.results.query("pe == 'none'")["model_id"].iloc[0])
    for kind in (KeyError, ValueError):  # a lookup that finds nothing, and a caller's bad argument
        with pytest.raises(kind, match=f"^model {without} has no PE table in .*: its PE is 'none', which has none$"):
            again.pe_table(without)
    del again.pe_tables[f"model_{int(learned.iloc[0])}"]  # as a folder kept without it
    with pytest.raises(ValueError, match="its PE is 'learned', and pe_tables.npz does not hold its table"):
        again.pe_table(int(learned.iloc[0]))
    with pytest.raises(ValueError, match="model_id 999: not a model of"):  # not "has no PE table"
        again.pe_table(999)


@pytest.mark.parametrize("arguments, names", [
    (dict(bogus=1), "bogus"),
    (dict(steps=1.5), "--steps"),
    (dict(sigmas=[0.1, float("nan")]), "--sigmas"),
    (dict(task="bogus"), "--task"),
    (dict(no_report="yes"), "--no-report"),
    (dict(pe=["learned", "sin2d"]), "--pe"),
    (dict(slurm_option=["qos=short\ntouch PWNED"], executor="slurm", slurm_local=True), "--slurm-option"),
    (dict(slurm_option=123, executor="slurm", slurm_local=True), "--slurm-option"),
    (dict(task=["lst"]), "--task"),
    (dict(preset=["cpu"]), "--preset"),
    (dict(width=10**9), "--width"),
    (dict(nodes=10**9), "--nodes"),
    (dict(timepoints=10**12), "--timepoints"),
    # beyond float's range: math.isfinite raised OverflowError, not a ValueError
    (dict(max_pack=-10**400), "--max-pack must be finite"),
    (dict(width=10**400), "--width"),
    (dict(lr=1e39), "--lr 1e+39 lies beyond float32's range"),  # the results store it as float32
    (dict(warmup=10, steps=2), "--warmup 10 is not below --steps 2"),
    (dict(sigmas="0.5,\uff12"), "--sigmas"),  # a full-width 2: int() and float() read any Unicode digit
    (dict(steps=False), "--steps: expected int, got False"),  # False is "off" for an on/off flag only
    (dict(task=False), "--task"),
    # one value per item: an empty item was dropped, an item with a comma split in two
    (dict(pe=["learned", ""]), "--pe: ['learned', ''] holds an empty item"),
    (dict(pe=["learned,none"]), "--pe: the item 'learned,none' holds a comma"),
    (dict(pe="learned,,none"), "--pe: 'learned,,none' holds an empty item"),
])
def test_bad_arguments_raise_naming_them_and_write_nothing(arguments, names, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=re.escape(names)):
        pe_fast.sweep.run(**{**TINY, **arguments, "out": str(tmp_path / "run")})
    assert list(tmp_path.iterdir()) == []


def test_a_bad_argument_is_a_value_error(tmp_path, monkeypatch):
    """A caller's `except ValueError` catches a bad argument, as from any Python function given a bad value."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="--steps"):
        pe_fast.sweep.run(**TINY, steps=0, out=str(tmp_path / "run"))
    assert list(tmp_path.iterdir()) == []


def test_an_ambiguous_puzzle_file_is_a_value_error(tmp_path, monkeypatch):
    """Row 1 shows 1 and 2 and nothing else constrains the query: 3 and 4 both complete the puzzle."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ambiguous.csv").write_text("ID,LST_num,condition,puzzles,solutions\n0,,Binary,1250000000000000,3\n")
    with pytest.raises(ValueError, match=r"--lst-ood .*ambiguous.csv:2: puzzle 1 of the file, .* may hold 3 or 4"):
        pe_fast.sweep.run(task="lst", preset="cpu", steps=2, lst_ood="ambiguous.csv", out=str(tmp_path / "run"))
    assert [p.name for p in tmp_path.iterdir()] == ["ambiguous.csv"]


@pytest.mark.parametrize("out", ["", " "])
def test_an_empty_out_writes_nothing(out, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="--out"):
        pe_fast.sweep.run(**TINY, steps=2, eval_every=1, out=out)
    assert list(tmp_path.iterdir()) == []


def test_numpy_scalars_arrays_ranges_and_lists_of_paths_are_the_values_they_hold():
    """What a Python caller holds a number or a list in: numpy's integers, floats and bools, a 1-d array, a range,
    a list of data paths (comma-separated on the command line) give the settings the plain values give."""
    from pe_fast.sweep import api, settings
    example = Path(__file__).resolve().parents[1] / "docs" / "example-fmri"
    data, regions = str(example / "series.npy"), str(example / "regions.csv")
    given = dict(task="fmri", steps=np.int64(4), sigmas=np.array([0.1, 2.0]), seed_values=range(3),
                 mask_fraction=np.float32(0.25), no_report=np.bool_(True), data=[Path(data)], regions=regions)
    plain = dict(task="fmri", steps=4, sigmas=[0.1, 2.0], seed_values=[0, 1, 2], mask_fraction=0.25, no_report=True,
                 data=data, regions=regions)
    assert settings.from_flags(api.arguments(given)) == settings.from_flags(api.arguments(plain))


def test_subclasses_are_the_values_they_hold_and_their_methods_are_not_called(tmp_path, monkeypatch):
    """steps=LyingInt(4), whose __index__ gave 999, recorded and trained 999 steps; a float whose __str__ said
    '0.3' trained σ = 0.3; a str whose __str__ raised, or a path whose __fspath__ did, gave a traceback (round 17).
    A subclass of int, float or str is the value it holds; a path that cannot be read is named."""
    from pe_fast.sweep import settings

    class LyingInt(int):
        def __index__(self):
            return 999

    class LyingFloat(float):
        def __str__(self):
            return "0.3"

        __repr__ = __str__

    class RaisingStr(str):
        def __str__(self):
            raise RuntimeError("no")

        __repr__ = __str__

    class RaisingPath:
        def __fspath__(self):
            raise RuntimeError("no")

    lying = dict(task=RaisingStr("netsim"), steps=LyingInt(4), eval_every=LyingInt(2), sigmas=[LyingFloat(0.1)],
                 pe=[RaisingStr("learned")])
    honest = dict(task="netsim", steps=4, eval_every=2, sigmas=[0.1], pe=["learned"])
    assert settings.from_flags(api.arguments(lying)) == settings.from_flags(api.arguments(honest))
    # round 18: a range of 10**12 was walked whole, a broadcast array of 10**9 made 32 GB, a list subclass's endless
    # __iter__ grew to the memory's end: the items a list holds, at most a sweep's models
    class Endless(list):
        def __iter__(self):
            while True:
                yield 0.1

    assert api.arguments(dict(sigmas=Endless([0.1, 0.2]))).sigmas == [0.1, 0.2]
    for huge in (range(10**12), np.broadcast_to(np.float64(0.1), (10**9,))):
        with pytest.raises(UsageError, match="--sigmas: 1,000,000,000(,000)? items, more than a sweep's 100,000"):
            api.arguments(dict(sigmas=huge))
    with pytest.raises(UsageError, match=r"unknown argument 'o\\nut'; the arguments"):  # one line
        api.arguments({"o\nut": 1})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="--out: its path could not be read \\(RuntimeError: 'no'\\)"):
        pe_fast.sweep.run(**TINY, out=RaisingPath())
    assert list(tmp_path.iterdir()) == []


def test_a_folder_name_s_control_characters_stay_escaped_in_load_run_s_message(tmp_path):
    """Held-out round (issue 55): the command line escaped them, the Python API's ReportError held a raw line
    break (a message of two lines) and a raw NUL."""
    from pe_fast.results.reading import ReportError
    for name in ("run\nINJECTED", "run\x00", "run\x1b[31m"):
        with pytest.raises(ReportError) as refused:
            pe_fast.load_run(str(tmp_path / name))
        message = str(refused.value)
        assert not any(c in message for c in "\n\x00\x1b") and repr(name)[1:-1] in message, message
    folder = tmp_path / "a\nb"
    folder.mkdir()
    with pytest.raises(ReportError, match=r"a\\nb is not a results folder"):
        pe_fast.load_run(folder)


def test_arguments_of_a_wrong_type_are_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match="load_run: directory: expected a path"):
        pe_fast.load_run(123)

    class NumberPath:  # an os.PathLike whose __fspath__ gives no text
        def __fspath__(self):
            return 7
    with pytest.raises(TypeError, match="load_run: directory: expected a path .* got .*NumberPath"):
        pe_fast.load_run(NumberPath())
    for name in ("out", "data"):
        with pytest.raises(UsageError, match=f"--{name}: expected a path"):
            pe_fast.sweep.run(**TINY, **{name: NumberPath()})
    with pytest.raises(UsageError, match="--data: expected a path"):
        pe_fast.sweep.run(task="fmri", data=[NumberPath()], out=str(tmp_path / "run"))
    with pytest.raises(UsageError, match="--out: expected str, got 123"):
        pe_fast.sweep.run(resume=True, out=123)
    with pytest.raises(UsageError, match="--out: expected str, got False"):  # not "no --out": a new folder here
        pe_fast.sweep.run(**TINY, out=False)
    assert list(tmp_path.iterdir()) == []


def test_resume_from_python(tmp_path, keep_threads):
    out = tmp_path / "run"
    first = pe_fast.sweep.run(**TINY, seeds=1, sigmas=[0.5], steps=4, eval_every=2, no_report=True, out=str(out))
    again = pe_fast.sweep.run(resume=True, out=str(out))  # finished: nothing to do, the same folder back
    pd.testing.assert_frame_equal(again.results, first.results)
    # a path as a pathlib.Path, as load_run takes it (it was refused: "--out: expected str, got PosixPath")
    assert pe_fast.sweep.run(resume=True, out=out).path == out


def test_docs_example_runs(tmp_path, monkeypatch, keep_threads):
    """docs/python-api.md's code blocks, in order, from a fresh folder; the sweep shrunk to a tiny network."""
    monkeypatch.chdir(tmp_path)
    real = api.run
    monkeypatch.setattr(api, "run", lambda **kw: real(**{**kw, **{k: v for k, v in TINY.items() if k != "task"},
                                                          "steps": 4, "eval_every": 2, "no_report": True}))
    text = (ROOT / "docs" / "python-api.md").read_text()
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        exec(compile(block, "docs/python-api.md", "exec"), {})
    assert not (tmp_path / "runs" / "never-written").exists()


def test_pe_fast_command(capsys):
    assert cli.main(["--version"]) == 0 and capsys.readouterr().out.strip() == f"pe-fast {pe_fast.__version__}"
    assert cli.main(["bogus"]) == 2 and "choose from sweep, report, compare-lst-logs" in capsys.readouterr().err
    assert cli.main([]) == 2 and capsys.readouterr().err == \
        "error: pe-fast: name a program: sweep, report, compare-lst-logs (see pe-fast --help)\n"
    assert cli.main(["sweep", "--task", "bogus"]) == 2
    assert cli.main(["report", "--version"]) == 0


def test_pe_fast_script_is_installed():
    script = Path(sys.executable).parent / "pe-fast"
    if not script.exists():
        pytest.skip("pe-fast is not installed beside this Python (pip install -e . puts it there)")
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == f"pe-fast {pe_fast.__version__}", done.stderr
