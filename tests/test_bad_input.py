"""Every kind of bad input to the sweep and the report, through the real command-line entry points: exit code 2,
exactly one line on stderr naming the flag or file, no traceback, no results folder created, and an existing
folder left byte for byte as it was. One case per line in CASES / RESUME_CASES: add yours there."""
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from pe_fast.report.cli import main as report_main
from pe_fast.sweep.cli import main as sweep_main
from sweep_harness import TINY_NETSIM

LST = ["--task", "lst", "--width", "16", "--depth", "1", "--steps", "4", "--eval-every", "2", "--seeds", "1",
       "--pe", "learned", "--sigmas", "0.5", "--no-report"]
NETSIM = [*TINY_NETSIM, "--seeds", "1", "--pe", "learned", "--sigmas", "0.5", "--steps", "4", "--eval-every", "2",
          "--no-report"]
FMRI = ["--task", "fmri", "--width", "16", "--depth", "1", "--steps", "4", "--eval-every", "2", "--seeds", "1",
        "--sigmas", "0.5", "--no-report"]


def without(flags: list[str], flag: str) -> list[str]:
    """The flags less one flag and its value."""
    at = flags.index(flag)
    return flags[:at] + flags[at + 2:]


# (case, the command's flags, what the one line must name). Tokens FILE, ONE_PUZZLE, NPY and REGIONS are
# replaced by files made for the case (inputs()).
CASES = [
    ("weight decay nan", LST + ["--weight-decay", "nan"], "--weight-decay"),
    ("negative momentum", LST + ["--optimizer", "sgd", "--momentum", "-1"], "--momentum"),
    ("momentum for adamw", LST + ["--momentum", "0.9"], "--momentum applies to --optimizer sgd"),
    ("momentum 1", LST + ["--optimizer", "sgd", "--momentum", "1"], "--momentum"),
    ("sigma overflowing float32", LST + ["--sigmas", "1e39"], "--sigmas"),
    ("sigma nan", LST + ["--sigmas", "nan"], "--sigmas"),
    ("sigma zero", LST + ["--sigmas", "0"], "--sigmas"),
    ("sigma not a number", LST + ["--sigmas", "abc"], "--sigmas"),
    ("batch larger than the training set", NETSIM + ["--batch-size", "20000"], "--batch-size 20000"),
    ("one training puzzle", LST + ["--lst-train", "ONE_PUZZLE"], "--batch-size"),
    ("a grid too large", LST + ["--seeds", "99999999999"], "--seeds"),
    ("seeds counted and named", LST + ["--seed-values", "6068"], "--seed-values"),
    ("seed value negative", without(LST, "--seeds") + ["--seed-values", "-1"], "--seed-values"),
    ("seed value not an integer", without(LST, "--seeds") + ["--seed-values", "6068,1.5"], "--seed-values"),
    ("seed value named twice", without(LST, "--seeds") + ["--seed-values", "3,3"], "--seed-values"),
    ("mlp width zero", LST + ["--mlp-width", "0"], "--mlp-width"),
    ("mlp width negative", LST + ["--mlp-width", "-4"], "--mlp-width"),
    ("netsim runs zero", NETSIM + ["--runs", "0"], "--runs"),
    ("netsim one node", NETSIM + ["--nodes", "1"], "--nodes"),
    ("netsim p_within above 1", NETSIM + ["--p-within", "1.5"], "--p-within"),
    ("netsim noise inf", NETSIM + ["--noise", "inf"], "--noise"),
    ("out is a file", LST + ["--out", "FILE"], "is a file"),
    ("out under a file", LST + ["--out", "FILE/run"], "is a file"),
    ("out not writable", LST + ["--out", "/proc/pe_fast_run"], "cannot write"),
    ("sinnd without centroids", FMRI + ["--data", "NPY", "--pe", "sinnd"], "--pe sinnd"),
    ("ray address that does not answer", LST + ["--executor", "ray", "--ray-address", "127.0.0.1:1"],
     "--ray-address"),
    ("ray address malformed", LST + ["--executor", "ray", "--ray-address", "nowhere"], "--ray-address"),
    ("ray address without ray", LST + ["--ray-address", "auto"], "--ray-address"),
    ("slurm flag without slurm", LST + ["--slurm-partition", "gpu"], "--slurm-partition"),
    ("slurm without sbatch", LST + ["--executor", "slurm"], "--slurm-local"),
    ("slurm option malformed", LST + ["--executor", "slurm", "--slurm-local", "--slurm-option", "qos"],
     "--slurm-option"),
    ("slurm time zero", LST + ["--executor", "slurm", "--slurm-local", "--slurm-time", "0"], "--slurm-time"),
    ("slurm gpus negative", LST + ["--executor", "slurm", "--slurm-local", "--slurm-gpus", "-1"], "--slurm-gpus"),
    ("steps zero", LST + ["--steps", "0"], "--steps"),
    ("steps negative", LST + ["--steps", "-5"], "--steps"),
    ("lr zero", LST + ["--lr", "0"], "--lr"),
    ("lr list with a zero", LST + ["--lr", "1e-3,0"], "--lr"),
    ("lr list with a word", LST + ["--lr", "1e-3,fast"], "--lr"),
    ("lr list naming a value twice", LST + ["--lr", "1e-3,3e-3,1e-3"], "--lr"),
    ("sigma list naming a value twice", LST + ["--sigmas", "0.5,0.5"], "--sigmas"),
    ("weight decay list with a negative", LST + ["--weight-decay", "0,-0.1"], "--weight-decay"),
    ("unknown optimizer in a list", LST + ["--optimizer", "adamw,lion"], "--optimizer"),
    ("momentum list without sgd", LST + ["--optimizer", "adam,adamw", "--momentum", "0,0.9"],
     "--momentum applies to --optimizer sgd"),
    ("lr nan", LST + ["--lr", "nan"], "--lr"),
    ("lr inf", LST + ["--lr", "inf"], "--lr"),
    ("warmup negative", LST + ["--warmup", "-1"], "--warmup"),
    ("eval every zero", LST + ["--eval-every", "0"], "--eval-every"),
    ("threads zero", LST + ["--threads", "0"], "--threads"),
    ("depth zero", LST + ["--depth", "0"], "--depth"),
    ("checkpoint every zero", LST + ["--checkpoint-every", "0"], "--checkpoint-every"),
    ("heads not dividing width", LST + ["--heads", "3"], "--heads"),
    ("unknown PE", LST + ["--pe", "bogus"], "bogus"),
    ("sin2d on brain regions", NETSIM + ["--pe", "sin2d"], "sin2d"),
    ("unknown flag", LST + ["--no-such-flag"], "no-such-flag"),
    ("unknown task", ["--task", "bogus"], "--task"),
    ("preset of another task", ["--task", "fmri", "--preset", "paper"], "--preset paper"),
    ("mask fraction above 1", NETSIM + ["--mask-fraction", "1.5"], "--mask-fraction"),
    ("mask fraction zero", NETSIM + ["--mask-fraction", "0"], "--mask-fraction"),
    ("window zero", NETSIM + ["--window", "0"], "--window"),
    ("mask fraction for the LST", LST + ["--mask-fraction", "0.3"], "--mask-fraction"),
    ("netsim flag for the LST", LST + ["--nodes", "5"], "--nodes"),
    ("atlas for netsim", NETSIM + ["--atlas", "glasser360"], "--atlas"),
    ("regions without data", FMRI + ["--regions", "REGIONS"], "--regions"),
    ("missing puzzle file", LST + ["--lst-train", "/nonexistent/puzzles.csv"], "does not exist"),
    ("tf32 on the CPU", LST + ["--precision", "tf32"], "tf32"),
    ("unknown backend", LST + ["--backend", "nosuch"], "--backend"),
    ("cuda where there is none", LST + ["--device", "cuda"], "--device"),
]


