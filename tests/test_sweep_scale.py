"""Sweeps at scale: a real sweep killed (SIGKILL) twice and resumed ends with exactly the results of an
uninterrupted run; one writer per folder (a live lock refuses, a stale one is taken over); the pack size from
the memory estimate (checked against the tensors a real training step keeps); the Ray and SLURM executors give the
local executor's results, Ray also when a worker is killed mid-pack and the sweep resumed, SLURM when a job is
preempted and requeued, or its driver killed and rerun."""
import contextlib
import dataclasses
import importlib.util
import json
import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pe_fast import memory
from pe_fast.results import run_folder
from pe_fast.sweep import executors, grid, runtime, settings
from pe_fast.sweep.cli import main
from pe_fast.sweep.task_loading import load_task
from pe_fast.models import ModelConfig
from pe_fast.train import make_optimizer, TrainConfig
from sweep_harness import TINY_NETSIM, narrowed, ray_alone, refuse_sweep, run_sweep, same_results, start_sweep, sweep_command

# A tiny network simulation: 3 packs of 2 models, a few seconds of training each, a checkpoint every 10 steps.
# Long enough (160 steps a pack) that the kills below land before the end. Two learning rates: the middle pack
# holds one model of each, so its optimizer is the stacked one with per-model rates, the others torch's.
NETSIM = [*TINY_NETSIM, "--seeds", "1", "--pe", "learned",
          "--sigmas", "0.1,1,2", "--lr", "1e-3,3e-3", "--max-pack", "2", "--steps", "160", "--eval-every", "80",
          "--checkpoint-every", "10", "--threads", "1", "--no-report"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run of the local executor."""
    out = tmp_path_factory.mktemp("reference") / "run"
    proc = run_sweep(*NETSIM, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def assert_same_results(run, reference):
    same_results(run, reference, tables=2 * 6)  # 6 models' PE tables and attention maps


def wait_for(condition, proc, timeout=300):
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the sweep ended early: {proc.communicate()[1]}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def checkpoints(out):
    return {p.name: p.stat().st_mtime_ns for p in (out / "packs").glob("*.checkpoint.pt")} \
        if (out / "packs").is_dir() else {}


def progress_marks(out):
    """Checkpoints (name, time) and finished packs: changes whenever the sweep saves anything."""
    return set(checkpoints(out).items()) | run_folder.finished_packs(out)


def test_a_terminated_sweep_releases_its_lock_and_resumes_equal(tmp_path, reference, capsys):
    """SIGTERM (kill's default, a scheduler's stop) ends the sweep as Ctrl-C does: one line saying how to continue,
    exit 143, its lock released (the default action left DIR/.lock for the resume to take over with a notice)."""
    out = tmp_path / "run"
    proc = start_sweep(*NETSIM, "--out", str(out))
    wait_for(lambda: checkpoints(out), proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == (f"terminated; the finished packs and checkpoints are kept: continue "
                                            f"with python -m pe_fast.sweep --resume --out {out}"), err
    assert not (out / ".lock").exists()
    threads = torch.get_num_threads()
    try:
        assert main(["--resume", "--out", str(out), "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    assert "stale lock" not in capsys.readouterr().err
    assert_same_results(out, reference)


def test_killed_twice_and_resumed_equals_uninterrupted(tmp_path, reference, capsys):
    rng = random.Random()
    out = tmp_path / "run"
    first = start_sweep(*NETSIM, "--out", str(out))
    wait_for(lambda: checkpoints(out), first)
    # While it runs, a second sweep on the folder is refused, naming the writer.
    for args in (["--resume", "--out", str(out)], [*NETSIM, "--out", str(out)]):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"pid {first.pid}" in err and len(err.strip().splitlines()) == 1, err
    time.sleep(rng.uniform(0, 0.5))
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert first.returncode == -signal.SIGKILL

    second = start_sweep("--resume", "--out", str(out), "--threads", "1")
    seen = progress_marks(out)
    wait_for(lambda: progress_marks(out) - seen, second)  # it has saved something of its own
    time.sleep(rng.uniform(0, 0.1))
    second.send_signal(signal.SIGKILL)
    _, err = second.communicate()
    assert second.returncode == -signal.SIGKILL
    assert f"taking over the stale lock of pid {first.pid}" in err

    # The last resume runs to the end in this process (one Python start-up less).
    threads = torch.get_num_threads()
    try:
        assert main(["--resume", "--out", str(out), "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    assert f"taking over the stale lock of pid {second.pid}" in err
    assert "packs 3/3  models 6/6" in err  # the progress line counts the packs finished before the resume
    assert_same_results(out, reference)
    assert not (out / ".lock").exists() and not checkpoints(out)
    leftovers = [p for folder in (out, out / "packs") for p in folder.iterdir() if run_folder.PARTIAL in p.name]
    assert not leftovers
    config = json.loads((out / "config.json").read_text())
    assert config["packs"] == [[0, 1], [2, 3], [4, 5]]


def test_resume_refuses_changed_settings_and_missing_folder(tmp_path, reference, capsys):
    assert main(["--resume", "--out", str(reference), "--steps", "50"]) == 2
    assert "--steps 50 differs from its 160" in capsys.readouterr().err
    # the same command again, with --resume: every value equals the recorded one
    assert main([*NETSIM, "--out", str(reference), "--resume"]) == 0
    assert "nothing to resume" in capsys.readouterr().err
    assert main(["--resume", "--out", str(tmp_path / "nothing")]) == 2
    assert "config.json does not exist" in capsys.readouterr().err
    assert main(["--resume", "--out", str(reference)]) == 0  # finished: nothing to do
    assert "nothing to resume" in capsys.readouterr().err


def test_lock_refuses_live_writer_and_takes_over_stale_one(tmp_path):
    out = tmp_path / "run"
    notices = []
    run_folder.acquire_lock(out, notices.append)
    held = json.loads((out / ".lock").read_text())
    assert held["pid"] == os.getpid() and held["host"] and held["started"]
    with pytest.raises(run_folder.FolderLocked, match=f"pid {os.getpid()}"):
        run_folder.acquire_lock(out, notices.append)
    # A lock left by a process that has exited is stale.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / ".lock").write_text(json.dumps({**held, "pid": dead.pid}))
    run_folder.acquire_lock(out, notices.append)
    assert len(notices) == 1 and f"pid {dead.pid}" in notices[0]
    assert json.loads((out / ".lock").read_text())["pid"] == os.getpid()
    run_folder.release_lock(out)
    assert not (out / ".lock").exists()


def test_executor_ray_without_ray_is_one_line(tmp_path, capsys, monkeypatch):
    real = runtime.importlib.util.find_spec
    monkeypatch.setattr(runtime.importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    out = tmp_path / "run"
    assert main([*NETSIM, "--executor", "ray", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install" in err[0] and "ray" in err[0]
    assert not out.exists()


def test_ray_executor_from_the_command_line_equals_local(tmp_path, reference):
    """python -m pe_fast.sweep --executor ray: a local Ray instance started by the sweep (run as __main__, the Ray
    task's function must be importable by the workers: it once was not)."""
    pytest.importorskip("ray")
    out = tmp_path / "run"
    with ray_alone():
        proc = run_sweep(*NETSIM, "--executor", "ray", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert_same_results(out, reference)
    assert not list((out / "packs").glob("*.step"))  # the workers' step reports went with their finished packs


@contextlib.contextmanager
def ray_cluster():
    """`ray start --head` with 2 CPUs, as the README's cluster recipe starts one (and `ray stop --force` after):
    yields the environment in which --ray-address auto finds it. Ray alone on the machine meanwhile."""
    pytest.importorskip("ray")
    ray_cli = Path(sys.executable).with_name("ray")
    # A cluster of this test's own, in a short folder: Ray's socket paths must stay under 108 bytes.
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    env = {**os.environ, "RAY_TMPDIR": ray_dir}
    with ray_alone():
        try:
            started = subprocess.run([str(ray_cli), "start", "--head", "--num-cpus", "2", "--include-dashboard=false",
                                      "--disable-usage-stats"], capture_output=True, text=True, env=env, timeout=300)
            assert started.returncode == 0, started.stderr
            yield env
        finally:
            subprocess.run([str(ray_cli), "stop", "--force"], capture_output=True, env=env, timeout=120)
            shutil.rmtree(ray_dir, ignore_errors=True)


def test_ray_executor_joins_a_running_cluster(tmp_path, reference):
    """`ray start --head`, then --ray-address auto, as the README's cluster recipe does."""
    out = tmp_path / "run"
    with ray_cluster() as env:
        proc = run_sweep(*NETSIM, "--executor", "ray", "--ray-address", "auto", "--out", str(out), env=env)
        # The cluster by its address: ray.init sends its token only with RAY_AUTH_MODE=token (auto finds it
        # unasked), and without it fails after the folder was written; refused before, saying so
        token_auth = importlib.util.find_spec("ray._private.authentication") is not None
        named = refuse_sweep(*NETSIM, "--executor", "ray", "--ray-address", "127.0.0.1:6379", "--out",
                             str(tmp_path / "named"))
    assert proc.returncode == 0, proc.stderr
    assert_same_results(out, reference)
    if token_auth and "RAY_AUTH_MODE" not in os.environ:
        assert named.returncode == 2 and named.stderr.count("\n") == 1, named.stderr
        assert "wants a token this machine does not send; set RAY_AUTH_MODE=token" in named.stderr, named.stderr
        assert not (tmp_path / "named").exists()


def pack_workers() -> list[int]:
    """The processes of Ray workers training a pack (Ray titles a worker by its task while it runs one)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes().startswith(b"ray::pack_job"):
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def test_ray_worker_killed_mid_pack_is_one_line_and_resumes(tmp_path, reference):
    """A Ray worker killed (SIGKILL) mid-pack, after its pack's first checkpoint, on a cluster of 2 CPUs: Ray does
    not retry the task (max_retries=0), so the sweep stops (exit 1) with one line naming the pack and --resume; the
    same command with --resume continues it from its checkpoint and ends with the uninterrupted run's results."""
    out = tmp_path / "run"
    command = [*NETSIM, "--executor", "ray", "--ray-address", "auto", "--out", str(out)]
    with ray_cluster() as env:
        proc = start_sweep(*command, env=env)
        try:
            # Two packs train at once (2 CPUs): once both have a checkpoint, either worker's pack has one.
            wait_for(lambda: len(checkpoints(out)) == 2 and len(pack_workers()) == 2, proc)
            os.kill(pack_workers()[0], signal.SIGKILL)
            _, err = proc.communicate(timeout=300)
        finally:
            proc.kill()
        assert proc.returncode == 1, err
        last = err.strip().splitlines()[-1]
        failed = re.fullmatch(r"error: pack (\d+)'s Ray task failed \(WorkerCrashedError: .*\); rerun with --resume "
                              r"to continue from its checkpoint", last)
        assert failed and "Traceback" not in err, err
        assert f"{failed[1]}.checkpoint.pt" in checkpoints(out)  # what --resume continues from
        resumed = run_sweep(*command, "--resume", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_results(out, reference)


def slurm_jobs(out) -> dict:
    path = out / "slurm" / "jobs.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def child_of(pid: str) -> int | None:
    """A process whose parent is `pid` (/proc/<pid>/stat: "pid (comm) state ppid ...")."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == pid:
            return int(stat.parent.name)
    return None


def stop_jobs(jobs: dict):
    """A failed test leaves no local job training on."""
    for controller in jobs.values():
        try:
            os.kill(int(controller), signal.SIGKILL)
        except OSError:
            pass


def test_slurm_job_preempted_requeued_and_continued_equals_local(tmp_path, reference):
    """--executor slurm through submitit's local executor: one job per pack. Pack 0's job gets SIGUSR2, the
    signal SLURM sends before a preemption or the time limit, after its first checkpoint: submitit requeues it,
    it continues from that checkpoint (it trains fewer than all steps), and the results equal the local run's."""
    pytest.importorskip("submitit")
    out = tmp_path / "run"
    proc = start_sweep(*NETSIM, "--executor", "slurm", "--slurm-local", "--out", str(out))
    try:
        wait_for(lambda: (out / "packs" / "0.checkpoint.pt").exists() and child_of(slurm_jobs(out).get("0", "")),
                 proc)
        os.kill(child_of(slurm_jobs(out)["0"]), signal.SIGUSR2)
        _, err = proc.communicate(timeout=600)
    finally:
        stop_jobs(slurm_jobs(out))
    assert proc.returncode == 0, err
    assert_same_results(out, reference)
    job = slurm_jobs(out)["0"]
    log = (out / "slurm" / f"{job}_0_log.err").read_text()
    assert "Caught signal SIGUSR2" in log and "this job is preempted" in log, log
    with open(out / "slurm" / f"{job}_0_result.pkl", "rb") as f:
        outcome, result = pickle.load(f)
    assert outcome == "success" and 0 < result["trained_steps"] < 160, result  # resumed, not restarted


def test_slurm_driver_killed_and_resumed_waits_for_its_running_jobs(tmp_path, reference):
    """The driver dies (SIGKILL) while its jobs train; --resume finds them running and waits for them instead of
    submitting their packs again. The jobs are paused (SIGSTOP) from before the kill until the resume has found
    them, so that none can finish in between."""
    pytest.importorskip("submitit")
    out = tmp_path / "run"
    with open(tmp_path / "first.log", "w") as log:  # the orphaned jobs keep writing: no pipe they could fill
        first = subprocess.Popen(sweep_command(*NETSIM, "--executor", "slurm", "--slurm-local", "--out", str(out)),
                                 stdout=log, stderr=log)
    try:
        wait_for(lambda: checkpoints(out) and len(slurm_jobs(out)) == 3
                 and all(child_of(job) for job in slurm_jobs(out).values()), first)
        jobs = slurm_jobs(out)
        tasks = [child_of(job) for job in jobs.values()]
        running = [task for task in tasks if task is not None and os.kill(task, signal.SIGSTOP) is None]
        first.send_signal(signal.SIGKILL)
        first.wait()
        second = start_sweep("--resume", "--out", str(out))
        lines = []
        while not lines or "pack jobs submitted" not in lines[-1]:
            lines.append(second.stderr.readline())
            assert lines[-1], "".join(lines)
        for task in running:
            os.kill(task, signal.SIGCONT)
        _, err = second.communicate(timeout=600)
    finally:
        stop_jobs(slurm_jobs(out))
    assert second.returncode == 0, err
    assert f"0 pack jobs submitted to submitit's local executor, {len(running)} still running from before" \
        in lines[-1], lines[-1]
    assert slurm_jobs(out) == jobs
    assert_same_results(out, reference)


@pytest.fixture
def fake_srun(tmp_path, monkeypatch):
    """submitit writes a batch script only where an srun is on the PATH: an empty one."""
    pytest.importorskip("submitit")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexit 0\n")
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")


def test_slurm_batch_script_carries_the_flags(tmp_path, fake_srun):
    """What sbatch would receive (submitit writes the script; no SLURM needed beyond an srun on the PATH)."""
    args = settings.build_parser().parse_args(
        [*NETSIM, "--executor", "slurm", "--slurm-local", "--slurm-partition", "gpu", "--slurm-time", "90",
         "--slurm-account", "lab", "--slurm-option", "qos=short", "--slurm-option", "constraint=a100"])
    s = dataclasses.replace(settings.from_flags(args), slurm_local=False, device="cuda")
    script = executors.slurm_executor(s, tmp_path / "slurm")._executor._make_submission_file_text("true", "uid")
    for line in ("--partition=gpu", "--time=90", "--account=lab", "--qos=short", "--constraint=a100",
                 "--cpus-per-task=1", "--gpus-per-node=1", "--signal=USR2@90"):
        assert f"#SBATCH {line}" in script, script


@pytest.mark.parametrize("minutes, signal_s", [(1, 15), (2, 30), (6, 90), (60, 90)])
def test_the_time_limit_signal_leaves_the_job_most_of_its_minutes(minutes, signal_s, tmp_path, fake_srun):
    """submitit's checkpoint signal comes at most a quarter of the limit before it (90 s at most): with its own
    90 s, a real SLURM signalled a 1-minute job as it started, round after round (2026-12-04)."""
    # parsed with --slurm-local, which needs no SLURM cluster to answer, then the script sbatch would receive
    args = settings.build_parser().parse_args([*NETSIM, "--executor", "slurm", "--slurm-local", "--slurm-time",
                                               str(minutes)])
    s = dataclasses.replace(settings.from_flags(args), slurm_local=False)
    script = executors.slurm_executor(s, tmp_path / "slurm")._executor._make_submission_file_text("true", "uid")
    assert f"#SBATCH --time={minutes}\n" in script and f"#SBATCH --signal=USR2@{signal_s}\n" in script, script


# ---- packs by memory ---------------------------------------------------------------------------------------


def measured_training_bytes(config: ModelConfig, batch_size: int) -> int:
    """Bytes of one model's training step, summed from the real tensors: weights, gradients and Adam state
    after a step, plus every distinct tensor the forward pass saves for the backward."""
    from pe_fast.models import StackedTransformer
    model = StackedTransformer(config, [0], [0.5])
    optimizer = make_optimizer(model.parameters(), TrainConfig(steps=1, optimizer="adam"))
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    tokens = torch.randn(1, batch_size, config.num_tokens, config.token_dim)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        outputs, _ = model(tokens)
    outputs.square().mean().backward()
    optimizer.step()
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    weights = [*model.parameters(), *(p.grad for p in model.parameters()), *state]
    return sum(t.numel() * t.element_size() for t in weights) + sum(saved.values())


def test_memory_estimate_is_monotone_and_near_a_measured_step():
    base = dict(num_tokens=24, token_dim=3, out_dim=2, width=32, depth=2, heads=2, mlp_width=128)
    config = ModelConfig(**base)
    estimate = memory.bytes_per_model(config, 16, "adam", backend="cpp")
    measured = measured_training_bytes(config, 16)
    assert measured / 2 <= estimate <= 2 * measured, (estimate, measured)
    bigger = [ModelConfig(**{**base, "width": 64}), ModelConfig(**{**base, "depth": 3}),
              ModelConfig(**{**base, "num_tokens": 48}), ModelConfig(**{**base, "mlp_width": 256})]
    for other in bigger:
        assert memory.bytes_per_model(other, 16, "adam") > memory.bytes_per_model(config, 16, "adam")
    assert memory.bytes_per_model(config, 32, "adam") > memory.bytes_per_model(config, 16, "adam")
    # The reference backend materialises the attention map: [B, H, N, N] floats, several times.
    assert memory.bytes_per_model(config, 16, "adam", backend="reference") - estimate >= 16 * 2 * 24 * 24 * 4
    assert memory.pack_size(1000, 10_000) == 5 and memory.pack_size(1000, 10) == 1
    assert memory.free_bytes(torch.device("cpu")) > 0


def test_pack_size_follows_free_memory_and_packs_split_by_pe(monkeypatch):
    args = settings.build_parser().parse_args(narrowed(*NETSIM[:NETSIM.index("--max-pack")], "--pe", "learned,none"))
    s = settings.from_flags(args)
    task = load_task(s)
    from pe_fast.ops.backends import resolve_backend
    per_model = memory.bytes_per_model(grid.model_config(s, task, "learned"), s.batch_size, s.optimizer[0],
                                       resolve_backend(None, torch.device("cpu")))
    monkeypatch.setattr(memory, "free_bytes", lambda device: 2 * 4 * per_model + 1)  # half of it: 4 models
    assert grid.choose_pack_size(s, task) == 4
    packs = grid.split_into_packs(grid.expand_grid(s), 4)
    # 6 learned models with room for 4: two packs of 3 (near-equal sizes), then the 2 of the other PE
    assert [[m["pe"] for m in p] for p in packs] == [["learned"] * 3, ["learned"] * 3, ["none"] * 2]
    sizes = [len(p) for p in grid.split_into_packs([dict(pe="learned")] * 315, 301)]
    assert sizes == [158, 157]
    assert grid.choose_pack_size(dataclasses.replace(s, max_pack=3), task) == 3



FAULTS_OF_REPEATED_BIG_TENSORS = """
import resource, sys, torch
from pe_fast import memory
if sys.argv[1] == "keep":
    assert memory.keep_freed_memory()
for _ in range(12):  # 64 MiB, allocated and freed: glibc's heap settles after a few rounds
    torch.ones(16 * 2 ** 20)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    torch.ones(16 * 2 ** 20)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_keep_freed_memory_stops_page_faults_on_reused_blocks():
    """A training step frees and reallocates the same big blocks: with keep_freed_memory the heap reuses them
    (after warming up); by default each 64 MiB tensor is a fresh mmap that faults in 16,384 pages again."""
    def faults(mode):
        run = subprocess.run([sys.executable, "-c", FAULTS_OF_REPEATED_BIG_TENSORS, mode], capture_output=True,
                             text=True, check=True)
        return int(run.stdout.split()[-1])
    assert faults("default") > 5 * 10_000
    assert faults("keep") < 1_000


def test_checkpoints_with_numpy_data_load_and_code_does_not(tmp_path):
    """Checkpoints written before 2026-11-26 hold numpy arrays and scalars: those load (as data); a pickled
    callable does not."""
    (tmp_path / "packs").mkdir()
    state = {"initial_pe": [np.arange(6, dtype=np.float32).reshape(2, 3)], "curves": [{"pe_rsa": np.float64(0.5)}],
             "flags": np.array([True, False]), "ids": np.arange(3)}
    torch.save(state, run_folder.checkpoint_path(tmp_path, 0))
    loaded = run_folder.load_checkpoint(tmp_path, 0)
    np.testing.assert_array_equal(loaded["initial_pe"][0], state["initial_pe"][0])
    assert loaded["curves"][0]["pe_rsa"] == 0.5 and loaded["ids"].tolist() == [0, 1, 2]
    run_folder.check_checkpoint(tmp_path, 0, keys=tuple(state), steps=1)
    torch.save({"step": 1, "call": os.getcwd}, run_folder.checkpoint_path(tmp_path, 1))
    with pytest.raises(run_folder.UnreadableCheckpoint, match="1.checkpoint.pt cannot be loaded safely"):
        run_folder.check_checkpoint(tmp_path, 1, keys=("step",), steps=1)
