"""Every kind of bad input to the sweep and the report, through the real command-line entry points: exit code 2,
exactly one line on stderr naming the flag or file, no traceback, no results folder created, and an existing
folder left byte for byte as it was. One case per line in CASES / RESUME_CASES: add yours there."""
import concurrent.futures
import contextlib
import copy
import dataclasses
import errno
import hashlib
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import pe_fast
import pe_fast.sweep
from pe_fast.models.transformer import compute_path_problem, compute_paths
from pe_fast.report.cli import main as report_main
from pe_fast.results import run_folder
from pe_fast.results.settings import FLAGS, LIST_SETTINGS, Settings
from pe_fast.sweep import UsageError, executors
from pe_fast.sweep.cli import main as sweep_main
from pe_fast.tasks import KINDS
from pe_fast.tasks.lst_puzzles.generator import DEFAULT_SET_FILE
from sweep_harness import TINY_NETSIM, narrowed, refuse_sweep, run_sweep, start_sweep

# compute paths a CPU machine offers but cannot run (Triton's, outside its interpreter)
PATHS_NOT_ON_CPU = [path for path in compute_paths() if compute_path_problem(path, "cpu") is not None]

LST = ["--task", "lst", "--width", "16", "--depth", "1", "--steps", "4", "--eval-every", "2", "--seeds", "1",
       "--pe", "learned", "--sigmas", "0.5", "--no-report"]
NETSIM = [*TINY_NETSIM, "--seeds", "1", "--pe", "learned", "--sigmas", "0.5", "--steps", "4", "--eval-every", "2",
          "--no-report"]
# submitit's local executor, which needs no SLURM here
SLURM_LOCAL = LST + ["--executor", "slurm", "--slurm-local"]
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
    # each simulated run is a subject of its own: the split by run could never work ("needs a subject with 2 runs")
    ("netsim split by run", NETSIM + ["--split", "run"], "--split 'run' is not one of them; choose from subject"),
    # argparse took "-0.1,0.2" for a flag: "argument --sigmas: expected one argument"
    ("a list starting with a negative σ", LST + ["--sigmas", "-0.1,0.2"], "--sigmas: every σ must be a number in"),
    ("a negative number in exponent form", LST + ["--steps", "-1e3"], "--steps: invalid int value: '-1e3'"),
    ("init gamma negative", LST + ["--init-gamma", "0.5,-1"], "--init-gamma"),
    ("init gamma past its range", LST + ["--init-gamma", "5"], "--init-gamma"),
    ("init gamma nan", LST + ["--init-gamma", "nan"], "--init-gamma"),
    ("init gamma naming a value twice", LST + ["--init-gamma", "0.5,1,0.5"], "--init-gamma"),
    ("negative momentum", LST + ["--optimizer", "sgd", "--momentum", "-1"], "--momentum"),
    ("momentum for adamw", LST + ["--momentum", "0.9"], "--momentum applies to --optimizer sgd"),
    ("momentum 1", LST + ["--optimizer", "sgd", "--momentum", "1"], "--momentum"),
    ("sigma overflowing float32", LST + ["--sigmas", "1e39"], "--sigmas"),
    ("sigma nan", LST + ["--sigmas", "nan"], "--sigmas"),
    ("sigma zero", LST + ["--sigmas", "0"], "--sigmas"),
    ("sigma not a number", LST + ["--sigmas", "abc"], "--sigmas"),
    ("batch larger than the training set", NETSIM + ["--batch-size", "20000"], "--batch-size 20000"),
    ("one training puzzle", LST + ["--lst-train", "ONE_PUZZLE"], "its 1 puzzles leave no test puzzle"),
    ("batch larger than the training split", LST + ["--batch-size", "8101"], "--batch-size 8101"),  # of 8,100
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
    ("sinnd without centroids", without(FMRI, "--sigmas") + ["--data", "NPY", "--pe", "sinnd"],
     "--pe sinnd: PE 'sinnd' needs token coordinates"),
    ("ray address that does not answer", LST + ["--executor", "ray", "--ray-address", "127.0.0.1:1"],
     "--ray-address"),
    ("ray address malformed", LST + ["--executor", "ray", "--ray-address", "nowhere"], "--ray-address"),
    ("ray address without ray", LST + ["--ray-address", "auto"], "--ray-address"),
    ("slurm flag without slurm", LST + ["--slurm-partition", "gpu"], "--slurm-partition"),
    ("slurm without sbatch", LST + ["--executor", "slurm"], "--slurm-local"),
    ("slurm option malformed", SLURM_LOCAL + ["--slurm-option", "qos"], "--slurm-option"),
    ("slurm time zero", SLURM_LOCAL + ["--slurm-time", "0"], "--slurm-time"),
    ("slurm gpus negative", SLURM_LOCAL + ["--slurm-gpus", "-1"], "--slurm-gpus"),
    ("steps zero", LST + ["--steps", "0"], "--steps"),
    ("steps negative", LST + ["--steps", "-5"], "--steps"),
    *[(f"{flag} of 400 digits", (NETSIM if flag == "--netsim-seed" else LST) + [flag, sign + "9" * 400],
       f"{flag} must be finite") for flag, sign in (("--netsim-seed", ""), ("--max-pack", "-"), ("--width", ""),
                                                    ("--steps", ""), ("--batch-size", ""))],
    ("lr zero", LST + ["--lr", "0"], "--lr"),
    ("lr zero in float32", LST + ["--lr", "1e-50"], "--lr must be finite and ≥ 1.17"),  # trained nothing, silently
    # each once taken, to act as a refused or a neutral value in the float32 the optimizers and dropout compute in
    ("momentum one in float32", LST + ["--optimizer", "sgd", "--momentum", "0.999999999"],
     "--momentum 0.999999999 is 1 in float32"),
    ("weight decay zero in float32", LST + ["--weight-decay", "1e-50"], "--weight-decay 1e-50 is 0 in float32"),
    ("pe dropout keeping everything in float32", LST + ["--pe-dropout", "1e-300"],
     "--pe-dropout 1e-300 keeps every value in float32"),
    ("lr list with a zero", LST + ["--lr", "1e-3,0"], "--lr"),
    ("lr list with a word", LST + ["--lr", "1e-3,fast"], "--lr"),
    ("pe list with an empty item", LST + ["--pe", "learned,,none"], "--pe: 'learned,,none' holds an empty item"),
    ("sigma list ending in a comma", LST + ["--sigmas", "0.5,"], "--sigmas"),
    ("lr list naming a value twice", LST + ["--lr", "1e-3,3e-3,1e-3"], "--lr"),
    ("sigma list naming a value twice", LST + ["--sigmas", "0.5,0.5"], "--sigmas"),
    ("weight decay list with a negative", LST + ["--weight-decay", "0,-0.1"], "--weight-decay"),
    ("unknown optimizer in a list", LST + ["--optimizer", "adamw,lion"], "--optimizer"),
    ("momentum list without sgd", LST + ["--optimizer", "adam,adamw", "--momentum", "0,0.9"],
     "--momentum applies to --optimizer sgd"),
    # bit for bit the same models, trained and listed twice
    ("adam and adamw without decay", LST + ["--optimizer", "adam,adamw"], "AdamW without decay is Adam"),
    ("adam and adamw, a decay of 0 among others", LST + ["--optimizer", "adamw,adam", "--weight-decay", "0,0.1"],
     "--optimizer adamw,adam with a --weight-decay of 0"),
    ("lr nan", LST + ["--lr", "nan"], "--lr"),
    # the results store every float setting as float32: beyond its range it trained, then failed writing them
    ("lr beyond float32", LST + ["--lr", "1e308"], "--lr 1e+308 lies beyond float32's range"),
    ("lr list with one beyond float32", LST + ["--lr", "1e-3,1e39"], "--lr 1e+39 lies beyond float32's range"),
    ("weight decay beyond float32", LST + ["--weight-decay", "1e308"], "--weight-decay"),
    ("lr inf", LST + ["--lr", "inf"], "--lr"),
    ("warmup negative", LST + ["--warmup", "-1"], "--warmup"),
    ("eval every zero", LST + ["--eval-every", "0"], "--eval-every"),
    ("threads zero", LST + ["--threads", "0"], "--threads"),
    ("depth zero", LST + ["--depth", "0"], "--depth"),
    ("checkpoint every zero", LST + ["--checkpoint-every", "0"], "--checkpoint-every"),
    ("heads not dividing width", LST + ["--heads", "3"], "--heads"),
    ("unknown PE", LST + ["--pe", "bogus"], "bogus"),
    ("sin2d on brain regions", without(NETSIM, "--sigmas") + ["--pe", "sin2d"], "--pe 'sin2d' is not a PE of"),
    ("unknown flag", LST + ["--no-such-flag"], "no-such-flag"),
    # argparse's abbreviations set a flag silently (--step for --steps)
    ("flag abbreviated", LST + ["--step", "3"], "unrecognized arguments: --step 3"),
    ("on/off flag abbreviated", LST + ["--no-rep"], "--no-rep"),
    # int() and float() read any Unicode digit: a full-width 2 trained 2 steps
    ("steps in full-width digits", LST + ["--steps", "\uff12"], "--steps"),
    ("lr in full-width digits", LST + ["--lr", "\uff10.1"], "--lr"),
    ("sigma list in full-width digits", LST + ["--sigmas", "0.5,\uff12"], "--sigmas"),
    ("netsim nodes in Arabic-Indic digits", NETSIM + ["--nodes", "\u0661\u0662"], "--nodes"),
    # and underscores between digits: 1000 steps trained
    ("steps with an underscore", LST + ["--steps", "1_000"], "--steps: invalid int value: '1_000': a number is written without underscores"),
    ("sigma list with an underscore", LST + ["--sigmas", "0.5,1_0"], "--sigmas"),
    ("warmup not below steps", LST + ["--warmup", "4"], "--warmup 4 is not below --steps 4"),
    ("warmup far beyond steps", LST + ["--warmup", "1000", "--steps", "2"], "--warmup 1000 is not below --steps 2"),
    ("slurm gpus with a CPU device", SLURM_LOCAL + ["--device", "cpu", "--slurm-gpus", "1"],
     "--slurm-gpus 1 with --device cpu"),
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
    ("device empty", LST + ["--device", ""], "--device"),
    ("device gpu", LST + ["--device", "gpu"], "--device"),
    ("device cuda:abc", LST + ["--device", "cuda:abc"], "--device"),
    ("threads beyond the machine's cores", LST + ["--threads", "100000"], "--threads"),
    ("steps beyond what can finish", LST + ["--steps", "1" + "0" * 30], "--steps"),
    ("width beyond any model", LST + ["--width", "1000000000"], "--width"),
    # within the range, but one model would need 1 TB: one line before any model is built
    ("width beyond this machine's memory", LST + ["--width", "65536"], "--width 65536"),
    ("mlp width beyond this machine's memory", LST + ["--mlp-width", "262144", "--depth", "64"], "--mlp-width"),
    # the Triton paths need a CUDA device (the interpreter of the Triton tests aside): one line, not a traceback
    *[(f"backend {path} without a device it runs on", LST + ["--backend", path], "--backend")
      for path in PATHS_NOT_ON_CPU],
    ("mlp width beyond any model", LST + ["--mlp-width", "1000000000"], "--mlp-width"),
    ("depth beyond any model", LST + ["--depth", "1000000000"], "--depth"),
    ("netsim nodes beyond any network", NETSIM + ["--nodes", "1000000000"], "--nodes"),
    ("netsim timepoints beyond any network", NETSIM + ["--timepoints", "1000000000000"], "--timepoints"),
    ("netsim runs beyond any network", NETSIM + ["--runs", "1000000000"], "--runs"),
    ("netsim series beyond any network", NETSIM + ["--timepoints", "1000000", "--runs", "10000"], "--runs 10000"),
    ("sigma rounding to zero in float32", LST + ["--sigmas", "1e-50"], "--sigmas"),
    ("data empty", FMRI + ["--data", ""], "--data"),
    ("lst train empty", LST + ["--lst-train", ""], "--lst-train"),
    ("out empty", LST + ["--out", ""], "--out"),
    ("atlas with data", FMRI + ["--data", "NPY", "--atlas", "glasser360"], "--atlas"),
    # what the task finds in the data names the flag and the file, as the loader's refusals do
    # its variation of 1e-320 underflowed to a sd of 0: refused as constant once z-scored, now by what it is
    ("data too faint to correlate", FMRI + ["--data", "SUBNORMAL_NPY"],
     "--data SUBNORMAL_NPY: region 0 of subject 'subject0' run0 varies by only"),
    ("data of one subject split by subject", FMRI + ["--data", "ONE_SUBJECT_NPY"],
     "--data ONE_SUBJECT_NPY: a split by subject needs at least 2 subjects"),
    ("slurm option with a line break", SLURM_LOCAL + ["--slurm-option", "qos=short\ntouch PWNED"], "--slurm-option"),
    ("slurm option with a shell command", SLURM_LOCAL + ["--slurm-option", "qos=short;touch PWNED"], "--slurm-option"),
    ("slurm partition with a quote", SLURM_LOCAL + ["--slurm-partition", "gpu'"], "--slurm-partition"),
    # once taken: \w alone matches any Unicode letter
    ("slurm option key not ASCII", SLURM_LOCAL + ["--slurm-option", "qös=short"], "--slurm-option"),
    ("slurm partition not ASCII", SLURM_LOCAL + ["--slurm-partition", "gpü"], "--slurm-partition"),
    ("pe with a line break", LST + ["--pe", "learned\nnone"], "--pe"),
    # step counts past --steps' own limit: --eval-every's ended in a 40-line overflow after config.json was written
    ("eval every beyond what can finish", LST + ["--eval-every", "1" + "0" * 30], "--eval-every"),
    ("checkpoint every beyond what can finish", LST + ["--checkpoint-every", "1" + "0" * 30], "--checkpoint-every"),
    ("warmup beyond what can finish", LST + ["--warmup", "1" + "0" * 30], "--warmup"),
    # an empty address is no cluster: ray.init failed on it after config.json was written
    ("ray address empty", LST + ["--executor", "ray", "--ray-address", ""], "--ray-address"),
    # mkdir's error once the checks had passed: exit 1, "free the space ... --resume"
    ("out name too long", LST + ["--out", "a" * 300], "--out"),
    ("out a link to nowhere", LST + ["--out", "DANGLING"], "--out"),
    ("out under a link to nowhere", LST + ["--out", "DANGLING/run"], "--out"),
    # a local Ray instance or submitit's local executor trains here, with this machine's device and cores
    ("cuda on a local Ray where there is none", LST + ["--executor", "ray", "--device", "cuda"], "--device"),
    ("cuda on slurm-local where there is none", SLURM_LOCAL + ["--device", "cuda"], "--device"),
    ("threads beyond the cores of a local Ray", LST + ["--executor", "ray", "--threads", "1024"], "--threads"),
    ("threads beyond the cores of slurm-local", SLURM_LOCAL + ["--threads", "1024"], "--threads"),
    ("slurm gpus beyond any node", SLURM_LOCAL + ["--slurm-gpus", "1000000"], "--slurm-gpus"),
    ("slurm time beyond a year", SLURM_LOCAL + ["--slurm-time", "10000000"], "--slurm-time"),
    ("slurm option setting the time", SLURM_LOCAL + ["--slurm-time", "5", "--slurm-option", "time=10"], "--slurm-time"),
    ("slurm option setting the GPUs", SLURM_LOCAL + ["--slurm-option", "gres=gpu:2"], "--slurm-gpus"),
    ("slurm option setting the job array", SLURM_LOCAL + ["--slurm-option", "array=0-3"], "pe_fast sets array itself"),
]


def inputs(tmp_path: Path) -> dict[str, str]:
    file = tmp_path / "a_file.txt"
    file.write_text("not a folder")
    one = tmp_path / "one.csv"
    one.write_text("ID,LST_num,condition,puzzles,solutions\n0,,Binary,2000500234001000,4\n")
    npy = tmp_path / "series.npy"  # subjects × time × regions, no regions table: no centroids
    np.save(npy, np.random.default_rng(0).standard_normal((2, 60, 10)).astype(np.float32))
    regions = tmp_path / "regions.csv"
    regions.write_text("label,x,y,z,network\n" + "".join(f"r{i},0,0,{i},{'ab'[i % 2]}\n" for i in range(10)))
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    subnormal = tmp_path / "subnormal.npy"  # not constant, but z-scored to zeros: nothing to predict
    np.save(subnormal, np.random.default_rng(0).standard_normal((4, 50, 10)) * 1e-320)
    one_subject = tmp_path / "one_subject.npy"
    np.save(one_subject, np.random.default_rng(0).standard_normal((1, 60, 10)).astype(np.float32))
    return {"FILE": str(file), "ONE_PUZZLE": str(one), "NPY": str(npy), "REGIONS": str(regions),
            "DANGLING": str(dangling), "SUBNORMAL_NPY": str(subnormal), "ONE_SUBJECT_NPY": str(one_subject)}


def fill(args: list[str], files: dict[str, str]) -> list[str]:
    return [files.get(a, a) if "/" not in a else re.sub(r"^(FILE|DANGLING)/", lambda m: files[m[1]] + "/", a)
            for a in args]


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
    if "--executor" in args and "slurm" in args:  # a machine without SLURM's tools, whether or not this one has them
        which = shutil.which
        monkeypatch.setattr(shutil, "which", lambda tool, *a, **k: None if tool in ("sbatch", "srun")
                            else which(tool, *a, **k))
    files = inputs(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    args = narrowed(*fill(args, files))
    must_name = re.sub(r"\b[A-Z_]+\b", lambda word: files.get(word[0], word[0]), must_name)  # a file it names
    if "--out" not in args:
        args += ["--out", str(tmp_path / "run")]
    threads = torch.get_num_threads()
    try:
        code = sweep_main(args)
    finally:
        torch.set_num_threads(threads)
    assert_one_line(capsys, code, must_name)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no results folder, nothing else either


def test_an_out_folder_beginning_with_a_tilde_is_refused_from_python_and_flags(tmp_path, capsys, monkeypatch):
    """out="~/x" made a folder named ~ in the current folder (issue 55), which a later rm -rf ~ would meet: a
    leading ~ is refused, naming the path written out, whether it came from Python or a quoted flag."""
    import pe_fast.sweep
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(ValueError, match=f"'~/x' begins with ~, which only a shell expands: write the path out "
                                         f"\\('{tmp_path}/home/x'\\)"):
        pe_fast.sweep.run(task="netsim", steps=2, out="~/x")
    assert_one_line(capsys, sweep_main(LST + ["--out", "~/x"]), "'~/x' begins with ~")
    # its sibling, a variable only a shell expands, as --out and as torch's cache folder
    assert_one_line(capsys, sweep_main(LST + ["--out", "$HOME/x"]), "'$HOME/x' names a variable")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "~/cache")
    assert_one_line(capsys, sweep_main(LST + ["--out", str(tmp_path / "run")]), "'~/cache' begins with ~")
    assert list(tmp_path.iterdir()) == []