def inputs(tmp_path: Path) -> dict[str, str]:
    file = tmp_path / "a_file.txt"
    file.write_text("not a folder")
    one = tmp_path / "one.csv"
    one.write_text("ID,LST_num,condition,puzzles,solutions\n0,,Binary,2000500234001000,4\n")
    npy = tmp_path / "series.npy"  # subjects × time × regions, no regions table: no centroids
    np.save(npy, np.random.default_rng(0).standard_normal((2, 60, 10)).astype(np.float32))
    regions = tmp_path / "regions.csv"
    regions.write_text("label,x,y,z,network\n" + "".join(f"r{i},0,0,{i},a\n" for i in range(10)))
    return {"FILE": str(file), "ONE_PUZZLE": str(one), "NPY": str(npy), "REGIONS": str(regions)}


def fill(args: list[str], files: dict[str, str]) -> list[str]:
    return [files.get(a, a) if "/" not in a else a.replace("FILE", files["FILE"]) for a in args]


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_one_line(capsys, code: int, must_name: str):
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert "Traceback" not in err, err
    assert len(lines) == 1 and must_name in lines[0], err


@pytest.mark.parametrize("args, must_name", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_flags(args, must_name, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a default --out would land here
    files = inputs(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    args = fill(args, files)
    if "--out" not in args:
        args += ["--out", str(tmp_path / "run")]
    threads = torch.get_num_threads()
    try:
        code = sweep_main(args)
    finally:
        torch.set_num_threads(threads)
    assert_one_line(capsys, code, must_name)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no results folder, nothing else either


@pytest.fixture(scope="module")
def unfinished(tmp_path_factory):
    """A sweep folder whose pack 0 is not finished yet: config.json and nothing else."""
    out = tmp_path_factory.mktemp("sweep") / "run"
    threads = torch.get_num_threads()
    try:
        assert sweep_main(NETSIM + ["--threads", "1", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    for name in ("results.parquet", "curves.parquet", "pe_tables.npz", "summary.txt", "ground_truth.npz"):
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "packs")
    (out / "packs").mkdir()
    return out


class Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def evil_checkpoint(folder: Path):
    torch.save({"step": 1, "payload": Evil()}, folder / "packs" / "0.checkpoint.pt")


def garbage_checkpoint(folder: Path):
    (folder / "packs" / "0.checkpoint.pt").write_bytes(b"\x80\x04garbage")


def config_without(key: str):
    def change(folder: Path):
        config = json.loads((folder / "config.json").read_text())
        del config["settings"][key]
        (folder / "config.json").write_text(json.dumps(config))
    return change


def config_text(text: str):
    return lambda folder: (folder / "config.json").write_text(text)


# (case, how the folder is spoiled, flags after --resume --out DIR, what the one line must name)
RESUME_CASES = [
    ("crafted checkpoint runs nothing", evil_checkpoint, [], "0.checkpoint.pt cannot be loaded safely"),
    ("garbage checkpoint", garbage_checkpoint, [], "delete it"),
    ("config missing a key", config_without("pe"), [], "config.json"),
    ("config not JSON", config_text("{not json"), [], "config.json"),
    ("config not an object", config_text("[1, 2]"), [], "config.json"),
    ("config with a bad number", config_without("steps"), [], "config.json"),
    ("changed setting", None, ["--steps", "50"], "--steps 50 differs"),
    ("changed PE", None, ["--pe", "none"], "--pe none differs"),
    ("ray address that does not answer", None, ["--executor", "ray", "--ray-address", "127.0.0.1:1"],
     "--ray-address"),
]


@pytest.mark.parametrize("spoil, flags, must_name", [c[1:] for c in RESUME_CASES], ids=[c[0] for c in RESUME_CASES])
def test_bad_resume(spoil, flags, must_name, unfinished, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    if spoil is not None:
        spoil(folder)
    before = snapshot(folder)
    assert_one_line(capsys, sweep_main(["--resume", "--out", str(folder), *flags]), must_name)
    assert snapshot(folder) == before
    assert not (tmp_path / "PWNED").exists()


def test_resume_without_out_and_of_no_sweep(tmp_path, capsys):
    assert_one_line(capsys, sweep_main(["--resume"]), "--out")
    assert_one_line(capsys, sweep_main(["--resume", "--out", str(tmp_path)]), "config.json does not exist")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text", ["[1, 2]", "\"settings\"", "{\"settings\": 3}", "{broken"])
def test_report_of_a_malformed_config(text, tmp_path, capsys):
    (tmp_path / "config.json").write_text(text)
    before = snapshot(tmp_path)
    assert_one_line(capsys, report_main([str(tmp_path)]), "config.json")
    assert snapshot(tmp_path) == before
