"""The sweep as users run it, shared by the tests that start it: `python -m pe_fast.sweep` in a process of its
own (or its main in this one, for refusals), its settings as the command line makes them, and a network simulation
small enough for a test."""
import contextlib
import fcntl
import io
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from pe_fast.results.settings import Settings
from pe_fast.sweep.settings import build_parser, from_flags

# 12 nodes in 3 modules and a one-block width-16 model: a model-step takes about a millisecond
TINY_NETSIM = ["--task", "netsim", "--nodes", "12", "--modules", "3", "--timepoints", "200", "--runs", "4",
               "--width", "16", "--depth", "1", "--batch-size", "16"]


def sweep_command(*args) -> list[str]:
    return [sys.executable, "-m", "pe_fast.sweep", *args]


def run_sweep(*args, cwd=None, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(sweep_command(*args), capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def sweep_in_process(*args, cwd=None) -> subprocess.CompletedProcess:
    """run_sweep without a process of its own: the same main, called in this process (a process spends about 4 s
    starting Python and importing torch). Its exit code, stdout and stderr as run_sweep gives them; torch's threads
    and the working folder as they were. For a test of what the sweep computes or refuses; a test of the command as
    typed (its exit, its signals, its environment) runs run_sweep."""
    from pe_fast.sweep.program import main
    out, err = io.StringIO(), io.StringIO()
    threads, here = torch.get_num_threads(), os.getcwd()
    try:
        os.chdir(cwd or here)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exit_:  # argparse's own refusals
                code = exit_.code
    finally:
        os.chdir(here)
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def refuse_sweep(*args, cwd=None) -> subprocess.CompletedProcess:
    """sweep_in_process for a command the sweep must refuse before it runs anything."""
    return sweep_in_process(*args, cwd=cwd)


def without_read_override() -> list[str]:
    """The command prefix that runs a process without the superuser's override of file modes: root reads a
    mode-000 file, and CI runs as root. pytest.skip where that cannot be dropped."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv (util-linux): a mode-000 file stays readable to root")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def start_sweep(*args, env=None) -> subprocess.Popen:
    return subprocess.Popen(sweep_command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def sweep_results(out, *args) -> pd.DataFrame:
    """results.parquet of a sweep that must succeed (no report: the tests read the table), run in this process."""
    done = sweep_in_process(*narrowed(*args, "--no-report", "--out", str(out)))
    assert done.returncode == 0, done.stderr
    return pd.read_parquet(out / "results.parquet")


TIMING = ["train_seconds"]


def same_results(run, reference, tables: int):
    """Two runs' folders hold equal results, curves and `tables` equal entries of pe_tables.npz (exactly: the same
    settings train the same numbers on any executor); only the training times differ."""
    for name in ("results.parquet", "curves.parquet"):
        got, want = pd.read_parquet(run / name), pd.read_parquet(reference / name)
        pd.testing.assert_frame_equal(got.drop(columns=TIMING, errors="ignore"),
                                      want.drop(columns=TIMING, errors="ignore"), check_exact=True)
    with np.load(run / "pe_tables.npz") as got, np.load(reference / "pe_tables.npz") as want:
        assert sorted(got.files) == sorted(want.files) and len(got.files) == tables
        for key in want.files:
            np.testing.assert_array_equal(got[key], want[key])


def narrowed(*args) -> list[str]:
    """A base command with the flags given after it in place of its own (LST + ["--steps", "8"] trains 8 steps):
    the sweep refuses a flag given twice, so a test that narrows a base command gives each flag once, at its first
    place with its last value. The flags that collect (--slurm-option) and on/off flags are kept as given."""
    actions = build_parser()._option_string_actions
    order, values, kept = [], {}, []
    args = list(args)
    i = 0
    while i < len(args):
        flag = args[i].partition("=")[0]
        action = actions.get(flag)
        takes_one = action is not None and action.nargs is None and action.option_strings[0] != "--slurm-option"
        if not takes_one:
            kept.append((len(order), args[i]))
            i += 1
            continue
        value = args[i].partition("=")[2] if "=" in args[i] else args[i + 1]
        if flag not in values:
            order.append(flag)
        values[flag] = value
        i += 1 if "=" in args[i] else 2
    out = []
    for position, flag in enumerate(order + [None]):
        out += [token for at, token in kept if at == position]
        if flag is not None:
            out += [flag, values[flag]]
    return out


def settings_of(*args) -> Settings:
    return from_flags(build_parser().parse_args([*narrowed(*args), "--out", "unused"]))


@contextlib.contextmanager
def ray_alone():
    """One Ray-using test at a time across pytest's parallel workers: `ray stop --force`, which each of them runs
    to clean up, stops every Ray on the machine, another test's included."""
    with open(Path(tempfile.gettempdir()) / "pe_fast_tests_ray.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