def test_a_flag_given_twice_is_refused_not_overwritten(tmp_path, capsys, monkeypatch):
    """--sigmas 0.1 --sigmas 0.3 trained σ = 0.3 alone and --steps 4 --steps 6 six steps, without a word (argparse
    keeps the last value, round 16): a flag that takes one value is refused when given twice, in either spelling;
    --slurm-option, which collects, repeats."""
    from pe_fast.sweep import settings
    monkeypatch.chdir(tmp_path)
    assert_one_line(capsys, sweep_main(LST + ["--sigmas", "0.3"]), "--sigmas is given twice ('0.5', then '0.3')")
    assert_one_line(capsys, sweep_main(LST + ["--steps=6"]), "--steps is given twice ('4', then '6')")
    assert_one_line(capsys, sweep_main(["--resume", "--out", "A", "--out", "B"]), "--out is given twice")
    assert list(tmp_path.iterdir()) == []
    options = settings.build_parser().parse_args(["--slurm-option", "a=b", "--slurm-option", "c=d"]).slurm_option
    assert options == ["a=b", "c=d"]


def test_control_characters_beyond_ascii_are_escaped_in_lines_and_refused_in_names(tmp_path, capsys, monkeypatch):
    """Only ASCII's controls were escaped or refused (round 17): the 8-bit CSI \\x9b and NEL \\x85, the line
    separator U+2028, a right-to-left override and a zero-width space reached the terminal raw, through an --out
    name and the lines that quote a folder's or a lock's text. Every Unicode control or format character and the
    separators now are."""
    from pe_fast.program_exit import escaped, print_error
    sneaky = "a\x85b\x9bc\u2028d\u202ee\u200bf"
    assert escaped(sneaky) == "a\\x85b\\x9bc\\u2028d\\u202ee\\u200bf"
    assert escaped("é 中 σ-ß") == "é 中 σ-ß"  # letters of any script are text
    monkeypatch.chdir(tmp_path)
    assert_one_line(capsys, sweep_main(LST + ["--out", "run\u202etxt.exe"]), "holds a control character")
    assert list(tmp_path.iterdir()) == []
    print_error(f"{sneaky} " + "x" * 5000)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not any(ch in err for ch in "\x85\x9b\u2028\u202e\u200b")
    assert re.search(r"x… \(3,0\d\d characters more\)\n$", err) and len(err) < 2100  # a file's text whole: cut


def test_the_sweep_s_out_is_not_a_flag(tmp_path, capsys, monkeypatch):
    """--out=--version made a folder named --version (round 18): a name that begins as a flag does is refused;
    ./--version names such a folder."""
    monkeypatch.chdir(tmp_path)
    assert_one_line(capsys, sweep_main(LST + ["--out=--version"]), "'--version' begins with -, as a flag does")
    assert list(tmp_path.iterdir()) == []


def test_the_report_s_out_is_not_a_flag(tmp_path, capsys, monkeypatch):
    """python -m pe_fast.report A B --out --version pooled A and B into a folder named --version, and --out
    --rdms C took C as the pooled folder once --rdms was taken out (round 17)."""
    monkeypatch.chdir(tmp_path)
    for argv in (["a", "b", "--out", "--version"], ["a", "--out", "--rdms", "c"]):
        assert_one_line(capsys, report_main(argv), f"--out {argv[argv.index('--out') + 1]!r}: a flag where the pooled")
    # round 18: --out=X, which the sweep takes, was refused as an unknown argument whatever X
    assert_one_line(capsys, report_main(["a", "b", "--out=--version"]), "--out '--version': a flag where the pooled")
    assert_one_line(capsys, report_main(["a", "b", "--out="]), "--out names no folder")
    assert_one_line(capsys, report_main(["a", "b", "--out=pooled"]), "a is not a folder")  # taken: on to DIR
    assert list(tmp_path.iterdir()) == []


def test_a_model_id_whose_int_raises_is_named():
    """An object registered as an integer whose int() raised reached the caller as its own RuntimeError (round
    18): refused as any other id that is not a whole number, quoted briefly."""
    import numbers
    from pe_fast.results.reading import ModelNotFound, _model_id

    class Broken:
        def __int__(self):
            raise RuntimeError("no")

        def __repr__(self):
            return "Broken" + "!" * 1000

    numbers.Integral.register(Broken)
    with pytest.raises(ModelNotFound, match=r"model_id Broken!+… \(a .*Broken\): expected a model id"):
        _model_id(Broken())


def test_an_out_folder_through_a_missing_folder_and_dotdot_is_refused(tmp_path, capsys, monkeypatch):
    """--out a/missing/../o made a/missing on the way (mkdir with parents) and left it there: a shell reads
    a/missing/.. as nothing, so the path is refused and nothing is made; through a real folder it is a path."""
    import pe_fast.sweep
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").mkdir()
    assert_one_line(capsys, sweep_main(LST + ["--out", "a/missing/../o"]),
                    "a/missing/../o: a/missing is not a folder, so a/missing/.. names none")
    with pytest.raises(ValueError, match="a/missing is not a folder"):
        pe_fast.sweep.run(task="netsim", steps=2, out="a/missing/../o")
    assert [p.name for p in tmp_path.rglob("*")] == ["a"]
    run_folder.check_out_folder("a/../o")  # a/.. is this folder: accepted


@pytest.mark.parametrize("arguments, must_name", [
    (dict(task="fmri", data=np.zeros((2, 10, 5))), "--data: expected str, got a numpy.ndarray of shape (2, 10, 5)"),
    (dict(task="lst", sigmas=np.zeros((2, 2))),
     "--sigmas: expected a list or comma-separated text, got a numpy.ndarray of shape (2, 2)"),
    (dict(task="lst", steps="9" * 500), "--steps: expected int, got '999"),
    (dict(task="lst", no_report=np.zeros(3)), "--no-report: expected True or False, got a numpy.ndarray"),
    (dict(task=["lst"] * 100), "--task ['lst', 'lst'"),
    (dict(task="lst", pe={"learned", "sin2d"}), "--pe: expected a list or comma-separated text, got {"),
    (dict(task="lst", sigmas={0.1: 1}), "--sigmas: expected a list or comma-separated text, got {0.1: 1}"),
    # str() of each read as one garbled value
    (dict(task="lst", pe=(name for name in ["learned"])), "--pe: expected a list or comma-separated text, got <gen"),
    (dict(task="lst", pe=b"learned"), "--pe: expected a list or comma-separated text, got b'learned'"),
    (dict(task="lst", pe=["learned", None]), "--pe: the item None is a NoneType, not text or a number"),
    (dict(task="lst", sigmas=[0.2, [0.3]]), "--sigmas: the item [0.3] is a list, not text or a number"),
    # one float32: the same models trained twice, listed as two settings
    (dict(task="lst", sigmas="0.1,0.1000000001"), "--sigmas: '0.1,0.1000000001' names one value twice: 0.1 and"),
    (dict(task="lst", lr=[1e-3, 1.00000001e-3]), "--lr: [0.001, 0.00100000001] names one value twice"),
])
def test_a_python_argument_of_a_wrong_type_is_named_in_one_short_line(arguments, must_name, tmp_path, monkeypatch):
    """A type refusal names the type (an array by its shape) or quotes a short repr: once, a 21-line array."""
    import pe_fast.sweep
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as error:
        pe_fast.sweep.run(**arguments, out=str(tmp_path / "run"))
    message = str(error.value)
    assert must_name in message and "\n" not in message and len(message) < 200, message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("out", ["", "  "])
