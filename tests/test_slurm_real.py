"""--executor slurm against a real single-node SLURM (slurmctld, slurmd and munged started by
tests/slurm_cluster.py; the tests skip with the reason where they cannot be): the packs go through sbatch as one
job array, are waited for through squeue, a failed job is one line, a cancelled one continues with --resume."""
import json
import os
import pickle
import subprocess
import time
from pathlib import Path

import pytest

from slurm_cluster import slurm_cluster
from sweep_harness import run_sweep, same_results, start_sweep

pytest.importorskip("submitit")

# 3 packs of one model each (learned σ 0.2, learned σ 2, sin2d), a second or two of training each
# (a checkpoint every 10 steps: a job can be cancelled between two)
SWEEP = ["--task", "lst", "--preset", "cpu", "--seeds", "1", "--width", "16", "--depth", "1", "--mlp-width", "32",
         "--threads", "1", "--max-pack", "1", "--steps", "100", "--eval-every", "50", "--checkpoint-every", "10",
         "--no-report"]
TABLES = 2 * 3  # 3 models' PE tables and attention maps


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The cluster's environment: SLURM_CONF for sbatch, squeue and scancel, in the sweeps' and the jobs'."""
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as env:
        yield env


def local_run(out: Path, flags) -> Path:
    done = run_sweep(*flags, "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """SWEEP on the local executor."""
    return local_run(tmp_path_factory.mktemp("reference") / "local", SWEEP)


def slowed_in_jobs(tmp_path: Path, cluster: dict, seconds_per_step: float) -> dict:
    """The cluster's environment with every training step inside a SLURM job taking seconds_per_step longer (a
    sitecustomize on the jobs' PYTHONPATH): how long a pack runs under SLURM no longer depends on how fast this
    machine trains, and the results are unchanged (sleeping computes nothing)."""
    hook = tmp_path / "slow_hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os\n"
        "if os.environ.get('SLURM_JOB_ID'):\n"
        "    import time\n"
        "    from pe_fast.train import PackTrainer\n"
        "    fast_step = PackTrainer.train_step\n"
        "    def slow_step(self):\n"
        f"        time.sleep({seconds_per_step})\n"
        "        return fast_step(self)\n"
        "    PackTrainer.train_step = slow_step\n")
    return {**cluster, "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), cluster.get("PYTHONPATH")]))}


def jobs_of(out) -> dict:
    path = out / "slurm" / "jobs.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def squeue(env, *args) -> str:
    return subprocess.run(["squeue", "-h", *args], capture_output=True, text=True, env=env, timeout=30).stdout


def test_packs_run_as_a_job_array_and_equal_a_local_run(tmp_path, cluster, reference):
    out = tmp_path / "slurm_run"
    done = run_sweep(*SWEEP, "--executor", "slurm", "--out", str(out), env=cluster)
    assert done.returncode == 0, done.stderr
    assert "3 pack jobs submitted to SLURM" in done.stderr, done.stderr
    jobs = jobs_of(out)
    assert sorted(jobs) == ["0", "1", "2"] and len({job.split("_")[0] for job in jobs.values()}) == 1, jobs  # one array
    deadline = time.monotonic() + 30  # SLURM ran them (not a local process), and ends them once python has
    while not all(f"{job} COMPLETED" in (states := squeue(cluster, "-t", "all", "-o", "%i %T"))
                  for job in jobs.values()):
        assert time.monotonic() < deadline, states
        time.sleep(0.5)
    same_results(out, reference, TABLES)


def test_a_failed_job_is_one_line_and_resume_retrains_only_its_pack(tmp_path, cluster, reference):
    """Pack 1's job dies as python starts (a sitecustomize on its PYTHONPATH exits 1 inside that SLURM task only):
    no result, SLURM marks it FAILED. The sweep says so in one line naming the job and its log, exit 1; --resume
    submits that pack alone."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os\nif os.environ.get('SLURM_ARRAY_TASK_ID') == '1':\n    os._exit(1)\n")
    out = tmp_path / "slurm_run"
    env = {**cluster, "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), cluster.get("PYTHONPATH")]))}
    done = run_sweep(*SWEEP, "--executor", "slurm", "--out", str(out), env=env)
    assert done.returncode == 1, done.stderr
    job = jobs_of(out)["1"]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and f"pack 1's job {job} failed" in errors[0] and "--resume" in errors[0], done.stderr
    log = errors[0].split("its log: ")[1].split(";")[0]
    assert Path(log).parent == (out / "slurm").resolve() and job in log, errors[0]
    assert "Traceback" not in done.stderr, done.stderr
    assert f"{job} FAILED" in squeue(cluster, "-t", "all", "-o", "%i %T")
    resumed = run_sweep("--resume", "--out", str(out), env=cluster)
    assert resumed.returncode == 0, resumed.stderr
    assert "1 pack jobs submitted to SLURM" in resumed.stderr, resumed.stderr
    assert jobs_of(out)["1"] != job
    same_results(out, reference, TABLES)


def test_a_job_cancelled_mid_pack_resumes_from_its_checkpoint(tmp_path, cluster, reference):
    """scancel on pack 0's job after its first checkpoint (the job is suspended first, so that it cannot finish in
    between): the sweep names the job, exit 1; --resume submits that pack again, it continues from the checkpoint,
    and the results equal a local run's."""
    out = tmp_path / "slurm_run"
    # 100 steps of at least 20 ms: pack 0 is still training seconds after its first checkpoint, however fast
    proc = start_sweep(*SWEEP, "--executor", "slurm", "--out", str(out), env=slowed_in_jobs(tmp_path, cluster, 0.02))
    try:
        deadline = time.monotonic() + 120
        while not ((out / "packs" / "0.checkpoint.pt").exists() and "0" in jobs_of(out)):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "no checkpoint of pack 0 within 120 s"
            time.sleep(0.1)
        job = jobs_of(out)["0"]
        subprocess.run(["scontrol", "suspend", job], env=cluster, check=True, capture_output=True, timeout=30)
        assert not (out / "packs" / "0").exists()  # mid-pack
        subprocess.run(["scancel", job], env=cluster, check=True, capture_output=True, timeout=30)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert f"pack 0's job {job} failed" in err and "--resume" in err, err
    resumed = run_sweep("--resume", "--out", str(out), env=cluster)
    assert resumed.returncode == 0, resumed.stderr
    new_job = jobs_of(out)["0"]
    assert new_job != job
    with open(out / "slurm" / f"{new_job}_0_result.pkl", "rb") as f:
        outcome, result = pickle.load(f)
    assert outcome == "success" and 0 < result["trained_steps"] < 100, result  # continued, not restarted
    same_results(out, reference, TABLES)


def test_a_job_past_its_time_limit_is_requeued_and_continues_to_equal_results(tmp_path, cluster):
    """--slurm-time 1 and a pack that needs longer (its steps slowed down inside SLURM): SLURM signals the job before its limit, submitit requeues it, it
    continues from its checkpoint, round after round, and the results equal an uninterrupted local run's (run
    beside it). When the signal comes is tested on the batch script (test_sweep_scale.py)."""
    # 2,000 steps of at least 35 ms: 70 s and more in SLURM, past the 1-minute limit however fast this machine is
    long = [*SWEEP[:SWEEP.index("--max-pack")], "--sigmas", "0.2", "--pe", "learned", "--steps", "2000",
            "--eval-every", "1000", "--checkpoint-every", "200", "--no-report"]
    local = start_sweep(*long, "--out", str(tmp_path / "local"))
    try:
        out = tmp_path / "slurm_run"
        done = run_sweep(*long, "--executor", "slurm", "--slurm-time", "1", "--out", str(out),
                         env=slowed_in_jobs(tmp_path, cluster, 0.035), timeout=900)
        assert done.returncode == 0, done.stderr
        _, err = local.communicate(timeout=300)
    finally:
        if local.poll() is None:
            local.kill()
    assert local.returncode == 0, err
    logs = "".join(path.read_text() for path in (out / "slurm").glob("*_log.out"))
    assert "Requeued job" in logs, logs[-2000:]  # it did hit its limit at least once
    same_results(out, tmp_path / "local", 2)
