"""A single-node SLURM for the tests: munged (unless one already answers), slurmctld and slurmd, started as root
from a slurm.conf written to a folder of their own, on free ports, and stopped at the end. Where it cannot run
(not root, slurm-wlm or munge not installed, a daemon that does not come up) the tests that use it skip with one
line saying why. The same recipe by hand: docs/developers.md, "Tests"."""
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

DAEMONS = ("munged", "munge", "slurmctld", "slurmd", "sinfo", "sbatch", "srun", "squeue", "scancel")
UP_S = 30  # how long each daemon has to answer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def slurm_conf(folder: Path, host: str, cpus: int) -> str:
    ports = free_port(), free_port()
    return "\n".join([
        "ClusterName=pefasttest", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={ports[0]}", f"SlurmdPort={ports[1]}", "AuthType=auth/munge", "CredType=cred/munge",
        f"StateSaveLocation={folder}/state", f"SlurmdSpoolDir={folder}/spool",
        f"SlurmctldPidFile={folder}/slurmctld.pid", f"SlurmdPidFile={folder}/slurmd.pid",
        f"SlurmctldLogFile={folder}/slurmctld.log", f"SlurmdLogFile={folder}/slurmd.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "ReturnToService=2", "MpiDefault=none", "SwitchType=switch/none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none", "KillWait=2", "SchedulerParameters=sched_interval=1",
        # a requeued job waits this long before it runs again (the default 120 s would make a time-limit test long)
        "AuthInfo=cred_expire=15",
        f"NodeName={host} CPUs={cpus} State=UNKNOWN",
        f"PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP", ""])


def answers(command: list[str], env=None) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=10, env=env).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def wait_until(condition, seconds=UP_S) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.3)
    return True


def node_state(env) -> str:
    done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env, timeout=10)
    return done.stdout.strip()


def stop(*pid_files: Path):
    """SIGTERM to the daemons of these pid files (those that have one), SIGKILL to any still there after 10 s."""
    pids = []
    for pid_file in pid_files:
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGTERM)
            pids.append(pid)
    if not wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), 10):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def slurm_cluster(folder: Path):
    """Yield the environment (os.environ with SLURM_CONF) in which sbatch, squeue and scancel reach the cluster;
    pytest.skip with the reason where it cannot start."""
    if os.geteuid() != 0:
        pytest.skip("a real SLURM needs root to start its daemons (apt-get install slurm-wlm munge, as root)")
    missing = [tool for tool in DAEMONS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"slurm-wlm or munge is not installed ({', '.join(missing)} not on the PATH): "
                    f"apt-get install slurm-wlm munge")
    folder.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool"):
        (folder / sub).mkdir()
    host = socket.gethostname().split(".")[0]
    conf = folder / "slurm.conf"
    conf.write_text(slurm_conf(folder, host, os.cpu_count() or 1))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    started_munge = None
    try:
        if not answers(["munge", "-n"]):  # no munged yet: start one, as the user munge, on its usual socket
            run_dir = Path("/run/munge")
            run_dir.mkdir(parents=True, exist_ok=True)
            shutil.chown(run_dir, "munge", "munge")
            pid_file = run_dir / "munged.pid"
            subprocess.run(["runuser", "-u", "munge", "--", "munged"], capture_output=True, timeout=30)
            if not wait_until(lambda: answers(["munge", "-n"])):
                pytest.skip(f"munged did not answer within {UP_S} s (its log: /var/log/munge/munged.log)")
            started_munge = pid_file
        for daemon in ("slurmctld", "slurmd"):
            done = subprocess.run([daemon, "-f", str(conf)], capture_output=True, text=True, env=env, timeout=30)
            if done.returncode != 0:
                pytest.skip(f"{daemon} did not start (exit {done.returncode}; its log: "
                            f"{folder / (daemon + '.log')}): {done.stderr.strip()[-300:]}")
        if not wait_until(lambda: node_state(env) == "idle"):
            pytest.skip(f"the SLURM node did not come up idle within {UP_S} s (sinfo: {node_state(env)!r}; "
                        f"logs in {folder})")
        yield env
    finally:
        if (folder / "slurmctld.pid").exists():
            subprocess.run(["scancel", "--full", "-u", "root"], capture_output=True, env=env, timeout=30)
            wait_until(lambda: not subprocess.run(["squeue", "-h"], capture_output=True, text=True, env=env,
                                                  timeout=10).stdout.strip(), 15)
        stop(folder / "slurmd.pid", folder / "slurmctld.pid")
        if started_munge is not None:
            stop(started_munge)