def test_an_empty_out_writes_nothing_where_the_sweep_runs(out, tmp_path):
    """An empty --out is refused, also from an empty folder, where no other rule would stop the sweep."""
    done = run_sweep(*LST, "--out", out, cwd=tmp_path, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "--out" in lines[0], done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("inside", ["packs/new", "figures/a/b"])
def test_an_out_inside_another_results_folder_is_refused(inside, tmp_path):
    """A sweep inside another run's folder would be read as part of it (its packs/, its report's figures/)."""
    other = tmp_path / "other"
    (other / "packs").mkdir(parents=True)
    (other / "config.json").write_text("{}")
    before = {path: path.stat().st_mtime_ns for path in [other, *other.rglob("*")]}
    done = refuse_sweep(*LST, "--out", str(other / inside))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and f"inside the results folder {other}" in lines[0], done.stderr
    # nothing touched: the write probe once made and removed a folder there, changing packs/'s time
    assert {path: path.stat().st_mtime_ns for path in [other, *other.rglob("*")]} == before


@pytest.mark.parametrize("where", [".", "sweep"])
def test_an_out_inside_the_pe_fast_package_is_refused(where, capsys):
    """Results written into the installed package's source would mix with its code."""
    import pe_fast
    made = Path(pe_fast.__file__).resolve().parent / where / f"results_{os.getpid()}"
    try:
        assert_one_line(capsys, sweep_main(LST + ["--out", str(made / "run")]), "inside the pe_fast package")
        assert not made.exists()
    finally:
        shutil.rmtree(made, ignore_errors=True)


def test_a_results_folder_is_known_by_its_config_alone_too(tmp_path):
    """A sweep's first file is config.json: an --out beside it, before packs/ exists, is inside it as well."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"settings": {}, "packs": []}))
    done = refuse_sweep(*LST, "--out", str(other / "new"))
    assert done.returncode == 2 and f"inside the results folder {other}" in done.stderr, done.stderr
    assert sorted(p.name for p in other.iterdir()) == ["config.json"]


def test_another_programs_config_json_in_a_parent_folder_is_no_results_folder(tmp_path):
    """A config.json of some other program (a project's, a home folder's) does not make its folder a run's."""
    (tmp_path / "config.json").write_text(json.dumps({"editor": "vim"}))
    done = refuse_sweep(*LST, "--out", str(tmp_path / "runs" / "first"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "runs" / "first" / "results.parquet").is_file()


@pytest.mark.parametrize("service, must_name", [("silent", "does not answer as a Ray cluster within 1 s"),
                                                ("http", "the service there is not a Ray cluster"),
                                                ("http2", "does not answer as a Ray cluster within 1 s")])
def test_a_ray_address_of_another_service_is_refused_within_seconds(service, must_name, tmp_path, capsys,
                                                                     monkeypatch):
    """A TCP service that is not Ray's: ray.init would wait for it for ever, after the folder was written."""
    from pe_fast.sweep import runtime
    monkeypatch.setattr(runtime, "RAY_CONNECT_TIMEOUT_S", 1)
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():  # accepts; the http service answers as a web server does, the silent one never
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                connection, _ = listener.accept()
                if service == "http":
                    connection.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                if service == "http2":  # an empty SETTINGS frame, as any HTTP/2 server's first words
                    connection.sendall(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
                stop.wait(3)
                connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        code = sweep_main(LST + ["--executor", "ray", "--ray-address", address, "--out", str(tmp_path / "run")])
    finally:
        stop.set()
        thread.join()
        listener.close()
    assert_one_line(capsys, code, must_name)
    assert list(tmp_path.iterdir()) == []


def test_a_ray_address_of_a_grpc_server_not_rays_is_refused(tmp_path, capsys):
    """A gRPC server answers HTTP/2's preface as Ray's GCS does; its answer to Ray's own call tells them apart
    (once ray.init hung there, after the folder was written)."""
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("ray.core.generated.gcs_service_pb2_grpc")
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        code = sweep_main(LST + ["--executor", "ray", "--ray-address", f"127.0.0.1:{port}", "--out",
                                 str(tmp_path / "run")])
    finally:
        server.stop(None)
    assert_one_line(capsys, code, f"--ray-address 127.0.0.1:{port}: the service there is not a Ray cluster "
                                  f"(UNIMPLEMENTED)")
    assert list(tmp_path.iterdir()) == []


def test_ray_address_auto_without_a_cluster_is_refused(tmp_path, capsys, monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # where Ray looks for this machine's cluster: none there
    code = sweep_main(LST + ["--executor", "ray", "--ray-address", "auto", "--out", str(tmp_path / "run")])
    assert_one_line(capsys, code, "--ray-address auto: no Ray cluster is running on this machine")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("variable", ["nowhere", "127.0.0.1:99999"])
def test_a_malformed_ray_address_variable_is_refused_before_anything_is_written(variable, tmp_path, capsys,
                                                                                monkeypatch):
    """ray.init joins $RAY_ADDRESS where --ray-address is left out: it is checked as the flag is."""
    monkeypatch.setenv("RAY_ADDRESS", variable)
    code = sweep_main(LST + ["--executor", "ray", "--out", str(tmp_path / "run")])
    assert_one_line(capsys, code, f"$RAY_ADDRESS {variable!r}: expected auto or HOST:PORT")
    assert list(tmp_path.iterdir()) == []


def test_ray_address_auto_names_the_variable_it_joins(tmp_path, capsys, monkeypatch):
    """auto joins $RAY_ADDRESS first: where nothing answers there, the message named the flag and a rewritten
    address only, not the variable the user set."""
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    code = sweep_main(LST + ["--executor", "ray", "--ray-address", "auto", "--out", str(tmp_path / "run")])
    assert_one_line(capsys, code, "--ray-address auto, from $RAY_ADDRESS '127.0.0.1:1',")
    assert list(tmp_path.iterdir()) == []


def test_ray_address_auto_with_a_malformed_ray_address_variable_is_refused(tmp_path, capsys, monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ADDRESS", "not an address")  # what --ray-address auto reads first
    code = sweep_main(LST + ["--executor", "ray", "--ray-address", "auto", "--out", str(tmp_path / "run")])
    assert_one_line(capsys, code, "$RAY_ADDRESS 'not an address' is not an address")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("compile", ["on", "off"])
@pytest.mark.parametrize("cache, must_name", [("/proc/pe_fast_cache", "cannot write in /proc"),
                                              ("FILE/cache", "FILE is a file, not a folder")])
def test_a_compiler_cache_folder_that_cannot_be_made_is_refused_naming_the_variable(compile, cache, must_name, tmp_path,
                                                                                     capsys, monkeypatch):
    """torch makes $TORCHINDUCTOR_CACHE_DIR when it loads its compiler (torch.optim does, compiled or not): once
    exit 1 after the folder was written, blaming it and advising --resume."""
    files = inputs(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", fill([cache], files)[0])
    code = sweep_main(LST + ["--compile", compile, "--out", str(tmp_path / "run")])
    assert_one_line(capsys, code, f"$TORCHINDUCTOR_CACHE_DIR {os.environ['TORCHINDUCTOR_CACHE_DIR']!r}: "
                                  f"{must_name.replace('FILE', files['FILE'])}")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_an_empty_compiler_cache_variable_is_refused(tmp_path, capsys, monkeypatch):
    """torch read it as the working folder and wrote its compiled kernels there."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")
    code = sweep_main(LST + ["--out", str(tmp_path / "run")])
    assert_one_line(capsys, code, "$TORCHINDUCTOR_CACHE_DIR '' names no folder")
    assert list(tmp_path.iterdir()) == []


def test_a_compiler_cache_folder_inside_the_package_is_refused(tmp_path, capsys, monkeypatch):
    """--out there is refused; torch's cache was made there, its files mixed with pe_fast's code."""
    cache = Path(pe_fast.__file__).parent / "inductor-cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    code = sweep_main(LST + ["--out", str(tmp_path / "run")])
    assert_one_line(capsys, code, f"$TORCHINDUCTOR_CACHE_DIR {str(cache)!r}: {cache}: inside the pe_fast package's")
    assert not cache.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cache, must_name", [
    # g++'s command line split the path: a 100-line traceback after config.json was written
    ("cache dir", "holds a space, a line break"), ("cache\ndir", "holds a space, a line break"),
    # shlex took the quote away: g++ was given another path, and ld failed
    ("cache'q", "a quote or a backslash"), ('cache"q', "a quote or a backslash"), ("cache\\q", "a backslash"),
    # torch's files inside another sweep's folder, as an --out there would be
    ("finished/cache", "inside the results folder"),
    # this sweep's own --out, not made yet: torch's files in it
    ("run/cache", "inside the results folder"), ("run", "inside the results folder")])
def test_a_compiler_cache_folder_torch_cannot_use_or_inside_a_run_is_refused(cache, must_name, unfinished, tmp_path,
                                                                             capsys, monkeypatch):
    shutil.copytree(unfinished, tmp_path / "finished")
    before = snapshot(tmp_path)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / cache))
    code = sweep_main(LST + ["--compile", "on", "--out", str(tmp_path / "run")])
    assert_one_line(capsys, code, must_name)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("link", ["dangling", "loop"])
def test_a_compiler_cache_folder_behind_a_link_to_nothing_is_refused(link, tmp_path, capsys, monkeypatch):
    """A link to no folder passed the check (its parent was writable); torch then failed to make the folder, after
    config.json was written, and the message blamed the results folder."""
    cache = tmp_path / "cache"
    if link == "dangling":
        cache.symlink_to(tmp_path / "gone" / "dir")
    else:
        cache.symlink_to(tmp_path / "other")
        (tmp_path / "other").symlink_to(cache)
    before = sorted(p.name for p in tmp_path.iterdir())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    code = sweep_main(LST + ["--out", str(tmp_path / "run")])
    assert_one_line(capsys, code, f"$TORCHINDUCTOR_CACHE_DIR {str(cache)!r}: {cache} is a link that leads to no "
                                  f"folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_kernels_that_pe_fast_kernels_names_and_that_did_not_load_are_refused(tmp_path, capsys, monkeypatch):
    """import pe_fast warns and runs the reference (a library import must not fail); the sweep refuses."""
    from pe_fast.ops import extension
    monkeypatch.setattr(extension, "REQUESTED", "/etc/passwd")
    monkeypatch.setattr(extension, "MODULE", None)
    monkeypatch.setattr(extension, "ERROR", ImportError("PE_FAST_KERNELS='/etc/passwd' is not a compiled pe_fast._C"))
    code = sweep_main(LST + ["--out", str(tmp_path / "run")])
    assert_one_line(capsys, code, "$PE_FAST_KERNELS '/etc/passwd': its kernels did not load")
    assert list(tmp_path.iterdir()) == []


def test_a_backend_whose_kernels_are_not_built_is_named_with_why(tmp_path, capsys, monkeypatch):
    """--backend cpp where pe_fast._C did not build read "--backend 'cpp' is not one of them; choose from ..."."""
    from pe_fast.ops import backends
    monkeypatch.setitem(backends.UNAVAILABLE, "cpp", (("cpu",), "pe_fast's C++ CPU kernels are not built (No "
                                                               "module named 'pe_fast._C')"))
    code = sweep_main(LST + ["--backend", "cpp", "--out", str(tmp_path / "run")])
    assert_one_line(capsys, code, "--backend cpp is not available here: pe_fast's C++ CPU kernels are not built")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["yes", "true", " 1"])
def test_a_tf32_variable_that_is_neither_1_nor_0_is_refused(value, tmp_path, capsys, monkeypatch):
    """It was read as "not 1", silently: IEEE dots for a user who asked for TF32."""
    from pe_fast.ops import backends
    monkeypatch.setenv("PE_FAST_TF32", value)
    assert_one_line(capsys, sweep_main(LST + ["--out", str(tmp_path / "run")]), f"$PE_FAST_TF32 {value!r}")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="PE_FAST_TF32"):  # the op's Triton kernels ask the same function
        backends.tf32_dots()


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton, whose interpreter it is")
def test_triton_s_interpreter_as_the_cpu_default_is_refused(tmp_path):
    """TRITON_INTERPRET=1 registered Triton for CPU tensors ahead of the C++ kernels: a 4-step sweep of 4 s ran
    for minutes in the interpreter, its banner saying nothing. Asked for (--backend triton), it runs."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = run_sweep(*LST, "--out", str(tmp_path / "run"), env=env, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "$TRITON_INTERPRET runs the Triton kernels in Triton's interpreter" in done.stderr
    assert list(tmp_path.iterdir()) == []


# '²' and '１' pass str.isdigit(): int() raised on the first, libgomp ignored the second, and a count past
# unsigned long's
@pytest.mark.parametrize("value", ["0", "-1", "abc", "", "²", "１", "4,²", "99999999999999999999", "\u00a01"])
@pytest.mark.parametrize("variable", ["OMP_NUM_THREADS", "MKL_NUM_THREADS"])
def test_an_openmp_thread_count_openmp_ignores_is_refused(variable, value, tmp_path, capsys, monkeypatch):
    """libgomp warned and took its default, and MKL (round 17) took its own without a word: the sweep ran on a
    thread count nobody set."""
    monkeypatch.setenv(variable, value)
    assert_one_line(capsys, sweep_main(LST + ["--out", str(tmp_path / "run")]), f"${variable} {value!r}")
    assert list(tmp_path.iterdir()) == []


def test_mkl_takes_one_thread_count_not_a_list(tmp_path, capsys, monkeypatch):
    """MKL_NUM_THREADS=2,2 was taken as OpenMP's list of counts; MKL reads no list and ran on one thread."""
    monkeypatch.setenv("MKL_NUM_THREADS", "2,2")
    assert_one_line(capsys, sweep_main(LST + ["--out", str(tmp_path / "run")]), "$MKL_NUM_THREADS '2,2'")
    assert list(tmp_path.iterdir()) == []


def test_an_openmp_thread_count_openmp_takes_is_taken(tmp_path, monkeypatch):
    """'+1' (OpenMP reads it as 1) was refused with the values it ignores."""
    monkeypatch.setenv("OMP_NUM_THREADS", "+1")
    threads = torch.get_num_threads()
    try:
        assert sweep_main(LST + ["--out", str(tmp_path / "run")]) == 0
    finally:
        torch.set_num_threads(threads)


# another extension module named _C: torch's own, whose init once ran as pe_fast's (a segfault)
TORCH_C = next(Path(torch.__file__).parent.glob("_C.*.so"))


@pytest.mark.parametrize("flags, kernels", [([], "/etc/passwd"), (["--backend", "cpp"], "/etc/passwd"),
                                            ([], str(TORCH_C))],
                         ids=["not a library", "with cpp asked for", "another extension named _C"])
def test_the_sweep_as_typed_refuses_pe_fast_kernels_that_did_not_load(flags, kernels, tmp_path):
    """The command: the one error line (no warning of the import before it), exit 2, nothing written. With cpp
    asked for, it once blamed --backend."""
    env = {**os.environ, "PE_FAST_KERNELS": kernels}
    done = run_sweep(*LST, *flags, "--out", str(tmp_path / "run"), env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith(
        f"error: $PE_FAST_KERNELS '{kernels}': its kernels did not load"), done.stderr
    assert list(tmp_path.iterdir()) == []


def fake_slurm_tools(folder: Path, scontrol: str, sbatch: str = "exit 1") -> str:
    """A PATH with SLURM's tools as shell scripts (their bodies given) in front: a machine with sbatch whose
    cluster answers as the scripts do."""
    tools = folder / "tools"
    tools.mkdir()
    for tool, body in (("scontrol", scontrol), ("sbatch", sbatch), ("srun", "exit 1"), ("squeue", "exit 1")):
        (tools / tool).write_text(f"#!/bin/sh\n{body}\n")
        (tools / tool).chmod(0o755)
    return f"{tools}{os.pathsep}{os.environ['PATH']}"


NO_CONFIGURATION = ("echo 'scontrol: error: fetch_config: DNS SRV lookup failed' >&2; "
                    "echo 'scontrol: fatal: Could not establish a configuration source' >&2; exit 1")
ONE_PARTITION = "echo 'PartitionName=test AllowGroups=ALL Default=YES State=UP'"


@pytest.mark.parametrize("scontrol, flags, must_name", [
    (NO_CONFIGURATION, [], "--executor slurm: no SLURM cluster answers here (Could not establish a configuration "
                           "source)"),
    (NO_CONFIGURATION, ["--slurm-partition", "x"], "--executor slurm: no SLURM cluster answers here"),
    (ONE_PARTITION, ["--slurm-partition", "x"], "--slurm-partition x: the SLURM cluster has no such partition (it "
                                                "has test)"),
], ids=["no configuration", "no configuration, a partition", "no such partition"])
def test_a_slurm_cluster_that_does_not_answer_is_refused_before_anything_is_written(scontrol, flags, must_name,
                                                                                    tmp_path, capsys, monkeypatch):
    """sbatch installed, but no cluster it can reach: once a 53-line traceback after config.json and slurm/ were
    written."""
    monkeypatch.setenv("PATH", fake_slurm_tools(tmp_path, scontrol))
    code = sweep_main(LST + ["--executor", "slurm", *flags, "--out", str(tmp_path / "run")])
    assert_one_line(capsys, code, must_name)
    assert [p.name for p in tmp_path.iterdir()] == ["tools"]


def test_an_sbatch_that_fails_at_submission_is_one_line_naming_the_packs(tmp_path, capsys, monkeypatch):
    """A cluster that answers, then refuses the job array: one line naming the packs, not submitit's traceback."""
    sbatch = "echo 'sbatch: error: Batch job submission failed: Invalid account or account/partition' >&2; exit 1"
    monkeypatch.setenv("PATH", fake_slurm_tools(tmp_path, ONE_PARTITION, sbatch))
    code = sweep_main(LST + ["--executor", "slurm", "--slurm-partition", "test", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("pe_fast sweep:", "note:"))]
    assert code == 1 and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: pack 0: sbatch failed to submit the job array (Batch job "
                                                   "submission failed: Invalid account"), err


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


def checkpoint_of_another_width(folder: Path):
    """Pack 0's checkpoint as a sweep of another --width writes it: it loads safely, but its tensors do not fit."""
    from pe_fast.sweep import grid
    from pe_fast.sweep.task_loading import load_task
    config = json.loads((folder / "config.json").read_text())
    s = dataclasses.replace(Settings.from_json(config["settings"], packs=()), width=32)
    pack = [next(m for m in config["models"] if m["model_id"] == i) for i in config["packs"][0]]
    trainer = grid.pack_trainer(s, load_task(s), pack)
    run_folder.save_checkpoint(folder, 0, trainer.state_dict())


def trained_checkpoint_edited(edit):
    """Pack 0's checkpoint as its training leaves it after its first evaluation (step 2), then `edit`ed: it loads
    safely, its model fits, but what torch would load as given (the optimizer's, schedule's, sampler's and RNG's
    states) is not what this pack's training leaves."""
    def spoil(folder: Path):
        from pe_fast.sweep import grid
        from pe_fast.sweep.task_loading import load_task
        config = json.loads((folder / "config.json").read_text())
        s = Settings.from_json(config["settings"], packs=())
        pack = [next(m for m in config["models"] if m["model_id"] == i) for i in config["packs"][0]]
        trainer = grid.pack_trainer(s, load_task(s), pack)
        def save_edited():  # as the sweep saves it, at step 2 (the only checkpoint before the last step)
            state = copy.deepcopy(trainer.state_dict())  # it holds the live optimizer's state: edit a copy
            edit(state)
            run_folder.save_checkpoint(folder, 0, state)
        trainer.run(checkpoint=save_edited, checkpoint_every=2)
    return spoil


def set_in(path: str, value):
    """An edit of a checkpoint's state: the value at path (keys joined by dots, digits for indices) replaced."""
    def edit(state):
        *keys, last = [int(key) if key.isdigit() else key for key in path.split(".")]
        owner = state
        for key in keys:
            owner = owner[key]
        owner[last] = value(owner[last]) if callable(value) else value
    return edit


def config_without(key: str):
    def change(folder: Path):
        config = json.loads((folder / "config.json").read_text())
        del config["settings"][key]
        (folder / "config.json").write_text(json.dumps(config))
    return change


def config_text(text: str):
    return lambda folder: (folder / "config.json").write_text(text)


def config_with(**settings):
    """The folder's config.json with these settings changed (a tampered or foreign folder)."""
    def change(folder: Path):
        config = json.loads((folder / "config.json").read_text())
        config["settings"].update(settings)
        (folder / "config.json").write_text(json.dumps(config))
    return change


def config_part(part: str, value):
    """config.json with one of its top-level parts (task, models, torch ...) replaced."""
    def change(folder: Path):
        config = json.loads((folder / "config.json").read_text())
        config[part] = value
        (folder / "config.json").write_text(json.dumps(config))
    return change


def config_packs(packs):
    def change(folder: Path):
        config = json.loads((folder / "config.json").read_text())
        config["packs"] = packs
        (folder / "config.json").write_text(json.dumps(config))
    return change


def config_a_fifo(folder: Path):
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")


def config_a_link_to(target: str):
    def change(folder: Path):
        (folder / "config.json").unlink()
        (folder / "config.json").symlink_to(target)
    return change


def config_with_a_key_twice(folder: Path):
    text = (folder / "config.json").read_text()
    (folder / "config.json").write_text(text.replace('"steps": ', '"steps": 999, "steps": ', 1))


def config_a_folder(folder: Path):
    (folder / "config.json").unlink()
    (folder / "config.json").mkdir()


def checkpoint_without_keys(folder: Path):
    torch.save({"step": 1, "model": {}}, folder / "packs" / "0.checkpoint.pt")


def checkpoint_a_folder(folder: Path):
    (folder / "packs" / "0.checkpoint.pt").mkdir()


def packs_a_file(folder: Path):
    (folder / "packs").rmdir()
    (folder / "packs").write_text("x")


def pack_a_fifo(folder: Path):
    os.mkfifo(folder / "packs" / "0")


def lock_a_fifo(folder: Path):
    os.mkfifo(folder / ".lock")


def lock_linked_out(folder: Path):
    """DIR/.lock a link to a file beside DIR naming this process, alive: read through the link, a live lock."""
    (folder.parent / "someone.lock").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    (folder / ".lock").symlink_to(folder.parent / "someone.lock")


def lock_text(text: str):
    def change(folder: Path):
        (folder / ".lock").write_text(text)
    return change


def link_out(name: str):
    """DIR/<name> a link to a folder beside DIR, holding a file the sweep must not touch."""
    def change(folder: Path):
        elsewhere = folder.parent / "elsewhere"
        elsewhere.mkdir(exist_ok=True)
        (elsewhere / "0.checkpoint.pt").write_bytes(b"someone else's")
        target = folder / name
        if target.is_dir():
            shutil.rmtree(target)
        target.symlink_to(elsewhere, target_is_directory=True)
    return change


# (case, how the folder is spoiled, flags after --resume --out DIR, what the one line must name)
RESUME_CASES = [
    ("crafted checkpoint runs nothing", evil_checkpoint, [], "0.checkpoint.pt cannot be loaded safely"),
    ("garbage checkpoint", garbage_checkpoint, [], "delete it"),
    ("checkpoint of another width", checkpoint_of_another_width, [],
     "0.checkpoint.pt does not fit pack 0 of this sweep (embed.weight is (1, 2, 32) torch.float32, the pack's "
     "(1, 2, 16) torch.float32)"),
    ("config missing a key", config_without("pe"), [], "config.json"),
    ("config not JSON", config_text("{not json"), [], "config.json"),
    ("config not an object", config_text("[1, 2]"), [], "config.json"),
    ("config nested too deep", config_text("[" * 100_000 + "]" * 100_000), [], "config.json"),
    ("config with a bad number", config_without("steps"), [], "config.json"),
    ("changed setting", None, ["--steps", "50"], "--steps 50 differs"),
    ("changed PE", None, ["--pe", "none"], "--pe none differs"),
    ("ray address that does not answer", None, ["--executor", "ray", "--ray-address", "127.0.0.1:1"],
     "--ray-address"),
    ("recorded ray address that does not answer", config_with(executor="ray", ray_address="127.0.0.1:1"), [],
     "--ray-address"),
    # refused as a flag, once accepted as a record: the same rule for both
    ("recorded momentum with adam", config_with(momentum=[0.5]), [],
     "--momentum applies to --optimizer sgd only (here --optimizer adam)"),
    ("recorded slurm option with a line break",
     config_with(executor="slurm", slurm_local=True, slurm_option=["qos=short\ntouch PWNED"]), [], "--slurm-option"),
    ("recorded sigma nan", config_with(sigmas=[float("nan")]), [], "--sigmas"),
    ("recorded sigma 1e300", config_with(sigmas=[1e300]), [], "--sigmas"),
    ("recorded lr beyond float32", config_with(lr=[1e308]), [], "--lr 1e+308 lies beyond float32's range"),
    ("recorded seeds beyond the grid limit", config_with(seeds=300000), [], "--seeds"),
    ("recorded seeds unlike the packs", config_with(seeds=2), [], "packs"),
    ("recorded task unknown", config_with(task="bogus"), [], "--task"),
    ("recorded packs naming no model", config_packs([[999]]), [], "packs"),
    ("recorded packs not lists", config_packs("all"), [], "packs"),
    ("recorded backend unknown", config_with(backend="nosuch"), [], "--backend"),
    *[(f"recorded backend {path} without its device", config_with(backend=path), [], "--backend")
      for path in PATHS_NOT_ON_CPU],
    ("recorded seed value not an integer", config_with(seed_values=[1.5], seeds=1), [], "--seed-values"),
    ("recorded steps beyond what can finish", config_with(steps=10**30), [], "--steps"),
    ("recorded width beyond any model", config_with(width=10**9), [], "--width"),
    ("recorded max pack beyond float's range", config_with(max_pack=-10**400), [], "--max-pack"),
    ("recorded nodes beyond any network", config_with(nodes=10**9), [], "--nodes"),
    ("recorded threads beyond the machine's cores", config_with(threads=100000), [], "--threads"),
    ("config a folder", config_a_folder, [], "config.json"),
    # a FIFO blocked the resume until a writer came; /dev/zero was read until memory ran out
    ("config a FIFO", config_a_fifo, [], "config.json is not a regular file"),
    ("config a link to /dev/zero", config_a_link_to("/dev/zero"), [], "config.json is not a regular file"),
    # which of the two would count? JSON leaves it open, Python's reader took the last
    ("config naming a setting twice", config_with_a_key_twice, [], "names 'steps' twice"),
    # no pe_fast wrote it: dropped as an older version's setting, it hid a tampered or foreign file
    ("config with a setting no pe_fast writes", config_with(stepz=50), [], "unknown setting 'stepz'"),
    ("checkpoint without its keys", checkpoint_without_keys, [], "lacks"),
    # loaded as given, each once trained on: a fused AdamW wrote past a moment of another shape (glibc abort), a
    # schedule or betas edited trained at other rates than the results record, an RNG or sampler state of another
    # size or place ended in a traceback
    ("checkpoint optimizer moment of another size", trained_checkpoint_edited(
        set_in("optimizer.state.0.exp_avg", torch.zeros(3))), [], "optimizer.state.0.exp_avg of (3,)"),
    ("checkpoint optimizer moment one wider", trained_checkpoint_edited(
        set_in("optimizer.state.2.exp_avg_sq", lambda t: torch.zeros(*t.shape[:-1], t.shape[-1] + 1))), [],
     "optimizer.state.2.exp_avg_sq"),
    # NaN passed "≥ 0", and the model trained to NaN from it
    ("checkpoint second moment NaN beside a finite weight", trained_checkpoint_edited(
        set_in("optimizer.state.0.exp_avg_sq", lambda t: t.index_fill(-1, torch.tensor([0]), float("nan")))), [],
     "optimizer.state.0.exp_avg_sq not finite where its weight is"),
    ("checkpoint momentum infinite beside a finite weight", trained_checkpoint_edited(
        set_in("optimizer.state.1.exp_avg", lambda t: t.index_fill(-1, torch.tensor([0]), float("inf")))), [],
     "optimizer.state.1.exp_avg not finite where its weight is"),
    ("checkpoint optimizer betas", trained_checkpoint_edited(set_in("optimizer.param_groups.0.betas", (5.0, -3.0))),
     [], "optimizer betas (5.0, -3.0)"),
    ("checkpoint optimizer lr", trained_checkpoint_edited(set_in("optimizer.param_groups.0.lr", 50.0)), [],
     "optimizer lr 50.0 at step 2"),
    ("checkpoint schedule base rates", trained_checkpoint_edited(set_in("scheduler.base_lrs", [50.0])), [],
     "a schedule of base rates [50.0]"),
    ("checkpoint schedule step text", trained_checkpoint_edited(set_in("scheduler.last_epoch", "x")), [],
     "scheduler.last_epoch a str"),
    ("checkpoint RNG state of another size", trained_checkpoint_edited(
        set_in("torch_rng", torch.zeros(7, dtype=torch.uint8))), [], "torch_rng of (7,)"),
    ("checkpoint sampler before its start", trained_checkpoint_edited(set_in("sampler.position", -10**6)), [],
     "a batch sampler at batch -1000000"),
    ("checkpoint tangent kernel state of another form", trained_checkpoint_edited(set_in("tangent_kernel", [1])), [],
     "a tangent kernel probe's state of another form"),
    ("checkpoint tangent kernels of no kind", trained_checkpoint_edited(
        set_in("tangent_kernel.previous", {"step": 2, "kernels": {}})), [], "tangent kernels of another pack or step"),
    # round 9: values of the right structure that no training leaves (tracebacks, or a training other than recorded)
    ("checkpoint schedule function state", trained_checkpoint_edited(set_in("scheduler.lr_lambdas", [5])), [],
     "scheduler.lr_lambdas[0] a int, where this pack's holds None"),
    ("checkpoint schedule count", trained_checkpoint_edited(set_in("scheduler._step_count", -7)), [],
     "a schedule counting -7 steps"),
    ("checkpoint RNG state of no generator", trained_checkpoint_edited(set_in("torch_rng", lambda t: t.fill_(7))),
     [], "torch_rng: not a random-number generator's state"),
    ("checkpoint sampler generator of no generator", trained_checkpoint_edited(
        set_in("sampler.generators.0", lambda t: t.fill_(255))), [], "sampler.generators[0]: not a random-number"),
    ("checkpoint sampler epoch not a permutation", trained_checkpoint_edited(
        set_in("sampler.epoch", torch.zeros_like)), [], "with an epoch of"),
    ("checkpoint window statistics of other sizes", trained_checkpoint_edited(
        set_in("stats_buffer", torch.zeros(2, 7, 1, 3, 2))), [], "stats_buffer of (2, 7, 1, 3, 2)"),
    ("checkpoint loss window of integers", trained_checkpoint_edited(
        set_in("loss_buffer", lambda t: t.to(torch.int64))), [], "loss_buffer of (2, 1) torch.int64"),
    ("checkpoint curves row without its step", trained_checkpoint_edited(
        lambda state: state["curves"].append({"model": 0})), [], "a curves row without its step"),
    ("checkpoint Adam step count negative", trained_checkpoint_edited(
        set_in("optimizer.state.0.step", torch.tensor(-5.0))), [], "optimizer.state.0.step -5"),
    ("checkpoint second moments negative", trained_checkpoint_edited(
        set_in("optimizer.state.0.exp_avg_sq", lambda t: t.fill_(-1.0))), [], "exp_avg_sq below 0"),
    ("checkpoint optimizer moments removed", trained_checkpoint_edited(set_in("optimizer.state", {})), [],
     "optimizer.state holding"),
    ("checkpoint weights in float64", trained_checkpoint_edited(
        lambda state: state.update(model={k: v.double() for k, v in state["model"].items()})), [],
     "torch.float64, the pack's"),
    ("checkpoint weights with a tensor the model lacks", trained_checkpoint_edited(
        set_in("model.extra", torch.zeros(1))), [], "(extra is a tensor, the pack's none)"),
    ("checkpoint initial PE in float64", trained_checkpoint_edited(
        lambda state: state.update(initial_pe=[t.double() for t in state["initial_pe"]])), [],
     "the initial PE of other models"),
    ("checkpoint training time a bool", trained_checkpoint_edited(set_in("seconds", True)), [], "seconds True"),
    ("checkpoint sampler epoch of another shape", trained_checkpoint_edited(
        set_in("sampler.epoch", torch.zeros(1, 3, dtype=torch.long))), [], "an epoch of (1, 3)"),
    ("checkpoint a folder", checkpoint_a_folder, [], "0.checkpoint.pt is not a file"),
    # round 18: compared by shape and dtype alone, these failed in the copy, the comparisons, or mid-training
    ("checkpoint model key not a name", trained_checkpoint_edited(
        set_in("model", lambda m: {**m, 5: m["embed.weight"]})), [], "its model holds a key '5', not a tensor's name"),
    ("checkpoint model tensor under its old name too", trained_checkpoint_edited(
        set_in("model", lambda m: {**m, "blocks.0.w_qkv": torch.zeros_like(m["blocks.0.attention.w_qkv"])})), [],
     "its model holds blocks.0.attention.w_qkv twice"),
    ("checkpoint initial PE not a list", trained_checkpoint_edited(set_in("initial_pe", 5)), [],
     "its initial_pe is a int, not a list"),
    ("checkpoint loss window sparse", trained_checkpoint_edited(set_in("loss_buffer", lambda t: t.to_sparse())), [],
     "holds a torch.sparse_coo tensor"),
    ("checkpoint loss window on meta", trained_checkpoint_edited(set_in("loss_buffer", lambda t: t.to("meta"))), [],
     "holds a meta tensor"),
    ("checkpoint loss window taking a gradient", trained_checkpoint_edited(
        set_in("loss_buffer", lambda t: t.float().requires_grad_())), [], "holds a gradient-taking tensor"),
    ("resumed with --threads 0", None, ["--threads", "0"], "--threads"),  # 0 == False: once taken as not given
    ("lock a FIFO", lock_a_fifo, [], ".lock is not a lock a sweep wrote"),  # read, it would block the sweep for ever
    ("lock a JSON list", lock_text("[1, 2]"), [], ".lock is not a lock a sweep wrote"),
    ("lock pid too large for os.kill", lock_text(json.dumps({"pid": 2**70, "host": socket.gethostname()})), [],
     ".lock is not a lock a sweep wrote"),
    ("lock pid a bool", lock_text(json.dumps({"pid": True, "host": socket.gethostname()})), [],
     ".lock is not a lock a sweep wrote"),
    ("lock nested deeper than the parser goes", lock_text("[" * 2000 + "]" * 2000), [],
     ".lock is not a lock a sweep wrote"),
    # round 16: a link to a live-looking lock outside the folder was read through; the message named no way out
    ("lock a link out of the folder", lock_linked_out, [], "if no sweep is writing"),
    ("packs a link out of the folder", link_out("packs"), [], "outside"),
    # each once trained first, then failed writing the pack as if the disk had (exit 1)
    ("packs a file", packs_a_file, [], "packs is not a folder"),
    ("pack 0 a FIFO", pack_a_fifo, [], "packs/0 is not a folder"),
]


def test_a_stale_lock_taken_over_is_named_on_one_line_with_its_text_escaped(tmp_path):
    """The note on taking over a dead sweep's lock printed the lock's text raw: a line break in its `started`
    split the note in two and a terminal escape reached the terminal (round 16)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(),
                                                "started": "x\nSECOND\u001b[31mRED"}))
    notes = []
    run_folder.acquire_lock(tmp_path, notes.append)
    assert notes == [f"taking over the stale lock of pid {dead.pid} on {socket.gethostname()}, started "
                     f"x\\nSECOND\\x1b[31mRED, which is no longer running"]
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()


@pytest.fixture
def no_lock(monkeypatch):
    """A refused --resume takes no lock and makes no probe: the checks of what it found are read only, done before
    DIR/.lock and the write probe are made (a tampered folder once saw both come and go before the refusal)."""
    def refuse(*args, **kwargs):
        raise AssertionError("the refused resume wrote in the folder (its lock or the write probe)")
    monkeypatch.setattr(run_folder, "acquire_lock", refuse)
    monkeypatch.setattr(run_folder, "check_writable", refuse)


@pytest.mark.parametrize("spoil, flags, must_name", [c[1:] for c in RESUME_CASES], ids=[c[0] for c in RESUME_CASES])
def test_bad_resume(spoil, flags, must_name, unfinished, tmp_path, capsys, monkeypatch, no_lock):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    if spoil is not None:
        spoil(folder)
    before, beside = snapshot(folder), snapshot(tmp_path)
    assert_one_line(capsys, sweep_main(["--resume", "--out", str(folder), *flags]), must_name)
    assert snapshot(folder) == before
    assert snapshot(tmp_path) == beside  # nothing written beside the folder either (through a link)
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("spoil, flags, must_name", [
    (None, ["--compile", "graphs"], "--compile graphs: CUDA graphs need a CUDA device"),
    (None, ["--ray-address", "127.0.0.1:1"], "--ray-address applies to --executor ray only"),
    # the record at fault, and a flag beside it that is not
    (config_with(device="cuda"), ["--threads", "1"], "config.json: --device 'cuda' is not available here"),
], ids=["compile graphs", "ray address without ray", "the record at fault"])
def test_a_runtime_flag_given_with_resume_is_blamed_not_config(spoil, flags, must_name, unfinished, tmp_path,
                                                                capsys, no_lock):
    """A runtime flag given with --resume that breaks a rule is the flag's fault: the line does not send the user
    to config.json, which they did not write; a record at fault still names config.json."""
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    if spoil is not None:
        spoil(folder)
    before = snapshot(folder)
    code = sweep_main(["--resume", "--out", str(folder), *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and must_name in err, err
    assert ("config.json" in err) == ("config.json" in must_name), err
    assert snapshot(folder) == before


def test_a_checkpoint_of_expanded_or_shared_tensors_resumes(unfinished, tmp_path):
    """torch.save keeps a tensor's view: an optimizer moment expanded from one number (stride 0), or two moments
    sharing one storage, went into the optimizer as given, whose in-place update then raised a traceback (or moved
    both as one). Each tensor is loaded into its own storage."""
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)

    def views(state):
        moments = state["optimizer"]["state"]
        moments[0]["exp_avg"] = torch.zeros(1).expand(moments[0]["exp_avg"].shape)
        moments[1]["exp_avg"] = moments[1]["exp_avg_sq"]
    trained_checkpoint_edited(views)(folder)
    state = run_folder.load_checkpoint(folder, 0)
    tensors = torch.utils._pytree.tree_leaves(state)
    tensors = [leaf for leaf in tensors if isinstance(leaf, torch.Tensor)]
    assert all(t.is_contiguous() for t in tensors)
    assert len({t.untyped_storage().data_ptr() for t in tensors if t.numel()}) == sum(1 for t in tensors if t.numel())
    assert resume_in_process(folder) == 0


@pytest.mark.parametrize("inside", ["packs", "packs/0"])
def test_resume_of_a_sweep_s_packs_names_the_sweep(inside, unfinished, tmp_path, capsys, no_lock):
    """--resume --out DIR/packs was told to start a new sweep there, which is then refused inside DIR."""
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    (folder / "packs" / "0").mkdir(exist_ok=True)
    assert_one_line(capsys, sweep_main(["--resume", "--out", str(folder / inside)]),
                    f"holds packs of the sweep {folder.resolve()}; resume that folder")


def test_a_relative_compiler_cache_under_a_folder_with_a_space_is_refused(tmp_path, capsys, monkeypatch):
    """Checked as given ("cache"), it passed; torch compiles under its absolute path, which the space split."""
    (tmp_path / "a b").mkdir()
    monkeypatch.chdir(tmp_path / "a b")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "cache")
    assert_one_line(capsys, sweep_main(LST + ["--out", "run"]), "holds a space, a line break")
    assert list((tmp_path / "a b").iterdir()) == []


@pytest.mark.parametrize("flags", [[], ["--ntk-items", "4"], ["--optimizer", "sgd", "--momentum", "0.5"],
                                   ["--lr", "1e-3,2e-3", "--schedule", "cosine", "--warmup", "1"],
                                   ["--lr", "1e-3,1e30"],
                                   ["--optimizer", "sgd", "--momentum", "0.5", "--lr", "1e-3,1e30"]],
                         ids=["default", "tangent kernel probe", "sgd", "stacked optimizer", "diverged",
                              "diverged sgd"])
def test_an_untouched_trained_checkpoint_resumes_as_its_pack_leaves_it(flags, tmp_path):
    """The checks of a checkpoint's optimizer, schedule, sampler and RNG states pass what training leaves."""
    folder = tmp_path / "run"
    threads = torch.get_num_threads()
    try:
        assert sweep_main(NETSIM + flags + ["--threads", "1", "--out", str(folder)]) == 0
        for name in ("results.parquet", "curves.parquet", "pe_tables.npz", "summary.txt", "digests.json"):
            (folder / name).unlink()
        shutil.rmtree(folder / "packs")
        (folder / "packs").mkdir()
        trained_checkpoint_edited(lambda state: None)(folder)
        weights = run_folder.load_checkpoint(folder, 0)["model"].values()
        # a model that diverged leaves weights and moments not finite, together
        diverged = "1e-3,1e30" in flags
        assert diverged == any(not bool(w.isfinite().all()) for w in weights if w.is_floating_point())
        assert resume_in_process(folder) == 0
    finally:
        torch.set_num_threads(threads)
    assert (folder / "packs" / "0" / "results.parquet").is_file()


def as_another_torch_writes_it(state):
    """The options torch adds or drops between versions: a group's and a schedule's."""
    for group in state["optimizer"]["param_groups"]:
        group.pop("decoupled_weight_decay", None)
        group["an_option_of_a_later_torch"] = True
    state["scheduler"].pop("_is_initial", None)
    state["scheduler"]["_a_later_counter"] = 0


def test_a_checkpoint_of_another_torch_version_resumes(tmp_path):
    """Checked on the options both torch versions know, as torch's load_state_dict takes them (a GPU's image runs
    another torch than a laptop)."""
    folder = tmp_path / "run"
    threads = torch.get_num_threads()
    try:
        assert sweep_main(NETSIM + ["--threads", "1", "--out", str(folder)]) == 0
        for name in ("results.parquet", "curves.parquet", "pe_tables.npz", "summary.txt", "digests.json"):
            (folder / name).unlink()
        shutil.rmtree(folder / "packs")
        (folder / "packs").mkdir()
        trained_checkpoint_edited(as_another_torch_writes_it)(folder)
        assert resume_in_process(folder) == 0
    finally:
        torch.set_num_threads(threads)


RESUME_FLAG_CASES = [
    (["--threads", "0"], "--threads must be finite and ≥ 1"),
    (["--checkpoint-every", "0"], "--checkpoint-every"),
    (["--device", "tpu"], "--device"),
]


@pytest.mark.parametrize("flags, message", RESUME_FLAG_CASES, ids=[" ".join(c[0]) for c in RESUME_FLAG_CASES])
def test_a_bad_flag_given_with_resume_is_the_flags_fault(flags, message, unfinished, tmp_path, capsys, no_lock):
    """A runtime flag given with --resume is checked alone: its error names the flag, not config.json (--threads 0
    once read "--resume: run/config.json: --threads must be ...", blaming a record that holds 1)."""
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    code = sweep_main(["--resume", "--out", str(folder), *flags])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert message in err and "config.json" not in err, err


@pytest.mark.parametrize("value", [4.0, "4", True])
def test_resume_from_python_takes_a_repeated_setting_of_its_type_only(value, unfinished, tmp_path, no_lock):
    """run(resume=True, steps=...) holds a repeated setting to its type, as run() without resume does: steps=4.0
    was taken as the recorded 4, and steps="4" refused as "--steps 4 differs from its 4"."""
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    with pytest.raises(UsageError, match=f"--steps: expected int, got {re.escape(repr(value))}"):
        pe_fast.sweep.run(resume=True, out=str(folder), steps=value)


def test_a_refused_record_is_refused_before_the_inductor_cache_is_probed(unfinished, tmp_path, capsys, monkeypatch):
    """The probe of $TORCHINDUCTOR_CACHE_DIR (a folder made and removed) comes after every rule of the settings: with
    the variable naming the resumed folder, a record refused for its packs once saw the probe made there first."""
    from pe_fast.sweep import runtime
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    config_packs([[0], [0]])(folder)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder))

    def probe(*args, **kwargs):
        raise AssertionError("the inductor cache was probed before the record's refusal")
    monkeypatch.setattr(runtime.tempfile, "TemporaryDirectory", probe)
    assert_one_line(capsys, sweep_main(["--resume", "--out", str(folder)]), "packs")


# Every setting of the netsim folder's config.json (the record's and the task's own), tampered: a value of the wrong
# type, and (for text) a line break. Not read on --resume: the packs (config.json's own key, above), out (the folder
# itself) and compile (chosen anew).
FIELDS = [(f.name, str(f.type)) for f in dataclasses.fields(Settings)
          if f.name not in ("packs", "out", "compile", "task_settings")]
FIELDS += [(setting.name, setting.type.__name__) for setting in KINDS["netsim"].settings]
TEXT_FIELDS = [name for name, kind in FIELDS if "str" in kind and "tuple" not in kind]


@pytest.mark.parametrize("name", [name for name, _ in FIELDS])
def test_resume_refuses_any_setting_of_a_wrong_type(name, unfinished, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    config_with(**{name: {"not": "a setting"}})(folder)
    before = snapshot(folder)
    assert_one_line(capsys, sweep_main(["--resume", "--out", str(folder)]), f"--{name.replace('_', '-')}")
    assert snapshot(folder) == before


@pytest.mark.parametrize("name", [name for name, _ in FIELDS])
def test_the_report_refuses_a_folder_with_any_setting_of_a_wrong_type(name, unfinished, tmp_path, capsys):
    """The report (and load_run) read config.json as --resume does: each setting of its type, or one line naming
    it, before any figure is drawn (a recorded "steps": "twenty" once crashed the report after its figures)."""
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    config_with(**{name: {"not": "a setting"}})(folder)
    before = snapshot(folder)
    assert_one_line(capsys, report_main([str(folder)]), f"--{name.replace('_', '-')}")
    assert snapshot(folder) == before


# the rules across settings that --resume applies to a record, which the readers once skipped
RECORD_RULES = [
    (dict(nodes=3000, timepoints=100_000), "--nodes 3000"),  # each in range; the simulation hours long
    (dict(slurm_account="lab\n# INJECTED"), "--slurm-account 'lab\\n# INJECTED': holds a control character"),
    (dict(slurm_partition="gpu"), "--slurm-partition applies to --executor slurm only"),  # the record's is local
    (dict(executor="slurm", slurm_option=["time=5"]), "--slurm-option 'time=5': pe_fast sets time itself"),
]


@pytest.mark.parametrize("settings, must_name", RECORD_RULES, ids=["netsim too large to simulate", "a line break",
                                                                   "slurm flag of another executor",
                                                                   "slurm option pe_fast sets"])
def test_the_readers_apply_the_rules_resume_applies_to_a_record(settings, must_name, unfinished, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    config_with(**settings)(folder)
    before = snapshot(folder)
    assert_one_line(capsys, sweep_main(["--resume", "--out", str(folder)]), must_name)
    assert_one_line(capsys, report_main([str(folder)]), must_name)
    assert snapshot(folder) == before
    import pe_fast
    with pytest.raises(ValueError, match=re.escape(must_name)):
        pe_fast.load_run(folder)


def test_the_readers_refuse_a_recorded_compile_mode_its_device_cannot_run(unfinished, tmp_path, capsys):
    """A sweep records the --compile mode it ran; CUDA graphs on the CPU never ran (--resume chooses the mode anew
    and is not asked)."""
    import pe_fast
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    config_with(compile="graphs", device="cpu")(folder)
    assert_one_line(capsys, report_main([str(folder)]), "--compile graphs: CUDA graphs need a CUDA device")
    with pytest.raises(ValueError, match="--compile graphs: CUDA graphs need a CUDA device, not cpu"):
        pe_fast.load_run(folder)
    config_with(compile="graphs", device="cuda")(folder)  # a GPU sweep's record, read on this machine
    assert "CUDA" not in str(pytest.raises(ValueError, pe_fast.load_run, folder).value)  # no results yet, only


@pytest.mark.parametrize("settings", [{"steps": "twenty"}, {"sigmas": "abc"}, {"seeds": "x"},
                                      {"sigmas": [float("inf")]}, {"lr": [float("nan")]}])
def test_load_run_refuses_a_setting_of_a_wrong_type_as_a_value_error(settings, unfinished, tmp_path):
    import pe_fast
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    config_with(**settings)(folder)
    with pytest.raises(ValueError, match=f"config.json has settings this pe_fast cannot read .*--{next(iter(settings))}"):
        pe_fast.load_run(folder)


# Every setting with a range (the record's and netsim's own), one below its lowest value as config.json records it
RANGED = {name: flag.range[0] for name, flag in FLAGS.items() if flag.range}
RANGED.update({setting.name: setting.range[0] for setting in KINDS["netsim"].settings if setting.range})


def below_range(name: str):
    value = RANGED[name] - 1
    return [value] if name in LIST_SETTINGS else value


@pytest.mark.parametrize("name", sorted(RANGED))
def test_a_recorded_setting_out_of_its_range_is_refused_by_resume_report_and_load_run(name, unfinished, tmp_path,
                                                                                     capsys):
    """config.json is read by one rule whoever reads it: a value --resume refuses (eval_every 0 once passed the
    report and load_run), the report and load_run refuse too, naming the setting."""
    import pe_fast
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    config_with(**{name: below_range(name)})(folder)
    before = snapshot(folder)
    flag = f"--{name.replace('_', '-')}"
    assert_one_line(capsys, sweep_main(["--resume", "--out", str(folder)]), flag)
    assert_one_line(capsys, report_main([str(folder)]), flag)
    with pytest.raises(ValueError, match=flag):
        pe_fast.load_run(folder)
    assert snapshot(folder) == before


@pytest.mark.parametrize("change, must_name", [(config_with(steps=2**64), "--steps"),
                                               (config_with(sigmas=[0.0]), "--sigmas"),
                                               (config_packs([[0], [0]]), "packs"),
                                               (config_packs([[0], []]), "packs"),
                                               (config_with(lr=[]), "--lr: empty list"),
                                               (config_with(sigmas=[]), "--sigmas: empty list"),
                                               # the report's configuration table read it as a mapping
                                               (config_part("task", 5), "its 'task' is a JSON int"),
                                               # a netsim sweep's record describing another task's data
                                               (config_part("task", {"task": "fmri"}), "task 'fmri'"),
                                               (config_part("models", {"0": 1}), "its 'models' is a JSON dict"),
                                               (config_part("time", ["now"]), "its 'time' is a JSON list"),
                                               # text the report shows, and a part no sweep writes (held-out round)
                                               (config_part("time", "garbage"), "its 'time' is 'garbage', not the"),
                                               (config_part("torch", "<b>2</b>"), "its 'torch' is '<b>2</b>', not the"),
                                               (config_part("evil", 1), "its part 'evil' is not one a sweep writes")])
def test_a_recorded_value_resume_refuses_the_report_refuses_too(change, must_name, unfinished, tmp_path, capsys):
    import pe_fast
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    change(folder)
    assert_one_line(capsys, sweep_main(["--resume", "--out", str(folder)]), must_name)
    assert_one_line(capsys, report_main([str(folder)]), must_name)
    with pytest.raises(ValueError, match=must_name):
        pe_fast.load_run(folder)


@pytest.mark.parametrize("name", TEXT_FIELDS)
def test_resume_refuses_a_line_break_in_any_text_setting(name, unfinished, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    config_with(**{name: "x\ntouch PWNED"})(folder)
    before = snapshot(folder)
    assert_one_line(capsys, sweep_main(["--resume", "--out", str(folder)]), f"--{name.replace('_', '-')}")
    assert snapshot(folder) == before


@pytest.mark.parametrize("name", ["packs/0.checkpoint.pt", "slurm", "figures", "tensorboard"])
def test_resume_refuses_a_link_out_of_the_folder_anywhere(name, unfinished, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (folder / name).symlink_to(elsewhere)
    before, beside = snapshot(folder), snapshot(tmp_path)
    assert_one_line(capsys, sweep_main(["--resume", "--out", str(folder)]), f"{name} is a link")
    assert snapshot(folder) == before and snapshot(tmp_path) == beside


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


def tiny_trainer():
    from pe_fast.sweep import grid
    from pe_fast.sweep.task_loading import load_task
    from pe_fast.train import PackTrainer
    from sweep_harness import settings_of
    s = settings_of(*NETSIM)
    task = load_task(s)
    pack = grid.expand_grid(s)
    return PackTrainer(task, grid.model_config(s, task, "learned"), grid.train_config(s, pack), [0], [0.5],
                       torch.device("cpu"))


def test_an_evaluation_window_longer_than_the_steps_takes_no_more_memory_than_the_steps():
    """--eval-every past --steps (a preset's, with a short --steps) evaluates at the last step: the window's
    buffers hold the steps there can be, not --eval-every rows (10^8 of them took GBs)."""
    from pe_fast.sweep import grid
    from pe_fast.sweep.task_loading import load_task
    from pe_fast.train import PackTrainer
    from sweep_harness import settings_of
    s = settings_of(*without(NETSIM, "--eval-every"), "--eval-every", "100000000")
    trainer = PackTrainer(load_task(s), grid.model_config(s, load_task(s), "learned"),
                          grid.train_config(s, grid.expand_grid(s)), [0], [0.5], torch.device("cpu"))
    assert trainer.loss_buffer.shape[0] == s.steps == 4


def test_a_checkpoint_holds_exactly_the_keys_the_check_asks_for():
    from pe_fast.train import PackTrainer
    assert tuple(tiny_trainer().state_dict()) == PackTrainer.STATE_KEYS


def resume_in_process(folder: Path) -> int:
    threads = torch.get_num_threads()
    try:
        return sweep_main(["--resume", "--out", str(folder)])
    finally:
        torch.set_num_threads(threads)


def test_a_result_file_that_does_not_parse_is_not_finished(unfinished, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    (folder / "results.parquet").write_bytes(b"not a table")
    (folder / "packs" / "0").mkdir()
    (folder / "packs" / "0" / "results.parquet").write_bytes(b"not a table")
    assert resume_in_process(folder) == 0
    assert (pd.read_parquet(folder / "results.parquet")["pack"] == 0).sum() == 1
    assert len(pd.read_parquet(folder / "packs" / "0" / "results.parquet")) == 1


def test_a_full_disk_is_one_line_and_resume_continues(unfinished, tmp_path, capsys, monkeypatch):
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)

    def full(out, index, *args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "packs"))
    monkeypatch.setattr(run_folder, "write_pack", full)
    code = resume_in_process(folder)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error")]
    assert code == 1 and "Traceback" not in err, err
    assert len(lines) == 1 and str(folder) in lines[0] and "--resume" in lines[0], err
    monkeypatch.undo()
    assert resume_in_process(folder) == 0
    assert (pd.read_parquet(folder / "results.parquet")["pack"] == 0).sum() == 1


@pytest.fixture(scope="module")
def half_finished_netsim(tmp_path_factory):
    """A netsim sweep of two packs stopped after its first, with the ground truth it wrote at its start."""
    out = tmp_path_factory.mktemp("sweep") / "run"
    threads = torch.get_num_threads()
    try:
        assert sweep_main([*without(NETSIM, "--sigmas"), "--sigmas", "0.5,1", "--max-pack", "1", "--threads", "1",
                           "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    for name in ("results.parquet", "curves.parquet", "pe_tables.npz", "summary.txt", "digests.json"):
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "packs" / "1")
    return out


def tamper_pe_tables(pack: Path):
    np.savez(pack / "pe_tables.npz", model_0=np.array([{"a": 1}], dtype=object))


def tamper_seed_as_text(pack: Path):
    results = pd.read_parquet(pack / "results.parquet")
    results.assign(seed=results["seed"].astype(str)).to_parquet(pack / "results.parquet")


def tamper_r2_of_5(pack: Path):
    """An R² of 5 in the results and in the curve's last row alike (the readers refuse it; --resume took it)."""
    results, curves = pd.read_parquet(pack / "results.parquet"), pd.read_parquet(pack / "curves.parquet")
    results["test_r2"] = 5.0
    curves.loc[curves["step"] == curves["step"].max(), "test_r2"] = 5.0
    results.to_parquet(pack / "results.parquet")
    curves.to_parquet(pack / "curves.parquet")


def tamper_step_off_the_evaluations(pack: Path):
    """A curve's evaluation at step 1 of an --eval-every 2 sweep: no sweep evaluated there."""
    curves = pd.read_parquet(pack / "curves.parquet")
    curves.loc[curves["step"] == 2, "step"] = 1
    curves.to_parquet(pack / "curves.parquet")


@pytest.mark.parametrize("tamper, must_name", [
    (lambda pack: (pack / "curves.parquet").write_bytes(os.urandom(5000)), "curves.parquet is not a readable parquet"),
    (tamper_r2_of_5, "results column test_r2 holds 5.0, an R² above 1"),
    (tamper_step_off_the_evaluations, "curves column step holds 1, no evaluation's (every 2)"),
    (tamper_pe_tables, "pe_tables.npz is not a readable .npz file"),
    (tamper_seed_as_text, "column 'seed' is stored as"),
], ids=["curves random bytes", "an R² of 5", "a step off the evaluations", "pe tables of objects",
        "seed stored as text"])
def test_a_tampered_finished_pack_stops_the_resume_before_any_training(tamper, must_name, half_finished_netsim,
                                                                        tmp_path, capsys, no_lock):
    folder = tmp_path / "run"
    shutil.copytree(half_finished_netsim, folder)
    tamper(folder / "packs" / "0")
    before = snapshot(folder)
    assert_one_line(capsys, resume_in_process(folder), must_name)
    assert snapshot(folder) == before  # pack 1 not trained, nothing written


def test_a_ground_truth_edited_in_a_half_finished_folder_stops_the_resume(half_finished_netsim, tmp_path, capsys,
                                                                          no_lock):
    """ground_truth.npz is written at the start and recorded in digests.json only at the end: --resume compares it
    with the task's own (it once finished the sweep and recorded the edited file as genuine)."""
    folder = tmp_path / "run"
    shutil.copytree(half_finished_netsim, folder)
    with np.load(folder / "ground_truth.npz") as stored:
        truth = {key: stored[key] for key in stored.files}
    truth["fc"] = np.eye(len(truth["fc"])) * 0.5 + 0.25
    np.savez(folder / "ground_truth.npz", **truth)
    before = snapshot(folder)
    assert_one_line(capsys, resume_in_process(folder), "changed since the sweep started: its ground truth is not the "
                                                       "one")
    assert snapshot(folder) == before


@pytest.fixture
def half_finished_lst_of_a_file(tmp_path):
    """An LST sweep of two packs trained on a puzzle file of the user's, stopped after its first pack."""
    puzzles = tmp_path / "train.csv"
    shutil.copy(DEFAULT_SET_FILE, puzzles)  # any puzzle file
    folder = tmp_path / "run"
    threads = torch.get_num_threads()
    try:
        assert sweep_main([*without(LST, "--sigmas"), "--sigmas", "0.5,1", "--max-pack", "1", "--threads", "1",
                           "--lst-train", str(puzzles), "--out", str(folder)]) == 0
    finally:
        torch.set_num_threads(threads)
    for name in ("results.parquet", "curves.parquet", "pe_tables.npz", "summary.txt", "digests.json"):
        (folder / name).unlink()
    shutil.rmtree(folder / "packs" / "1")
    return folder, puzzles


def test_data_changed_since_a_sweep_started_stops_its_resume(half_finished_lst_of_a_file, capsys, no_lock):
    """--resume loads the task again from the files config.json names: one that changed since the start (here
    fewer training puzzles) would train the packs left on other data than the finished ones."""
    folder, puzzles = half_finished_lst_of_a_file
    puzzles.write_text("".join(puzzles.read_text().splitlines(keepends=True)[:301]))
    before = snapshot(folder)
    assert_one_line(capsys, resume_in_process(folder), "the task's data changed since the sweep started")
    assert snapshot(folder) == before


def test_a_task_source_elsewhere_still_resumes(half_finished_lst_of_a_file):
    """The task's sources (a path, a package's version) are not its data: pe_fast reinstalled in another place, its
    puzzle folder at another path in config.json, resumes."""
    folder, _ = half_finished_lst_of_a_file
    config = json.loads((folder / "config.json").read_text())
    config["task"]["pool_source"] = "/elsewhere/site-packages/pe_fast/data/lst_authors"
    (folder / "config.json").write_text(json.dumps(config))
    assert resume_in_process(folder) == 0
    assert (folder / "packs" / "1" / "results.parquet").is_file()


def test_a_disk_that_fills_during_a_checkpoint_is_one_line(tmp_path, capsys, monkeypatch):
    """The checkpoint is written as every other file is, so a full disk there is the same one line."""
    write_atomic = run_folder.write_atomic

    def full_for_checkpoints(path, write, under=None):
        def disk_full(file):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return write_atomic(path, disk_full if ".checkpoint.pt" in path.name else write, under)
    monkeypatch.setattr(run_folder, "write_atomic", full_for_checkpoints)
    threads = torch.get_num_threads()
    try:
        code = sweep_main([*NETSIM, "--checkpoint-every", "2", "--out", str(tmp_path / "run")])
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error")]
    assert code == 1 and "Traceback" not in err, err
    assert len(lines) == 1 and os.strerror(errno.ENOSPC) in lines[0] and "--resume" in lines[0], err


def test_two_sweeps_on_one_new_folder_exactly_one_proceeds(tmp_path):
    """The folder check repeats under the lock: of a netsim and an LST sweep started at once on one new --out,
    one trains and the other stops with one line, and the folder holds one sweep's files only."""
    out = tmp_path / "run"
    sweeps = [start_sweep(*flags, "--threads", "1", "--out", str(out)) for flags in (NETSIM, LST)]
    outcomes = [(sweep.wait(timeout=600), sweep.stderr.read()) for sweep in sweeps]
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 2], outcomes
    refused = next(err for code, err in outcomes if code == 2)
    assert len(refused.strip().splitlines()) == 1 and str(out) in refused, refused
    config = json.loads((out / "config.json").read_text())
    assert set(pd.read_parquet(out / "results.parquet")["task"]) == {config["settings"]["task"]}


def test_a_recorded_job_of_another_process_is_not_waited_for(unfinished, tmp_path):
    """slurm/jobs.json naming pid 1 (alive, not a job of this sweep) for pack 0: the resumed driver submits the
    pack anew instead of waiting for pid 1 for ever."""
    pytest.importorskip("submitit")
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    config_with(executor="slurm", slurm_local=True)(folder)
    (folder / "slurm").mkdir()
    (folder / "slurm" / "jobs.json").write_text(json.dumps({"0": "1"}))
    (folder / "slurm" / "1_submitted.pkl").write_bytes(b"")  # even with a submission file of that id
    done = run_sweep("--resume", "--out", str(folder), timeout=300)
    assert done.returncode == 0, done.stderr
    assert "1 pack jobs submitted" in done.stderr, done.stderr


@pytest.mark.parametrize("text", ["{broken", json.dumps({"0": "1; touch PWNED"}), "[1]"])
def test_a_malformed_jobs_file_is_one_line(text, unfinished, tmp_path, capsys):
    pytest.importorskip("submitit")
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    config_with(executor="slurm", slurm_local=True)(folder)
    (folder / "slurm").mkdir()
    (folder / "slurm" / "jobs.json").write_text(text)
    assert_one_line(capsys, resume_in_process(folder), "jobs.json")
    assert not (tmp_path / "PWNED").exists()


def test_report_refuses_a_link_out_of_the_folder(unfinished, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (folder / "figures").symlink_to(elsewhere)
    before, beside = snapshot(folder), snapshot(tmp_path)
    assert_one_line(capsys, report_main([str(folder)]), "figures is a link")
    assert snapshot(folder) == before and snapshot(tmp_path) == beside


def test_a_checkpoint_from_before_fp16_passes_the_check(tmp_path):
    """Checkpoints written before the loss scaler lack its key; the sweep checks the required keys only."""
    from pe_fast.train import PackTrainer
    state = tiny_trainer().state_dict()
    del state["scaler"]
    run_folder.save_checkpoint(tmp_path, 0, state)
    run_folder.check_checkpoint(tmp_path, 0, PackTrainer.REQUIRED_STATE_KEYS, steps=4)
    with pytest.raises(run_folder.UnreadableCheckpoint, match="lacks scaler"):
        run_folder.check_checkpoint(tmp_path, 0, PackTrainer.STATE_KEYS, steps=4)


def minimal_run(folder: Path, results: pd.DataFrame, curves: pd.DataFrame | None = None, task: str = "lst") -> Path:
    """A results folder as a sweep writes its top level: config.json, results.parquet (and curves.parquet)."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"settings": {"task": task}}))
    results.to_parquet(folder / "results.parquet")
    if curves is not None:
        curves.to_parquet(folder / "curves.parquet")
    return folder


def refused_by_load_run_and_the_report(folder: Path, must_name: str, capsys):
    """load_run raises a ReportError naming it; the report says it in one line and writes nothing (no figure, no
    report.md before the refusal)."""
    from pe_fast.results.reading import ReportError, load_run
    with pytest.raises(ReportError, match="not a pe_fast results folder") as refused:
        load_run(folder)
    assert must_name in str(refused.value)
    before = snapshot(folder)
    assert_one_line(capsys, report_main([str(folder)]), must_name)
    assert snapshot(folder) == before


GOOD = {"task": ["lst"] * 2, "pe": ["learned", "sin2d"], "sigma": [0.2, None], "seed": [1, 1], "model_id": [0, 1],
        "ood_acc": [0.5, 0.6]}


@pytest.mark.parametrize("change, must_name", [
    ({"pe": [3, 4]}, "column 'pe' is stored as int64, not text"),
    ({"pe": ["learned", "<script>alert(1)</script>"]}, "column pe holds '<script>"),
    ({"pe": ["learned", "$\\frac{$"]}, "column pe holds"),
    # the other text columns the report prints, checked against their choices (they reached report.md raw)
    ({"optimizer": ["adamw", "<img src=x onerror=alert(1)>|**y**"]}, "column optimizer holds '<img"),
    ({"stopped": ["budget", "soon"]}, "column stopped holds 'soon', not one of converged, budget"),
    ({"precision": ["fp32", "fp64"]}, "column precision holds 'fp64'"),
    ({"seed": ["one", "two"]}, "column 'seed' is stored as"),
    ({"sigma": [0.0, None]}, "column sigma holds 0"),
    ({"sigma": [-1.0, None]}, "column sigma holds -1"),
    ({"sigma": ["small", None]}, "column 'sigma' is stored as"),
    ({"sigma": [float("inf"), None]}, "column sigma holds inf"),
    ({"sigma": [None, None]}, "column sigma is empty for pe learned"),  # was drawn at no σ in the figures
    ({"seed": [float("nan"), 1]}, "column seed holds nan"),  # empty only for a baseline
    ({"seed": [1e300, 1]}, "column seed holds 1e+300"),
    ({"model_id": [0, 0]}, "column model_id holds 0 twice"),
    ({"model_id": [0, 0.5]}, "column model_id holds 0.5"),
    ({"model_id": [0, -7]}, "column model_id holds -7"),
    ({"ood_acc": ["high", "low"]}, "column 'ood_acc' is stored as"),  # the figures average it
    ({"ood_acc": [True, False]}, "column 'ood_acc' is stored as bool, not numbers"),  # arithmetic on bools fails
    ({"ood_acc": [Decimal("0.5"), Decimal("0.6")]}, "column 'ood_acc' is stored as decimal128"),
    ({"sigma": pd.to_datetime(["2020-01-01", None])}, "column 'sigma' is stored as timestamp"),
    # another task's table in an LST folder: its scores are not the LST's
    ({"task": ["fmri"] * 2}, "column task holds 'fmri', where config.json records --task lst"),
    # finite, but past float32: the report's statistics and axes overflowed (arange: cannot compute length)
    ({"ood_acc": [1e308, -1e308]}, "column ood_acc holds 1e+308, beyond any float32"),
])
def test_a_results_table_of_the_wrong_schema_is_one_error(change, must_name, tmp_path, capsys):
    from pe_fast.results.reading import load_run
    assert len(load_run(minimal_run(tmp_path / "good", pd.DataFrame(GOOD))).results) == 2  # the good one reads
    folder = minimal_run(tmp_path / "bad", pd.DataFrame({**GOOD, **change}))
    refused_by_load_run_and_the_report(folder, must_name, capsys)


BASELINE_ROWS = {"task": ["fmri"] * 3, "pe": ["learned", "baseline:mean", "baseline:linear"],
                 "sigma": [0.2, None, None], "seed": [1, None, None], "model_id": [0, 1, 2], "pack": [0, -1, -1],
                 "test_r2": [0.3, 0.1, 0.4]}


# second held-out round (issue 55): baseline rows no sweep writes were read, and listed in report.md
@pytest.mark.parametrize("change, must_name", [
    ({"pe": ["learned", "baseline:mean", "baseline:mean"]}, "column pe names 'baseline:mean' twice"),
    ({"sigma": [0.2, 0.5, None]}, "column sigma holds 0.5 for 'baseline:mean', where a baseline's is empty"),
    ({"seed": [1, 2235, None]}, "column seed holds 2235.0 for 'baseline:mean'"),
    ({"pack": [0, 0, -1]}, "column pack holds 0 for 'baseline:mean', where a baseline's is -1"),
    ({"pe": ["learned", "baseline:mean", "baseline:evil"]},
     "column pe holds 'baseline:evil', not a baseline task fmri writes"),
])
def test_a_baseline_row_no_sweep_writes_is_one_error(change, must_name, tmp_path, capsys):
    from pe_fast.results.reading import load_run
    assert len(load_run(minimal_run(tmp_path / "good", pd.DataFrame(BASELINE_ROWS), task="fmri")).results) == 3
    folder = minimal_run(tmp_path / "bad", pd.DataFrame({**BASELINE_ROWS, **change}), task="fmri")
    refused_by_load_run_and_the_report(folder, must_name, capsys)


def test_a_curves_pe_name_that_no_sweep_writes_is_one_error(tmp_path, capsys):
    """Only results.parquet's pe column was checked: a curves row's PE name reached report.md's convergence line."""
    from pe_fast.results.reading import ReportError, load_run
    curves = pd.DataFrame({**GOOD, "step": [4, 4], "pe": ["learned", "<img src=x onerror=alert(1)>"]})
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD), curves)
    with pytest.raises(ReportError, match="curves column pe holds '<img"):
        load_run(folder)
    before = snapshot(folder)
    assert_one_line(capsys, report_main([str(folder)]), "curves column pe holds")
    assert snapshot(folder) == before


@pytest.mark.parametrize("entries, must_name", [
    ({"model_0": np.float64(3.0)}, "entry model_0 is a 0-axis"),
    ({"model_0": np.array(["a", "b"])}, "entry model_0 is a 1-axis <U1"),
    ({"model_0": np.zeros(4)}, "entry model_0 is a 1-axis float64"),
    ({"model_0": np.zeros((2, 2), dtype=complex)}, "complex"),
    ({"something_else": np.zeros((2, 2))}, "entry 'something_else' is not model_<id>"),
    ({"model_0": np.zeros((16, 8), np.float16)}, "entry model_0 is a 2-axis float16"),
    ({"model_0": np.zeros((3, 8))}, "entry model_0 has shape [3, 8], not [16, width]"),  # model_1 has 16 tokens
    ({"attention_map_1": np.zeros((2, 16, 3))}, "entry attention_map_1 has shape [2, 16, 3], not [blocks, 16, 16]"),
    ({"model_0": np.zeros((1, 16, 0))}, "entry model_0 is a 3-axis float64 array of shape [1, 16, 0]"),  # no width
    # finite, but past float32: the figures' SVDs overflowed, with numpy's warnings on stderr
    ({"model_0": np.full((16, 8), 1e300)}, "entry model_0 holds numbers beyond any float32"),
    ({"attention_map_1": np.full((1, 16, 16), 7.0)}, "entry attention_map_1 holds numbers beyond any probability"),
])
def test_a_pe_table_that_is_not_a_table_is_one_error(entries, must_name, tmp_path, capsys):
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD))
    np.savez(folder / "pe_tables.npz", model_1=np.zeros((16, 8)), **entries)
    refused_by_load_run_and_the_report(folder, must_name, capsys)


def test_a_big_endian_pe_table_is_its_numbers_and_an_entry_stored_twice_is_refused(tmp_path):
    """Big-endian float64 is a table numpy writes as legally as native; a zip of two members of one name would
    have np.load keep one of them silently."""
    import zipfile
    from pe_fast.results.reading import ReportError, load_run
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD))
    table = np.arange(32.0).reshape(4, 8)
    np.savez(folder / "pe_tables.npz", model_0=table.astype(">f8"))
    np.testing.assert_array_equal(load_run(folder).pe_table(0), table[None])  # one block's table
    with zipfile.ZipFile(folder / "pe_tables.npz", "a") as archive, pytest.warns(UserWarning, match="Duplicate"):
        with archive.open("model_0.npy", "w") as member:
            np.lib.format.write_array(member, np.zeros((4, 8)))
    with pytest.raises(ReportError, match="holds the entry 'model_0.npy' twice"):
        load_run(folder)


@pytest.mark.parametrize("curves, must_name", [
    ({"model_id": [0], "ood_acc": [0.5]}, "curves column step is missing"),
    ({"model_id": [0, 0], "step": [0, float("inf")]}, "curves column step holds inf"),
    ({"model_id": [0, 0], "step": [0, -5]}, "curves column step holds -5"),
    ({"model_id": [0, 1.5], "step": [0, 5]}, "curves column model_id holds 1.5"),
    ({"model_id": [0, 0], "step": [0, 5], "ood_acc": ["x", "y"]}, "column 'ood_acc' is stored as"),
    ({"model_id": [0, 0], "step": [0, 5], "ood_acc": [0.5, -1e300]}, "curves column ood_acc holds -1e+300"),
])
def test_curves_of_the_wrong_schema_are_one_error(curves, must_name, tmp_path):
    from pe_fast.results.reading import ReportError, load_run
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD), pd.DataFrame(curves))
    with pytest.raises(ReportError, match=re.escape(must_name)):
        load_run(folder)


def test_a_baseline_has_no_seed(tmp_path):
    """A task's baselines (baseline:NAME rows) are not trained from a seed: their empty seed reads."""
    from pe_fast.results.reading import load_run
    results = pd.DataFrame({**GOOD, "task": ["fmri"] * 2, "pe": ["learned", "baseline:mean"], "seed": [1, None]})
    assert load_run(minimal_run(tmp_path / "run", results, task="fmri")).results["pe"].tolist() == \
        ["learned", "baseline:mean"]


@pytest.mark.parametrize("holds, inside", [("packs/0/results.parquet", "packs/9"), ("results.parquet", "figures/x"),
                                            ("curves.parquet", "zz")])
def test_an_out_inside_a_folder_the_readers_take_without_config_is_refused(holds, inside, tmp_path, capsys):
    """The report reads a folder of finished packs or results without config.json; a sweep wrote a whole run into
    it (its packs/9, its figures/), which the report then refused."""
    folder = tmp_path / "theirs"
    (folder / holds).parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(GOOD).to_parquet(folder / holds)
    before = snapshot(tmp_path)
    assert_one_line(capsys, sweep_main(LST + ["--out", str(folder / inside)]), "lies inside the results folder")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("name", ["phase_diagram.png", "pe_drift.png"])  # one the LST draws no more, one it draws
def test_a_figure_in_the_way_is_one_line_and_nothing_drawn(name, tmp_path, capsys):
    """A folder named as a figure: every figure before it was redrawn, then the report failed naming its
    temporary file."""
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD))
    (folder / "figures" / name).mkdir(parents=True)
    before = snapshot(folder)
    assert_one_line(capsys, report_main([str(folder)]), f"{folder / 'figures' / name} is in the way")
    assert snapshot(folder) == before


@pytest.mark.parametrize("in_the_way", ["report.md as a folder", "figures as a file", "rdms.hdf5 as a folder"])
def test_a_report_or_figures_in_the_way_is_one_line_and_nothing_drawn(in_the_way, tmp_path, capsys):
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD))
    name = in_the_way.split()[0]
    if in_the_way.endswith("folder"):
        (folder / name).mkdir()
    else:
        (folder / name).write_text("")
    rdms = ["--rdms"] if name == "rdms.hdf5" else []
    if rdms:
        pytest.importorskip("rsatoolbox")
    before = snapshot(folder)
    assert_one_line(capsys, report_main([str(folder), *rdms]), f"{folder / name} is in the way")
    assert snapshot(folder) == before and sorted(p.name for p in folder.iterdir()) == sorted(
        ["config.json", "results.parquet", name])


def within(seconds: float, call, *args):
    """call(*args)'s result, or a failure if it has not returned within `seconds` (it runs in a daemon thread, so a
    hang fails the test instead of holding the suite)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = call(*args)
        except BaseException as error:  # noqa: BLE001 - re-raised below, in the test's thread
            outcome["error"] = error
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{getattr(call, '__name__', call)} still running after {seconds} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def test_a_fifo_in_a_folder_is_one_error_not_a_hang(tmp_path, capsys):
    """A pack's results.parquet that is a FIFO blocked load_run and the report until a writer came (issue 55): only
    regular files are read."""
    from pe_fast.results.reading import ReportError, load_run
    folder = tmp_path / "run"
    pack = run_folder.pack_folder(folder, 0)
    pack.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"settings": {"task": "lst"}, "packs": [[0, 1]]}))
    pd.DataFrame(GOOD).to_parquet(pack / "curves.parquet")
    os.mkfifo(pack / "results.parquet")
    with pytest.raises(ReportError, match="no results yet"):
        within(60, load_run, folder)
    assert within(60, report_main, [str(folder)]) == 2
    assert "no results yet" in capsys.readouterr().err
    # a FIFO in place of a file the folder may lack is refused, not passed over as absent (the curves went missing)
    minimal_run(tmp_path / "top", pd.DataFrame(GOOD))
    os.mkfifo(tmp_path / "top" / "curves.parquet")
    with pytest.raises(ReportError, match="curves.parquet is not a regular file"):
        within(60, load_run, tmp_path / "top")
    (pack / "results.parquet").unlink()
    pd.DataFrame(GOOD).to_parquet(pack / "results.parquet")
    (pack / "curves.parquet").unlink()
    os.mkfifo(pack / "curves.parquet")
    with pytest.raises(ReportError, match="curves.parquet is not a regular file"):
        within(60, load_run, folder)
    # results.parquet too, and a folder in its place: taken as absent, the results were rebuilt from the curves
    for make in (os.mkfifo, Path.mkdir):
        spoilt = minimal_run(tmp_path / f"spoilt_{make.__name__}", pd.DataFrame(GOOD), pd.DataFrame(GOOD).assign(step=4))
        (spoilt / "results.parquet").unlink()
        make(spoilt / "results.parquet")
        with pytest.raises(ReportError, match="results.parquet is not a regular file"):
            within(60, load_run, spoilt)
    # config.json too: a FIFO was taken as no config.json, and the report went on without the settings
    (tmp_path / "top" / "curves.parquet").unlink()
    (tmp_path / "top" / "config.json").unlink(missing_ok=True)
    os.mkfifo(tmp_path / "top" / "config.json")
    with pytest.raises(ReportError, match="config.json is not a regular file"):
        within(60, load_run, tmp_path / "top")
    assert within(60, report_main, [str(tmp_path / "top")]) == 2
    assert "config.json is not a regular file" in capsys.readouterr().err


def test_an_empty_folder_name_is_refused_not_read_as_the_working_folder(tmp_path, capsys, monkeypatch):
    """Path("") is ".": the report read the folder it ran in and wrote report.md and figures/ there, and load_run("")
    read it, as an empty --out once wrote a sweep there."""
    from pe_fast.compare_lst_logs import main as compare_main
    from pe_fast.results.reading import ReportError, load_run
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD))
    monkeypatch.chdir(folder)
    before = snapshot(folder)
    assert_one_line(capsys, report_main([""]), "'' names no folder")
    assert_one_line(capsys, report_main([" ", str(folder), "--out", str(tmp_path / "pooled")]), "' ' names no folder")
    assert_one_line(capsys, compare_main([""]), "'' names no folder")
    with pytest.raises(ReportError, match="'' names no folder"):
        load_run("")
    assert snapshot(folder) == before and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_folder_name_too_long_is_one_line(tmp_path, capsys):
    """A name the file system refuses (over 255 bytes): Path.is_dir raises for it rather than answering."""
    from pe_fast.compare_lst_logs import main as compare_main
    from pe_fast.results.reading import ReportError, load_run
    name = str(tmp_path / ("x" * 300))
    assert_one_line(capsys, report_main([name]), "File name too long")
    assert_one_line(capsys, compare_main([name]), "File name too long")
    with pytest.raises(ReportError, match="File name too long"):
        load_run(name)
    assert list(tmp_path.iterdir()) == []


def test_a_loop_of_links_in_a_folder_is_one_line(tmp_path, capsys):
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD))
    (folder / "a").symlink_to(folder / "b")
    (folder / "b").symlink_to(folder / "a")
    before = snapshot(folder)
    assert_one_line(capsys, report_main([str(folder)]), "loop")
    assert snapshot(folder) == before


@pytest.mark.parametrize("truth, must_name", [
    ({"fc": np.eye(3)}, "entry fc"),                               # 3 regions where the PE tables have 4 tokens
    ({"fc": np.eye(4), "networks": np.zeros((4, 2))}, "entry networks"),
    ({"fc": np.eye(4), "centroids": np.zeros(4)}, "entry centroids"),
    ({"fc": np.full((4, 4), "x")}, "entry fc"),
    ({"fc": np.eye(4), "payload": np.zeros(4)}, "'payload'"),
    # rsatoolbox and the figures failed on these after the report had begun
    ({"fc": np.where(np.eye(4) > 0, np.nan, 0.5)}, "entry fc holds NaN or inf"),
    ({"fc": np.eye(4), "centroids": np.full((4, 3), np.inf)}, "entry centroids holds NaN or inf"),
    ({"fc": np.eye(4, dtype=complex)}, "entry fc is a complex128 array"),
    # gradients[:, 0] after 8 figures (IndexError)
    ({"fc": np.eye(4), "gradients": np.zeros((4, 0))}, "entry gradients of shape"),
    # the rules a regions table's centroids follow (every region on one point passed here), a gradient that is no
    # axis (numpy's warnings, then NaN), values whose squares overflow in the figures (issue 55)
    ({"fc": np.eye(4), "centroids": np.zeros((4, 3))}, "its centroids put over half the pairs of regions on one"),
    ({"fc": np.eye(4), "centroids": np.eye(4, 3) * 1e9}, "its centroids hold values beyond ±1,000,000"),
    ({"fc": np.eye(4), "gradients": np.ones((4, 2))}, "entry gradients holds a column that is"),
    ({"fc": np.eye(4), "gradients": np.arange(8.0).reshape(4, 2) * 1e300}, "entry gradients holds values beyond "
                                                                            "float32's range"),
    # round 15: a gradient of normal but tiny values (squares that underflow), float16 arrays (numpy's warnings)
    ({"fc": np.eye(4), "gradients": np.arange(8.0).reshape(4, 2) * 1e-200}, "entry gradients holds a column that "
                                                                             "is"),
    ({"fc": np.eye(4, dtype=np.float16), "gradients": np.ones((4, 1), np.float16)}, "entry gradients holds a column"),
])
def test_a_ground_truth_of_the_wrong_shape_is_one_line_before_any_figure(truth, must_name, tmp_path, capsys):
    """ground_truth.npz indexed by token in the figures: a wrong shape was a 22-line IndexError after figures/ had
    been written (issue 55)."""
    from pe_fast.results.reading import ReportError, load_run
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD))
    np.savez(folder / "pe_tables.npz", model_0=np.zeros((4, 8)), model_1=np.zeros((4, 8)))
    np.savez(folder / "ground_truth.npz", **truth)
    with pytest.raises(ReportError, match=must_name):
        load_run(folder)
    before = snapshot(folder)
    assert_one_line(capsys, report_main([str(folder)]), must_name)
    assert snapshot(folder) == before and not (folder / "figures").exists()


def test_a_table_that_expands_far_beyond_its_file_is_one_line_not_read(tmp_path, capsys, monkeypatch):
    """A 2 MB pe_tables.npz that inflates to 2 GB and a 0.8 MB results.parquet of 50 M rows were read whole (issue
    55): what a file declares is checked against its size on disk before it is read."""
    import zipfile
    from pe_fast.data import declared_size
    from pe_fast.results import reading
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD))
    with zipfile.ZipFile(folder / "pe_tables.npz", "w", zipfile.ZIP_DEFLATED) as archive, \
            archive.open("model_0.npy", "w", force_zip64=True) as member:
        np.lib.format.write_array(member, np.zeros((2**13, 2**13)))  # 512 MiB of zeros, 0.5 MB deflated
    assert (folder / "pe_tables.npz").stat().st_size < 2**21
    with pytest.raises(reading.ReportError, match="pe_tables.npz declares 512 MiB once read"):
        reading.load_run(folder)
    small_ints = np.zeros((10, 3_000_000), np.int8)  # 29 MB as int8, 229 MiB as the floats the readers make
    small_ints[:, ::5] = 1
    np.savez_compressed(folder / "pe_tables.npz", model_0=small_ints)
    monkeypatch.setattr(declared_size, "EXPANSION_FLOOR", 2**27)
    with pytest.raises(reading.ReportError, match="pe_tables.npz declares 229 MiB once read"):
        reading.load_run(folder)
    monkeypatch.undo()
    (folder / "pe_tables.npz").unlink()
    pd.DataFrame({"pe": ["learned"] * 2**23, "sigma": 0.1, "model_id": 0}).to_parquet(folder / "results.parquet")
    assert (folder / "results.parquet").stat().st_size < 2**20  # 8 M rows of one value: a few KB
    monkeypatch.setattr(declared_size, "EXPANSION_FLOOR", 2**20)  # 192 MiB declared: above this floor, not the default's
    assert_one_line(capsys, report_main([str(folder)]), "results.parquet declares")


def test_a_folder_swapped_for_a_link_while_the_report_writes_leads_no_write_out(tmp_path, capsys, monkeypatch):
    """figures/ moved away and a link to a folder outside put in its place after the report's checks: the
    figures went through the link (issue 55, a race); every write now opens its way below DIR without
    following links, and the report stops in one line."""
    from pe_fast.report import figures
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD))
    outside = tmp_path / "outside"
    outside.mkdir()
    original = figures.save

    def swap_then_save(fig, path):
        if not (folder / "figures").is_symlink():
            (folder / "figures").rename(tmp_path / "moved")
            (folder / "figures").symlink_to(outside)
        original(fig, path)
    monkeypatch.setattr(figures, "save", swap_then_save)
    assert_one_line(capsys, report_main([str(folder)]),
                    f"{folder / 'figures'}: a link or a file where pe_fast writes a folder")
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("change, must_name", [
    # pandas' arithmetic overflowed a float16 score with its warning; the sweep writes float64
    (lambda t: t.set_column(t.schema.get_field_index("ood_acc"), "ood_acc", t["ood_acc"].cast("float16")),
     "column 'ood_acc' is stored as halffloat"),
])
def test_a_results_table_stored_otherwise_than_the_sweep_stores_it_is_one_line(change, must_name, tmp_path, capsys):
    import pyarrow.parquet as pq
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD))
    pq.write_table(change(pq.read_table(folder / "results.parquet")), folder / "results.parquet")
    before = snapshot(folder)
    assert_one_line(capsys, report_main([str(folder)]), must_name)
    assert snapshot(folder) == before


def test_pandas_metadata_in_a_results_table_is_not_taken_as_its_word(tmp_path):
    """An index named after a column in the file's pandas metadata: a traceback in a figure, after others were
    drawn ("'model_id' is both an index level and a column label"); the readers take the columns alone."""
    import json
    import pyarrow.parquet as pq
    from pe_fast.results.reading import load_run
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD))
    table = pq.read_table(folder / "results.parquet")
    metadata = dict(table.schema.metadata)
    pandas_metadata = json.loads(metadata[b"pandas"])
    pandas_metadata["index_columns"] = ["model_id"]
    metadata[b"pandas"] = json.dumps(pandas_metadata).encode()
    pq.write_table(table.replace_schema_metadata(metadata), folder / "results.parquet")
    results = load_run(folder).results
    assert "model_id" in results.columns and results["model_id"].tolist() == [0, 1]


def test_the_results_folder_swapped_for_a_link_while_the_report_writes_leads_no_write_out(tmp_path, capsys,
                                                                                         monkeypatch):
    """The results folder itself moved away and a link to a folder outside put in its place while the report
    ran: report.md and the figures went into the link's target, a report.md there overwritten (round 15)."""
    from pe_fast.report import figures
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD))
    outside = tmp_path / "outside"
    (outside / "figures").mkdir(parents=True)
    (outside / "report.md").write_text("precious")
    original = figures.save

    def swap_then_save(fig, path):
        if not folder.is_symlink():
            folder.rename(tmp_path / "moved")
            folder.symlink_to(outside)
        original(fig, path)
    monkeypatch.setattr(figures, "save", swap_then_save)
    assert_one_line(capsys, report_main([str(folder)]), "a link or a file where pe_fast writes a folder")
    assert (outside / "report.md").read_text() == "precious" and list((outside / "figures").iterdir()) == []


def test_writes_below_a_results_folder_follow_no_link_on_the_way(tmp_path):
    """run_folder.write_atomic below `under`: a link on the way is refused, a link at the file's own place is
    replaced (never written through), and nothing lands outside."""
    folder, outside = tmp_path / "run", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    (outside / "kept.txt").write_text("mine")
    (folder / "packs").symlink_to(outside)
    with pytest.raises(OSError, match="a link or a file where pe_fast writes a folder"):
        run_folder.write_atomic(folder / "packs" / "kept.txt", lambda file: file.write(b"theirs"), under=folder)
    (folder / "report.md").symlink_to(outside / "kept.txt")
    run_folder.write_atomic(folder / "report.md", lambda file: file.write(b"report"), under=folder)
    assert (outside / "kept.txt").read_text() == "mine" and sorted(p.name for p in outside.iterdir()) == ["kept.txt"]
    assert not (folder / "report.md").is_symlink() and (folder / "report.md").read_text() == "report"


def dictionary_text_table(rows: int, text: str, **numbers):
    """A parquet table whose pe column holds one long text in every row, stored once in a dictionary page."""
    import pyarrow as pa
    pe = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int32)), pa.array([text]))
    return pa.table({"pe": pe, **{name: pa.array(np.full(rows, value)) for name, value in numbers.items()}})


def test_text_stored_once_and_read_in_every_row_is_judged_as_read(tmp_path, capsys):
    """A 59 KB curves.parquet whose text column holds a 200 KB string through a dictionary page took 9 GB to read
    (issue 55): the text's bytes are counted over every row, from the dictionary and its indices, before reading."""
    import pyarrow.parquet as pq
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD))
    pq.write_table(dictionary_text_table(40_000, "x" * 200_000, sigma=0.1, model_id=0), folder / "results.parquet",
                   compression="zstd")
    assert (folder / "results.parquet").stat().st_size < 2**16
    before = snapshot(folder)
    assert_one_line(capsys, report_main([str(folder)]), "results.parquet declares 7,629 MiB once read")
    assert snapshot(folder) == before


@pytest.mark.parametrize("flags, flag", [(FMRI, "--data"), (LST, "--lst-ood")])
def test_a_pipe_given_as_a_data_file_is_named_for_what_it_is(flags, flag, tmp_path, capsys):
    """A FIFO where a data file belongs: one line saying it is not a regular file (it once said "no such file",
    which sends the user looking for a path that exists), nothing read from it, nothing written."""
    pipe = tmp_path / "series.npy"
    os.mkfifo(pipe)
    code = sweep_main(flags + [flag, str(pipe), "--out", str(tmp_path / "run")])
    assert_one_line(capsys, code, "not a regular file")
    assert not (tmp_path / "run").exists()


def test_a_folder_named_tilde_is_that_folder_not_home(tmp_path, capsys, monkeypatch):
    """pandas expands a leading ~ of a path's text: a folder named "~" was read, and a sweep's --out ~ written, as
    $HOME. The parquet files go through files pe_fast opens, so "~" is the folder of that name; a folder to write
    named with a leading ~ is refused (test_an_out_folder_beginning_with_a_tilde_...), and ./~ is that folder."""
    from pe_fast.results.reading import load_run
    home = tmp_path / "home"
    minimal_run(home, pd.DataFrame({**GOOD, "ood_acc": [0.1, 0.2]}))  # another run's numbers, in $HOME
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    minimal_run(tmp_path / "~", pd.DataFrame(GOOD))
    assert load_run("~").results["ood_acc"].tolist() == [0.5, 0.6]
    before = snapshot(home)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    threads = torch.get_num_threads()
    try:
        assert sweep_main(LST + ["--out", "./~"]) == 0
    finally:
        torch.set_num_threads(threads)
    assert load_run("~").results["pe"].tolist() == ["learned"] and snapshot(home) == before


@pytest.mark.parametrize("out, must_name", [
    ("{run}/packs/x", "lies inside the results folder {run}"),
    ("pooled\nnext", "holds a control character"),
    ("  ", "'  ' names no folder"),
    (os.fsdecode(b"pooled\xff"), "holds bytes that are not UTF-8 text"),
])
def test_a_pooled_out_follows_the_sweeps_rules_for_a_new_folder(out, must_name, tmp_path, capsys, monkeypatch):
    """The pooled report's --out is checked as the sweep's (run_folder.check_out_folder): inside another results
    folder, a line break, blank, bytes that are not UTF-8: one line, nothing written."""
    monkeypatch.chdir(tmp_path)
    run, other = (minimal_run(tmp_path / name, pd.DataFrame(GOOD)) for name in ("run", "other"))
    before = snapshot(tmp_path)
    code = report_main([str(run), str(other), "--out", out.format(run=run)])
    assert_one_line(capsys, code, must_name.format(run=run))
    assert snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["other", "run"]


def test_a_sweep_out_of_bytes_that_are_not_utf8_is_refused_before_training(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_one_line(capsys, sweep_main(LST + ["--out", os.fsdecode(b"run\xff")]), "holds bytes that are not UTF-8")
    assert list(tmp_path.iterdir()) == []


def test_text_that_inflates_far_beyond_its_file_is_refused_unread(tmp_path, capsys, monkeypatch):
    """A few kB of compressed parquet holding one long string per row: the 8-bytes-a-cell estimate saw 16 bytes;
    the pages' own uncompressed size is counted (the floor lowered to test at kB, not at its 256 MiB)."""
    from pe_fast.data import declared_size
    from pe_fast.results.reading import ReportError, load_run
    monkeypatch.setattr(declared_size, "EXPANSION_FLOOR", 2**20)
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD))
    pd.DataFrame({**GOOD, "data_kind": ["x" * 2**22] * 2}).to_parquet(folder / "results.parquet",
                                                                     compression="zstd")
    assert (folder / "results.parquet").stat().st_size < 2**14
    with pytest.raises(ReportError, match="declares 4 MiB once read"):
        load_run(folder)


def test_a_pooled_folder_whose_sources_lead_back_to_it_is_one_error(tmp_path):
    """config.json's pooled_from naming the folder itself (or a folder that names it): model() read it again,
    without end (RecursionError)."""
    from pe_fast.results.reading import ReportError, load_run
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD))
    other = minimal_run(tmp_path / "other", pd.DataFrame(GOOD))
    for here, there in ((folder, folder), (folder, other), (other, folder)):
        (here / "config.json").write_text(json.dumps({
            "settings": {"task": "lst"}, "pooled_from": [str(there)],
            "models": [{"model_id": i, "pe": GOOD["pe"][i], "sigma": GOOD["sigma"][i], "seed": GOOD["seed"][i],
                        "pooled_from": [0, i]} for i in (0, 1)]}))
    for start in (folder, other):
        with pytest.raises(ReportError, match="pooled_from leads back to .*, a loop"):
            load_run(start).model(0)


def without_trained_with(folder: Path):
    """The folder as a pe_fast before 2026-12-07 wrote it: no pack recorded the settings it trained with, so an
    edited config.json reaches the checks after load_run's."""
    for record in folder.glob("packs/*/" + run_folder.TRAINED_WITH):
        record.unlink()
        digests = json.loads((record.parent / run_folder.DIGESTS).read_text())
        del digests[run_folder.TRAINED_WITH]
        (record.parent / run_folder.DIGESTS).write_text(json.dumps(digests))


def test_data_a_folder_names_that_cannot_be_loaded_is_a_value_error(tmp_path, capsys):
    """run.task_inputs loads the task from config.json's settings: data that is not a readable file is a
    ValueError naming it (DataError was an Exception of its own, which a caller's `except ValueError` missed)."""
    from pe_fast.results.reading import load_run
    files = inputs(tmp_path)
    threads = torch.get_num_threads()
    try:
        assert sweep_main(FMRI + ["--data", files["NPY"], "--out", str(tmp_path / "run")]) == 0
    finally:
        torch.set_num_threads(threads)
    without_trained_with(tmp_path / "run")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    config["settings"]["data"] = "/dev/zero"
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="/dev/zero"):
        load_run(tmp_path / "run").task_inputs("test")
    # a file the folder names may be anyone's: refused by name, its text never quoted
    secret = tmp_path / "secret.csv"
    secret.write_text("root:s3cr3t-hash:0:0\nsecond line\n")
    config["settings"].update(data=files["NPY"], regions=str(secret))
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="secret.csv: the regions table has no 'label' column") as refused:
        load_run(tmp_path / "run").task_inputs("test")
    assert "s3cr3t" not in str(refused.value)


def test_outside_text_with_a_line_break_stays_one_line(tmp_path, capsys, monkeypatch):
    """A lock's host name and $RAY_ADDRESS are anyone's text: quoted in the error, a line break shows as \\n."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ".lock").write_text(json.dumps({"pid": 1, "host": "other\n<b>", "started": "now"}))
    assert_one_line(capsys, sweep_main(LST + ["--out", str(folder)]), "pid 1 on other\\n<b>")
    if importlib.util.find_spec("ray") is not None:
        monkeypatch.setenv("RAY_ADDRESS", "a\nb")
        code = sweep_main(LST + ["--executor", "ray", "--ray-address", "auto", "--out", str(tmp_path / "ray")])
        assert_one_line(capsys, code, "a\\nb")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_report_it_cannot_write_is_one_line(tmp_path, capsys, monkeypatch):
    """A read-only folder (as root, permission bits do not bind, so the refusal is the file system's, simulated):
    one line naming the file, exit 2, no traceback."""
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD))

    def read_only(path, write, under=None):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))
    monkeypatch.setattr(run_folder, "write_atomic", read_only)
    assert_one_line(capsys, report_main([str(folder)]), f"{folder}/figures/")


def test_the_report_and_load_run_refuse_a_setting_no_pe_fast_writes(unfinished, tmp_path, capsys):
    """An unknown name in config.json's settings is no older version's (migrate.REMOVED_SETTINGS lists those):
    the report and load_run refuse the folder as --resume does, naming the setting."""
    import pe_fast
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    config_with(stepz=50)(folder)
    before = snapshot(folder)
    assert_one_line(capsys, report_main([str(folder)]), "unknown setting 'stepz'")
    with pytest.raises(ValueError, match="config.json has settings this pe_fast cannot read .*unknown setting 'stepz'"):
        pe_fast.load_run(folder)
    assert snapshot(folder) == before


def test_the_report_refuses_a_recorded_int_beyond_floats_range(unfinished, tmp_path, capsys):
    """An int of 400 digits in config.json: math.isfinite raised OverflowError (a traceback) before the range check."""
    folder = tmp_path / "run"
    shutil.copytree(unfinished, folder)
    config_with(max_pack=-10**400)(folder)
    before = snapshot(folder)
    assert_one_line(capsys, report_main([str(folder)]), "--max-pack must be finite")
    assert snapshot(folder) == before


@pytest.fixture(scope="module")
def half_finished(tmp_path_factory):
    """An LST sweep of two packs (learned, sin2d) whose pack 0 finished and pack 1 holds a genuine checkpoint of
    its pack after 2 steps: what an interrupted sweep leaves."""
    from pe_fast.sweep import grid
    from pe_fast.sweep.task_loading import load_task
    from sweep_harness import settings_of
    flags = narrowed(*LST, "--pe", "learned,sin2d", "--sigmas", "0.2", "--threads", "1")
    out = tmp_path_factory.mktemp("sweep") / "run"
    threads = torch.get_num_threads()
    try:
        assert sweep_main([*flags, "--out", str(out)]) == 0
        for name in ("results.parquet", "curves.parquet", "pe_tables.npz", "summary.txt", "report.md"):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / "packs" / "1")
        recorded = json.loads((out / "config.json").read_text())["settings"]["max_pack"]
        s = dataclasses.replace(settings_of(*flags), max_pack=recorded)  # one model a PE kind: the sweep's packs
        task = load_task(s)
        packs = grid.pack_models(s, grid.expand_grid(s))

        def stop_after_the_first_checkpoint(step):  # the sweep checkpoints after each evaluation (step 2 of 4)
            if step == 3:
                raise InterruptedError
        with pytest.raises(InterruptedError):
            executors.train_and_store_pack(s, 1, packs[1], out, task, on_step=stop_after_the_first_checkpoint)
    finally:
        torch.set_num_threads(threads)
    return out


def relabel_pack_0(**columns):
    def change(folder: Path):
        for name in ("results.parquet", "curves.parquet"):
            path = folder / "packs" / "0" / name
            pd.read_parquet(path).assign(**columns).to_parquet(path)
    return change


def link_pack_1(target: str):
    def change(folder: Path):
        (folder / "packs" / "1").symlink_to(target)
    return change


def foreign_pack(folder: Path):
    shutil.copytree(folder / "packs" / "0", folder / "packs" / "7")


def checkpoint_of_pack_1_with(change):
    def spoil(folder: Path):
        path = run_folder.checkpoint_path(folder, 1)
        state = torch.load(path, weights_only=True)
        change(state)
        run_folder.save_checkpoint(folder, 1, state)
    return spoil


def shared_list_of(levels: int) -> list:
    """A list reached 2**levels times through one shared object at each level: a few hundred bytes pickled."""
    shared = [0]
    for _ in range(levels):
        shared = [shared, shared]
    return shared


def weights_of_pack_0_as_model(model_id: int):
    """Pack 0's weights.safetensors as a pack of the same shapes holding model `model_id` writes it."""
    def spoil(folder: Path):
        from pe_fast.results import weights
        path = run_folder.pack_folder(folder, 0) / run_folder.WEIGHTS
        pack = weights.load_pack_weights(path)
        weights.save_pack_weights(path, pack.model, [model_id], pack.step, None)  # the LST's tokens: no coordinates
    return spoil


def config_model_1_with(**changes):
    def spoil(folder: Path):
        config = json.loads((folder / "config.json").read_text())
        config["models"][1].update(changes)
        (folder / "config.json").write_text(json.dumps(config))
    return spoil


# Each once trained pack 1 and then failed (a traceback, exit 1, the folder unreadable), or finished with a folder
# the report refuses (a model counted twice, a mislabelled one): refused now before anything trains.
HALF_FINISHED_CASES = [
    ("a pack folder the sweep has not", foreign_pack, "packs/7 is not a pack of this sweep"),
    ("pack 1 a link to pack 0", link_pack_1("0"), "packs/1 is a link"),
    ("pack 1 a link to the packs folder", link_pack_1("."), "packs/1 is a link"),
    ("pack 0 holding pack 1's model", relabel_pack_0(model_id=1), "its results hold models [1], not this pack's [0]"),
    ("pack 0 relabelled as another PE", relabel_pack_0(pe="sin2d"), "has pe 'sin2d', where this sweep's has"),
    ("checkpoint's training time beyond any", checkpoint_of_pack_1_with(lambda s: s.update(seconds=1e308)),
     "holds seconds 1e+308"),
    ("checkpoint's curves beyond float32", checkpoint_of_pack_1_with(lambda s: s["curves"][0].update(ood_acc=1e300)),
     "holds curves value 'ood_acc': 1e+300"),
    ("checkpoint's curves naming a PE", checkpoint_of_pack_1_with(lambda s: s["curves"][0].update(pe="<b>x</b>")),
     "holds curves value 'pe'"),
    # parquet refused a bool among the scores after training; np.isfinite raised on an int beyond float's range
    ("checkpoint's curves holding a bool", checkpoint_of_pack_1_with(lambda s: s["curves"][0].update(ood_acc=True)),
     "holds curves value 'ood_acc': True"),
    ("checkpoint's curves holding a huge int", checkpoint_of_pack_1_with(lambda s: s["curves"][0].update(x=2**70)),
     "holds curves value 'x'"),
    ("checkpoint's curves naming a column in HTML",
     checkpoint_of_pack_1_with(lambda s: s["curves"][0].update({"<b>x</b>": 0.5})), "holds curves value '<b>x</b>'"),
    # a state its pack's training could not have left: the step rewritten ran fewer steps than the results then
    # recorded; a window index beyond the window was a traceback in the first step
    ("checkpoint's step rewritten", checkpoint_of_pack_1_with(lambda s: s.update(step=3)),
     "step 3 with 0 steps since its last evaluation, at step 2"),
    ("checkpoint's window index beyond the window", checkpoint_of_pack_1_with(lambda s: s.update(filled=10**9)),
     "with 1000000000 steps since its last evaluation"),
    ("checkpoint's curves cut short", checkpoint_of_pack_1_with(lambda s: s.update(curves=s["curves"][:1])),
     "step 2 with 0 steps since its last evaluation, at step 0"),
    ("checkpoint's curves of a model the pack lacks",
     checkpoint_of_pack_1_with(lambda s: s["curves"][0].update(model=5)), "a curves row of model 5, the pack has 1"),
    # a renamed pack was left beside its retrained self; another pack's weights were kept as this one's
    ("pack 0 renamed", lambda f: (f / "packs" / "0").rename(f / "packs" / "00"),
     "packs/00 is not one of this sweep's packs or checkpoints"),
    ("pack 0 holding the weights of other models", weights_of_pack_0_as_model(7), "holds models [7]"),
    ("config.json listing a learning rate the settings do not give", config_model_1_with(lr=0.5),
     "models lists model 1 with lr 0.5"),
    ("config.json listing a model with a key no sweep writes", config_model_1_with(evil=1),
     "models lists model 1 with evil 1"),
    # a finished pack relabelled as another sweep's would have joined the results as this one's
    ("pack 0 relabelled as bf16", relabel_pack_0(precision="bf16"), "have precision 'bf16', where this sweep's"),
    ("pack 0 relabelled as pack 1", relabel_pack_0(pack=1), "have pack 1, where this sweep's pack 0 has 0"),
    # (its curves end at step 4: that the results are their last evaluation is checked first)
    ("pack 0 claiming more steps", relabel_pack_0(steps=999), "gives model 0 steps 999, its last evaluation"),
    ("pack 0 with another seed", relabel_pack_0(seed=6312), "has seed 6312"),
    # config.json's settings edited in what trains but no model lists: the packs' own records of them tell
    ("config.json's warmup edited", config_with(warmup=3),
     "config.json says --warmup 3, not 0 as {folder}/packs/0/trained_with.json records"),
    ("config.json's schedule edited, pack 0 gone", lambda f: (config_with(schedule="cosine")(f),
                                                              shutil.rmtree(f / "packs" / "0")),
     "config.json says --schedule cosine, not constant as {folder}/packs/1.checkpoint.pt records"),
    ("config.json's ntk_items edited", config_with(ntk_items=1), "says --ntk-items 1, not 8"),
    ("checkpoint's record of settings forged", checkpoint_of_pack_1_with(lambda s: s.update(trained_with="[]")),
     "1.checkpoint.pt holds a record of settings no pe_fast writes; delete it to retrain pack 1"),
    # 2**30 items from a 300 KB file: a hang with memory growing, in the curves' check or in the load's own walk
    ("checkpoint's curves holding one list many times over",
     checkpoint_of_pack_1_with(lambda s: s["curves"][0].update(x=shared_list_of(30))), "holds more than"),
    ("checkpoint's sampler holding one list many times over",
     checkpoint_of_pack_1_with(lambda s: s["sampler"].update(bomb=shared_list_of(30))), "holds more than"),
    # round 15: one stored value expanded to 2**30 (stride 0): 4.7 GB when the load made it contiguous
    ("checkpoint's tensor expanded from one value",
     checkpoint_of_pack_1_with(lambda s: s.update(loss_buffer=torch.zeros(1).expand(2**30, 1))),
     "declares 4,096 MiB once read"),
]


@pytest.mark.parametrize("spoil, must_name", [c[1:] for c in HALF_FINISHED_CASES],
                         ids=[c[0] for c in HALF_FINISHED_CASES])
def test_resume_refuses_a_tampered_pack_before_training(spoil, must_name, half_finished, tmp_path, capsys, no_lock):
    folder = tmp_path / "run"
    shutil.copytree(half_finished, folder, symlinks=True)
    spoil(folder)
    before = snapshot(folder)
    assert_one_line(capsys, sweep_main(["--resume", "--out", str(folder)]), must_name.format(folder=folder))
    assert snapshot(folder) == before


@pytest.fixture(scope="module")
def pack_0_checkpoint_as_pack_1(tmp_path_factory):
    """Two packs of one PE kind and σ, their seeds apart, pack 1 unfinished with pack 0's checkpoint (after 2 of its
    4 steps) in its place: the shapes all fit."""
    from pe_fast.sweep import grid
    from pe_fast.sweep.task_loading import load_task
    from sweep_harness import settings_of
    flags = [*without(LST, "--seeds"), "--seeds", "2", "--max-pack", "1", "--threads", "1"]
    out = tmp_path_factory.mktemp("sweep") / "run"
    threads = torch.get_num_threads()
    try:
        assert sweep_main([*flags, "--out", str(out)]) == 0
        for name in ("results.parquet", "curves.parquet", "pe_tables.npz", "summary.txt"):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / "packs" / "1")
        s = settings_of(*flags)
        packs = grid.pack_models(s, grid.expand_grid(s))
        trainer = grid.pack_trainer(s, load_task(s), packs[0])
        trainer.run(checkpoint=lambda: trainer.step == 2 and run_folder.save_checkpoint(out, 1, trainer.state_dict()),
                    checkpoint_every=2)
    finally:
        torch.set_num_threads(threads)
    return out


def test_resume_refuses_the_checkpoint_of_another_pack_of_the_same_shapes(pack_0_checkpoint_as_pack_1, capsys,
                                                                          no_lock):
    """It would have continued pack 0's models under pack 1's seeds; their initial PE, drawn from the seeds, tells
    them apart."""
    out = pack_0_checkpoint_as_pack_1
    before = snapshot(out)
    assert_one_line(capsys, sweep_main(["--resume", "--out", str(out)]), "1.checkpoint.pt is not a checkpoint of pack "
                                                                         "1 of this sweep (the initial PE of other models")
    assert snapshot(out) == before


def test_the_untampered_half_finished_sweep_resumes(half_finished, tmp_path):
    """The cases above spoil a folder that resumes: they fail for what they change. A checkpoint beside a finished
    pack (a kill as it finished, or another pack's put there) is never read, and removed."""
    folder = tmp_path / "run"
    shutil.copytree(half_finished, folder, symlinks=True)
    shutil.copy(run_folder.checkpoint_path(folder, 1), run_folder.checkpoint_path(folder, 0))
    assert sweep_main(["--resume", "--out", str(folder), "--no-report"]) == 0
    assert sorted(pd.read_parquet(folder / "results.parquet")["model_id"]) == [0, 1]
    assert sorted(p.name for p in (folder / "packs").iterdir()) == ["0", "1"]


@pytest.fixture(scope="module")
def two_finished_lst_runs(half_finished, tmp_path_factory):
    """half_finished resumed to its end, and a second run of its configuration with another seed: two folders
    that pool."""
    base = tmp_path_factory.mktemp("runs")
    first, second = base / "first", base / "second"
    shutil.copytree(half_finished, first, symlinks=True)
    threads = torch.get_num_threads()
    try:
        assert sweep_main(["--resume", "--out", str(first), "--no-report"]) == 0
        at = LST.index("--seeds")
        flags = narrowed(*LST[:at], *LST[at + 2:], "--pe", "learned,sin2d", "--sigmas", "0.2")
        assert sweep_main([*flags, "--threads", "1", "--seed-values", "6312", "--out", str(second)]) == 0
    finally:
        torch.set_num_threads(threads)
    return first, second


def test_a_weights_file_of_another_run_is_one_error(two_finished_lst_runs, tmp_path):
    """A netsim run's pack-0 weights copied into an LST run: model(0) opened a 100-token netsim model (only the ids
    were compared with config.json)."""
    from pe_fast.results.reading import ReportError, load_run
    folder = tmp_path / "run"
    shutil.copytree(two_finished_lst_runs[0], folder, symlinks=True)
    netsim = tmp_path / "netsim"
    assert sweep_main([*NETSIM, "--threads", "1", "--out", str(netsim)]) == 0
    shutil.copy(netsim / "packs" / "0" / "weights.safetensors", folder / "packs" / "0" / "weights.safetensors")
    assert load_run(two_finished_lst_runs[0]).model(0).config.num_tokens == 16  # the file it replaced opens
    # what the file holds is named before the pack's record of its files says it changed
    with pytest.raises(ReportError, match=r"weights.safetensors: holds model 0 with PE learned σ 0.5, where "
                                          r"config.json lists PE 'learned' σ 0.2: not this run's pack"):
        load_run(folder)
    # a folder without the records (an older pe_fast's, which wrote no digests nor trained_with.json): the models
    for record in [folder / run_folder.DIGESTS, *folder.glob(f"packs/*/{run_folder.DIGESTS}"),
                   *folder.glob(f"packs/*/{run_folder.TRAINED_WITH}")]:
        record.unlink()
    with pytest.raises(ReportError, match=r"weights.safetensors: (its models have|holds model 0) .*: not this run's "
                                          r"pack"):
        load_run(folder).model(0)
    # the same sweep's file with another seed: its own record says so
    shutil.copy(two_finished_lst_runs[1] / "packs" / "0" / "weights.safetensors",
                folder / "packs" / "0" / "weights.safetensors")
    with pytest.raises(ReportError, match=r"model 0 seeded 6312, where the run's results say 2235"):
        load_run(folder).model(0)


def test_a_pooled_folder_whose_sources_are_not_its_models_is_one_error(two_finished_lst_runs, tmp_path, capsys):
    """pooled_from reordered: model(0) silently opened the other folder's seed; a NUL in it: a bare ValueError."""
    from pe_fast.results.reading import ReportError, load_run
    first, second = two_finished_lst_runs
    pooled = tmp_path / "pooled"
    assert report_main([str(first), str(second), "--out", str(pooled)]) == 0
    capsys.readouterr()
    run = load_run(pooled)
    for model_id in run.model_ids():  # untampered, every model is its own
        row = run.results[run.results["model_id"] == model_id].iloc[0]
        source, source_id = run._pooled_source(model_id)
        assert source.results[source.results["model_id"] == source_id].iloc[0]["seed"] == row["seed"]
    config = json.loads((pooled / "config.json").read_text())
    for folders, message in ((config["pooled_from"][::-1], "is not the model the pooled results record"),
                             ([config["pooled_from"][0] + "\0x", config["pooled_from"][1]],
                              "pooled_from is not a list of absolute folder names"),
                             # /etc was listed, and a link there quoted; a relative name read from the caller's folder
                             (["/etc", config["pooled_from"][1]], "pooled_from names /etc, which is not a results"),
                             (["../first", config["pooled_from"][1]], "not a list of absolute folder names")):
        (pooled / "config.json").write_text(json.dumps({**config, "pooled_from": folders}))
        with pytest.raises(ReportError, match=message):
            load_run(pooled).model(0)
    # a source that trained otherwise (its steps here) with the same task, PE, σ and seeds: once opened as the model
    other = tmp_path / "other"
    shutil.copytree(first, other)
    without_trained_with(other)
    other_config = json.loads((other / "config.json").read_text())
    other_config["settings"]["steps"] = 99
    (other / "config.json").write_text(json.dumps(other_config))
    (pooled / "config.json").write_text(json.dumps({**config, "pooled_from": [str(other), config["pooled_from"][1]]}))
    with pytest.raises(ReportError, match="trained with steps = 99, .* with 4: not one run's models"):
        load_run(pooled).model(0)
    # the folder itself among its sources: every reader refuses it, not load_run's model(0) alone
    (pooled / "config.json").write_text(json.dumps({**config, "pooled_from": [str(pooled), config["pooled_from"][1]]}))
    with pytest.raises(ReportError, match="pooled_from names the folder itself, a loop"):
        load_run(pooled)
    assert_one_line(capsys, report_main([str(pooled)]), "pooled_from names the folder itself, a loop")


@pytest.mark.parametrize("scale", [1e30, 3e38])
def test_pe_tables_of_large_float32_values_report_without_a_traceback_or_warnings(scale, tmp_path, capsys):
    """Inside float32's range but near its end: the figures' SVD did not converge (a traceback), or numpy warned on
    stderr, computing in float32; the tables are read in float64."""
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD))
    table = (np.random.default_rng(0).uniform(-1, 1, (16, 8)) * scale).astype(np.float32)
    np.savez(folder / "pe_tables.npz", model_0=table, model_1=table[::-1].copy())
    assert report_main([str(folder)]) == 0
    assert "Warning" not in capsys.readouterr().err


def test_a_pe_table_of_two_axes_is_one_blocks_table(tmp_path, capsys):
    """read_pe_tables accepts [tokens, width] (one block's table), but the report indexed every table [block]: an
    AxisError after the figures."""
    from pe_fast.results.reading import load_run
    folder = minimal_run(tmp_path / "run", pd.DataFrame(GOOD))
    table = np.random.default_rng(0).normal(size=(16, 8))
    np.savez(folder / "pe_tables.npz", model_0=table, model_1=table[::-1].copy())
    np.testing.assert_array_equal(load_run(folder).pe_table(0), table[None])
    assert report_main([str(folder)]) == 0


def test_a_refused_out_folder_that_exists_is_left_untouched(two_finished_lst_runs, tmp_path, capsys):
    """--out naming someone's non-empty folder: refused in one line, but the write probe (a folder made and removed
    in it) ran first and changed the folder's modification time."""
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    os.utime(taken, ns=(10**18, 10**18))
    first, second = two_finished_lst_runs
    for refused in (lambda: sweep_main(LST + ["--out", str(taken)]),
                    lambda: report_main([str(first), str(second), "--out", str(taken)])):
        assert_one_line(capsys, refused(), f"--out {taken}")
        assert taken.stat().st_mtime_ns == 10**18 and [p.name for p in taken.iterdir()] == ["notes.txt"]


def test_an_interrupted_sweep_without_out_names_its_folder(tmp_path, capsys, monkeypatch):
    """Without --out the sweep writes runs/<task>-<date>-<time>: the line saying how to continue named "DIR"."""
    from pe_fast.sweep import cli

    def interrupted(s, write_report=None):
        raise KeyboardInterrupt
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "run", interrupted)
    assert sweep_main(LST) == 130
    err = capsys.readouterr().err
    assert re.search(r"continue with python -m pe_fast.sweep --resume --out runs/lst-\d{8}-\d{6}\n", err), err


def test_a_link_named_as_a_partial_file_is_removed_not_followed(tmp_path):
    """packs/.x.partial-1 a link to pack 0: --resume's clean-up called rmtree on it and stopped with "Cannot call
    rmtree on a symbolic link" and advice to free space (issue 55); the link goes, pack 0 stays."""
    out = tmp_path / "run"
    (out / "packs" / "0").mkdir(parents=True)
    (out / "packs" / "0" / "kept.txt").write_text("pack 0")
    (out / "packs" / f".x{run_folder.PARTIAL}1").symlink_to("0")
    run_folder.remove_partials(out)
    assert sorted(p.name for p in (out / "packs").iterdir()) == ["0"]
    assert (out / "packs" / "0" / "kept.txt").read_text() == "pack 0"
