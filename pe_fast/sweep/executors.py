"""Where the packs train: here, one after the other (local), as Ray tasks, or as SLURM jobs through submitit, each
behind one interface (Executor.submit(todo) -> a Job per pack; run_packs waits for them). A pack's unit of work,
train_and_store_pack, is the same for all: train from its checkpoint, if any, and write DIR/packs/<index>/."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

import pandas as pd
import torch

from pe_fast import memory, precision
from pe_fast.results import reading, run_folder, weights
from pe_fast.results.settings import Settings
from pe_fast.sweep import UsageError, live_curves
from pe_fast.sweep.grid import pack_trainer
from pe_fast.sweep.live_curves import LiveCurves
from pe_fast.sweep.progress import Progress
from pe_fast.sweep.task_loading import load_task


def apply_runtime(s: Settings):
    """Process-wide settings, in the sweep's process and in every Ray worker: threads, malloc, TF32."""
    memory.keep_freed_memory()
    precision.apply(s.precision)
    if s.threads:  # a Ray or SLURM driver may have fewer cores than the workers its --threads is for
        torch.set_num_threads(min(s.threads, len(os.sched_getaffinity(0))))


def check_checkpoint_fits(s: Settings, task, pack: list[dict], out: Path, index: int):
    """Raise UnreadableCheckpoint where pack `index`'s checkpoint (which loads safely) is not one this pack's training
    could have left (PackTrainer.state_problem) or holds model tensors of other shapes than this pack's (another
    sweep's, of another --width, say): before any pack trains."""
    state = run_folder.load_checkpoint(out, index)
    if state is None:
        return
    if run_folder.CHECKPOINT_TRAINED_WITH in state:  # (a checkpoint of a pe_fast before 2026-12-07 has none)
        try:
            recorded = json.loads(state[run_folder.CHECKPOINT_TRAINED_WITH])
        except (TypeError, ValueError, RecursionError):
            recorded = None
        settings = s.trained_with()
        if not reading.is_trained_with(recorded, settings):
            raise run_folder.UnreadableCheckpoint(
                f"{run_folder.checkpoint_path(out, index)} holds a record of settings no pe_fast writes; delete it to "
                f"retrain pack {index} from its start")
        if (problem := reading.trained_with_problem(recorded, settings)) is not None:
            raise run_folder.UnreadableCheckpoint(
                f"{out / run_folder.CONFIG} says {problem} as {run_folder.checkpoint_path(out, index)} records: "
                f"pack {index} began training with other settings (config.json edited since)")
    with torch.random.fork_rng(devices=[]):  # building a model must not move the sweep's random stream
        trainer = pack_trainer(s, task, pack)
    model = trainer.model
    found = state["model"] if isinstance(state.get("model"), dict) else {}
    own = model.state_dict()
    # loaded as given, weights of another dtype (float64, integers) would be cast without a word
    wrong = next(((key, f"{tuple(tensor.shape)} {tensor.dtype}",
                   f"{tuple(getattr(found.get(key), 'shape', ()))} {getattr(found.get(key), 'dtype', '')}")
                  for key, tensor in own.items()
                  if not isinstance(found.get(key), torch.Tensor) or found[key].shape != tensor.shape
                  or found[key].dtype != tensor.dtype), None)
    if wrong is None and set(found) != set(own):
        extra = sorted(set(found) - set(own), key=str)[0]
        wrong = (extra, "none", "a tensor")
    if wrong is not None:
        key, want, got = wrong
        raise run_folder.UnreadableCheckpoint(
            f"{run_folder.checkpoint_path(out, index)} does not fit pack {index} of this sweep ({key} is {got}, the "
            f"pack's {want}); delete it to retrain pack {index} from its start")
    if (problem := trainer.state_problem(state)) is not None:
        raise run_folder.UnreadableCheckpoint(
            f"{run_folder.checkpoint_path(out, index)} is not a checkpoint of pack {index} of this sweep ({problem}); "
            f"delete it to retrain pack {index} from its start")


def train_and_store_pack(s: Settings, index: int, pack: list[dict], out: Path, task, on_step=None) -> dict:
    """Train pack `index` (from its checkpoint, if it has one), checkpointing as it goes, and write
    DIR/packs/<index>/. Returns {trained_steps}: the steps trained here, after the checkpoint it started from."""
    trainer = pack_trainer(s, task, pack)
    state = run_folder.load_checkpoint(out, index)
    if state is not None:
        trainer.load_state_dict(state)
    first_step = trainer.step
    live = LiveCurves(out, pack, live_curves.varying_axes(s), first_step) if s.tensorboard else None
    trained_with = s.trained_with()  # beside the state: config.json edited before a --resume is found out

    def checkpoint():
        state = {**trainer.state_dict(), run_folder.CHECKPOINT_TRAINED_WITH: json.dumps(trained_with)}
        run_folder.save_checkpoint(out, index, state)
    result = trainer.run(on_step, checkpoint=checkpoint,
                         checkpoint_every=s.checkpoint_every, on_evaluate=live and live.evaluation)
    if live is not None:
        live.finish(result.final, trainer.step)
    final_rows, curve_rows, pe_tables = [], [], {}
    for local, model in enumerate(pack):
        # results.parquet's sigma is a float column: "no σ" is stored as NaN there
        stored = {**model, "sigma": math.nan if model["sigma"] is None else model["sigma"]}
        identity = dict(task=s.task, **stored, steps=result.steps, stopped=result.stopped, precision=s.precision,
                        pack=index)
        # the model's identity wins over a curves row's keys (a checkpoint's rows named pe once: report.md showed it)
        final_rows.append({**identity, **{k: v for k, v in result.final[local].items()
                                          if k not in ("model", "step") and k not in identity},
                           "train_seconds": result.seconds / len(pack)})
        curve_rows.extend({**identity, **{k: v for k, v in row.items() if k != "model" and k not in identity}}
                          for row in result.curves if row["model"] == local)
        if local in result.pe_tables:
            pe_tables[run_folder.pe_table_key(model['model_id'])] = result.pe_tables[local]
        pe_tables[run_folder.attention_map_key(model['model_id'])] = result.attention_maps[local]
    def save_weights(path: Path):
        weights.save_pack_weights(path, trainer.model, [m["model_id"] for m in pack], trainer.step, task.coordinates)
    run_folder.write_pack(out, index, pd.DataFrame(final_rows), pd.DataFrame(curve_rows), pe_tables, trained_with,
                          None if s.no_weights else save_weights)
    return {"trained_steps": result.steps - first_step}


# ---- one interface: an executor submits packs and returns a Job for each; run_packs waits for them all ----


class Job(Protocol):
    def done(self) -> bool:
        """Whether the job has ended (a local job: whether it can run now, here)."""

    def result(self) -> dict:
        """train_and_store_pack's {trained_steps}; PackFailed where the job ended without its results."""


class Executor(Protocol):
    @staticmethod
    def runs_elsewhere(s: dict, ray_address: str | None) -> bool:
        """Whether these settings' packs may train on other machines (which may have a device or cores this one
        lacks); ray_address: the Ray cluster the driver will join (--ray-address, else $RAY_ADDRESS)."""

    def __init__(self, s: Settings, packs: list[list[dict]], out: Path, task, progress: Progress): ...

    @staticmethod
    def check_machine(s: dict) -> None:
        """The packages and tools it needs here, for the settings being validated (runtime.resolve): one
        UsageError naming what is missing and how to get it."""

    @staticmethod
    def prepare_folder(out: Path, todo: list[int]) -> None:
        """Before any pack of todo trains (a started or resumed sweep): what a stopped driver left in the folder,
        cleared or checked, one UsageError where it cannot be used."""

    def submit(self, todo: list[int]) -> dict[int, Job]:
        """Every pack of todo, by index: submitted at once (SLURM: one job array), each to train elsewhere or
        when its result is asked for."""


def run_packs(s: Settings, todo: list[int], packs: list[list[dict]], out: Path, task, progress: Progress):
    """Train the packs of todo with the executor --executor names, gathering each as it ends; between looks, the
    progress line shows the steps the workers reported."""
    jobs = EXECUTORS[s.executor](s, packs, out, task, progress).submit(todo)
    while jobs:
        ended = [index for index, job in jobs.items() if job.done()]
        for index in ended:
            progress.finish_pack(index, jobs.pop(index).result()["trained_steps"])
        if jobs:
            observe_steps(out, list(jobs), progress)
            if not ended:
                time.sleep(POLL_S)


class LocalJob:
    """A pack trained in this process when its result is asked for (as submitit's debug executor runs its
    jobs), with its steps on the progress line as they happen."""

    def __init__(self, s: Settings, index: int, pack: list[dict], out: Path, task, progress: Progress):
        self.s, self.index, self.pack, self.out, self.task, self.progress = s, index, pack, out, task, progress

    def done(self) -> bool:
        return True

    def result(self) -> dict:
        self.progress.start_pack(self.index)
        return train_and_store_pack(self.s, self.index, self.pack, self.out, self.task, on_step=self.progress.update)


def remove_partials(out: Path, todo: list[int]):
    """A pack folder half-written by a process that stopped: no one else writes it, so it goes."""
    run_folder.remove_partials(out)


class LocalExecutor:
    """--executor local: the packs one after the other, here."""
    prepare_folder = staticmethod(remove_partials)

    @staticmethod
    def runs_elsewhere(s: dict, ray_address: str | None) -> bool:
        return False

    @staticmethod
    def check_machine(s: dict):
        pass

    def __init__(self, s: Settings, packs: list[list[dict]], out: Path, task, progress: Progress):
        self.s, self.packs, self.out, self.task, self.progress = s, packs, out, task, progress

    def submit(self, todo: list[int]) -> dict[int, Job]:
        return {index: LocalJob(self.s, index, self.packs[index], self.out, self.task, self.progress)
                for index in todo}


@functools.lru_cache(maxsize=2)
def _cached_task(settings_json: str):
    return load_task(Settings.from_json(json.loads(settings_json), packs=()))


STEP_REPORT_S = 5.0  # how often a worker writes its pack's step for the driver's progress line
POLL_S = 2.0  # how often the Ray and SLURM drivers look for finished packs and reported steps


class StepReporter:
    """A worker's on_step: writes the pack's step to DIR/packs/<index>.step at its first step and then at most
    every STEP_REPORT_S seconds, for the driver, which sees the worker only through the folder."""

    def __init__(self, out: Path, index: int):
        self.out, self.index, self.last = out, index, None

    def __call__(self, step: int):
        now = time.monotonic()
        if self.last is None or now - self.last >= STEP_REPORT_S:
            run_folder.write_step(self.out, self.index, step)
            self.last = now


def pack_job(s: Settings, index: int, pack: list[dict], out: str) -> dict:
    """One pack in a process of its own (a Ray worker, a SLURM job): load the task (once per process) and train."""
    apply_runtime(s)
    task = _cached_task(json.dumps(s.to_json(), sort_keys=True))
    return train_and_store_pack(s, index, pack, Path(out), task, on_step=StepReporter(Path(out), index))


def observe_steps(out: Path, indices, progress: Progress):
    """Give the progress line the steps the workers of these packs last reported."""
    for index in indices:
        step = run_folder.read_step(out, index)
        if step is not None:
            progress.observe(index, step)
    progress.draw()


class RayJob:
    def __init__(self, index: int, ref):
        self.index, self.ref = index, ref

    def done(self) -> bool:
        import ray
        return bool(ray.wait([self.ref], num_returns=1, timeout=0)[0])

    def result(self) -> dict:
        """A task that ended without its results (its worker killed or crashed, its node lost, an exception in
        it) is PackFailed: Ray does not retry it (max_retries=0), and --resume continues it from its checkpoint."""
        import ray
        try:
            return ray.get(self.ref)
        except ray.exceptions.RayError as error:
            raise PackFailed(f"pack {self.index}'s Ray task failed ({ray_failure(error)}); rerun with --resume to "
                             f"continue from its checkpoint") from None


def ray_failure(error) -> str:
    """What ended a Ray task, in one line: the exception raised in the task (a RayTaskError's cause), else Ray's
    own (WorkerCrashedError, NodeDiedError, OutOfMemoryError...), with the first line of its message."""
    import ray
    if isinstance(error, ray.exceptions.RayTaskError) and error.cause is not None:
        error = error.cause
    lines = str(error).strip().splitlines()
    message = lines[0] if lines else ""
    if len(message) > 200:
        message = message[:197] + "..."
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


class RayExecutor:
    """--executor ray: each pack is one Ray task with its CPUs (--threads, default 1) or one GPU; the workers write
    the pack folders themselves (on a cluster, --out must be a folder every node sees)."""
    prepare_folder = staticmethod(remove_partials)  # a stopped driver's Ray tasks stopped with it

    @staticmethod
    def runs_elsewhere(s: dict, ray_address: str | None) -> bool:
        return ray_address not in (None, "local")  # else a Ray instance started here, for this sweep

    @staticmethod
    def check_machine(s: dict):
        if importlib.util.find_spec("ray") is None:
            raise UsageError("--executor ray needs Ray, which is not installed: pip install 'pe_fast[ray]' "
                             "(or pip install 'ray>=2.9')")

    def __init__(self, s: Settings, packs: list[list[dict]], out: Path, task, progress: Progress):
        self.s, self.packs, self.out = s, packs, out

    def submit(self, todo: list[int]) -> dict[int, Job]:
        import ray
        if not ray.is_initialized():
            ray.init(address=self.s.ray_address, include_dashboard=False, log_to_driver=False)
        # each failed pack is named in one line (PackFailed); Ray's own log of the same error, printed as the driver
        # exits, came after it (read when Ray reports an error, so set here)
        os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
        gpus = 1 if self.s.device == "cuda" else 0
        remote = ray.remote(num_cpus=self.s.threads or 1, num_gpus=gpus, max_retries=0)(pack_job)
        settings = dataclasses.replace(self.s, threads=self.s.threads or 1)
        return {index: RayJob(index, remote.remote(settings, index, self.packs[index], str(self.out.resolve())))
                for index in todo}


SLURM_FOLDER = "slurm"  # submitit's job scripts, pickles and logs, and JOBS_FILE
JOBS_FILE = "jobs.json"  # pack index -> the job that trains it, so that a restarted driver finds running jobs
MAX_TIME_LIMIT_REQUEUES = 100
# submitit asks SLURM for its checkpoint signal 90 s before the time limit: a 1-minute limit was signalled as the
# job started, every round (a real SLURM, 2026-12-04), so the pack never trained. A quarter of the limit instead.
SIGNAL_BEFORE_LIMIT_S = 90
RESULT_WAIT_S = 15.0  # how long an ended job's result may take to appear (submitit's own wait, for network folders)
FAILED_RESULT_WAIT_S = 2.0  # the same for a job SLURM says failed, was cancelled or timed out: it may have none


class PackFailed(Exception):
    """A pack's job ended without its results: one line naming the job and its log."""


class PackJob:
    """One pack as a submitit job. At preemption or near the time limit submitit calls `checkpoint`: the job is
    requeued with the same arguments and continues from the pack's last checkpoint (every --checkpoint-every
    steps, by default every evaluation), so at most the steps since then are trained again."""

    def __call__(self, s: Settings, index: int, pack: list[dict], out: str) -> dict:
        return pack_job(s, index, pack, out)

    def checkpoint(self, *args, **kwargs):
        import submitit
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def slurm_executor(s: Settings, folder: Path):
    import submitit
    # A pack longer than the time limit is requeued near its end and continues: allow many such rounds.
    executor = submitit.AutoExecutor(folder=folder, cluster="local" if s.slurm_local else "slurm",
                                     slurm_max_num_timeout=MAX_TIME_LIMIT_REQUEUES)
    signal_delay_s = min(SIGNAL_BEFORE_LIMIT_S, s.slurm_time * 60 // 4)
    gpus = s.slurm_gpus if s.slurm_gpus is not None else (1 if s.device == "cuda" else 0)
    cluster = {"slurm_partition": s.slurm_partition, "slurm_account": s.slurm_account}
    executor.update_parameters(name="pe_fast", timeout_min=s.slurm_time, cpus_per_task=s.threads or 1,
                               gpus_per_node=gpus, slurm_signal_delay_s=signal_delay_s,
                               **{k: v for k, v in cluster.items() if v is not None},
                               slurm_additional_parameters=dict(o.split("=", 1) for o in s.slurm_option))
    return executor


def job_alive(job) -> bool:
    """Whether a job found in JOBS_FILE still runs (or waits to). A local job whose driver was restarted is known
    by its controller's process id only: it runs while that process does, and is this sweep's job only if that
    process is submitit's controller of this folder (a pid alone may since name any process, even pid 1)."""
    import submitit
    if not isinstance(job, submitit.LocalJob):
        return not job.paths.result_pickle.exists() and slurm_job_alive(slurm_job_states([job.job_id]), job.job_id)
    state = job.state
    if state != "NO PROCESS AND NO RESULT":
        return state == "RUNNING"
    try:
        command = Path(f"/proc/{int(job.job_id)}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return False
    return b"submitit.local._local" in command and str(job.paths.folder).encode() in command


# squeue's states of a job that will not run again. PREEMPTED is not one (nor is it to submitit): a job submitit
# requeues passes through it; one that is not requeued has ended once squeue forgets it.
SLURM_ENDED = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT"}


def slurm_job_states(job_ids: list[str]) -> dict[str, list[str]] | None:
    """squeue's states of the jobs (array tasks one by one), in one call; a job it no longer knows (it forgets one
    MinJobAge after its end) is missing from the map. None where the controller does not answer."""
    try:
        done = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-j", ",".join(job_ids), "-o", "%i %T"],
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:  # "Invalid job id" where it knows none of them
        return {} if "Invalid job id" in done.stderr else None
    states: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        job_id, _, state = line.strip().partition(" ")
        states.setdefault(job_id, []).append(state)
    return states


def slurm_job_alive(states: dict[str, list[str]] | None, job_id: str) -> bool:
    """Whether SLURM still runs (or will run) the job, by slurm_job_states: asked of the controller (squeue), not of
    the accounting database that submitit reads (sacct): without slurmdbd, sacct knows no job, and a job that ended
    without its result (scancel, a python that exited 1, a node lost) would be waited for forever. A controller
    that does not answer is waited for."""
    return states is None or any(state not in SLURM_ENDED for state in states.get(job_id, []))


class SlurmStates:
    """The states of a sweep's SLURM jobs, asked of the controller in one squeue for all of them, at most every
    POLL_S / 2: the driver's look at a job array is one squeue call, not one per job."""

    def __init__(self, job_ids: list[str]):
        self.job_ids, self.asked_at, self.states = list(job_ids), -math.inf, None

    def now(self) -> dict[str, list[str]] | None:
        if time.monotonic() - self.asked_at >= POLL_S / 2:
            self.states, self.asked_at = slurm_job_states(self.job_ids), time.monotonic()
        return self.states


JOB_ID = re.compile(r"\d+(_\d+)?")  # SLURM's (an array's task: JOB_TASK); a local job's is its controller's pid


def recorded_jobs(out: Path, todo: list[int]) -> dict[str, str]:
    """JOBS_FILE's pack index -> job id, for the packs still to do; only jobs this sweep submitted (their
    submission is in its SLURM folder). A file that is not such a map is one line naming it."""
    folder = (out / SLURM_FOLDER).resolve()
    jobs_file = folder / JOBS_FILE
    if not jobs_file.is_file():
        return {}
    try:
        recorded = json.loads(jobs_file.read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"{jobs_file} cannot be read ({type(error).__name__}); delete it to submit the packs anew")
    if not (isinstance(recorded, dict) and all(isinstance(job, str) and JOB_ID.fullmatch(job)
                                               for job in recorded.values())):
        raise UsageError(f"{jobs_file} is not a map of pack indices to job ids; delete it to submit the packs anew")
    return {index: job for index, job in recorded.items()
            if index.isdigit() and int(index) in todo and (folder / f"{job}_submitted.pkl").is_file()}


class SlurmJob:
    def __init__(self, index: int, job, states: SlurmStates | None):
        """states: the sweep's SLURM jobs' states (None for submitit's local jobs, which run here)."""
        self.index, self.job, self.states = index, job, states

    def done(self) -> bool:
        if self.states is None:
            return not job_alive(self.job)
        return self.job.paths.result_pickle.exists() or not slurm_job_alive(self.states.now(), self.job.job_id)

    def result(self) -> dict:
        # Asked once the job has ended, so submitit's job.result() does not wait (through sacct, which without an
        # accounting database would be forever) for a job that ended without its result (cancelled, killed, a
        # python that exited before running the pack). A result may reach a network folder a little later.
        result = self.job.paths.result_pickle
        if not result.exists():
            states = (self.states.now() or {}).get(self.job.job_id) if self.states is not None else None
            ended_badly = bool(states) and all(state in SLURM_ENDED - {"COMPLETED"} for state in states)
            deadline = time.monotonic() + (FAILED_RESULT_WAIT_S if ended_badly else RESULT_WAIT_S)
            while not result.exists() and time.monotonic() < deadline:
                time.sleep(0.5)
            if not result.exists():
                raise self.failed("it ended without a result")
        try:
            return self.job.result()
        except Exception as error:
            raise self.failed(type(error).__name__)

    def failed(self, why: str) -> PackFailed:
        return PackFailed(f"pack {self.index}'s job {self.job.job_id} failed ({why}); its log: "
                          f"{self.job.paths.stderr}; rerun with --resume to continue from its checkpoint")


SLURM_ANSWER_S = 20  # how long the SLURM controller has to list its partitions, checked before the folder is written


def slurm_message(stderr: str) -> str:
    """A SLURM tool's complaint in one line: its last line (the fatal one), without the tool's name."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return re.sub(r"^\w+: (error: |fatal: )?", "", lines[-1]) if lines else "no message"


def check_slurm_cluster(partition: str | None):
    """A SLURM cluster answers here (its configuration found, its controller up), and knows the partition named,
    before the folder is written: sbatch would fail only at submission, after it. Asked as sbatch will be, through
    the environment's SLURM_CONF; scontrol ships with sbatch (skipped where it does not)."""
    if shutil.which("scontrol") is None:
        return
    advice = "run it on the cluster's login node, or add --slurm-local to try the jobs with submitit's local executor"
    try:
        done = subprocess.run(["scontrol", "--oneliner", "show", "partition"], capture_output=True, text=True,
                              timeout=SLURM_ANSWER_S)
    except subprocess.TimeoutExpired:
        raise UsageError(f"--executor slurm: the SLURM controller does not answer within {SLURM_ANSWER_S} s; "
                         f"{advice}") from None
    except OSError as error:
        raise UsageError(f"--executor slurm: scontrol cannot run ({error.strerror or error}); {advice}") from None
    if done.returncode != 0:
        raise UsageError(f"--executor slurm: no SLURM cluster answers here ({slurm_message(done.stderr)}); {advice}")
    partitions = re.findall(r"^PartitionName=(\S+)", done.stdout, re.MULTILINE)
    if partition is not None and partition not in partitions:
        raise UsageError(f"--slurm-partition {partition}: the SLURM cluster has no such partition (it has "
                         f"{', '.join(partitions) or 'none'})")


class SlurmExecutor:
    """--executor slurm: one job per pack, submitted as one job array; --out must be a folder the compute nodes
    see. A driver that is stopped and rerun with --resume waits for the jobs still running instead of submitting
    their packs again."""

    @staticmethod
    def runs_elsewhere(s: dict, ray_address: str | None) -> bool:
        return not s.get("slurm_local")

    @staticmethod
    def check_machine(s: dict):
        """submitit and, unless --slurm-local, sbatch and srun on the PATH; a GPU per job with --device cuda."""
        if importlib.util.find_spec("submitit") is None:
            raise UsageError("--executor slurm needs submitit, which is not installed: pip install 'pe_fast[slurm]' "
                             "(or pip install submitit)")
        missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]
        if not s.get("slurm_local") and missing:
            raise UsageError(f"--executor slurm: no SLURM here ({' and '.join(missing)} not on the PATH); run it on "
                             f"the cluster's login node, or add --slurm-local to try the jobs with submitit's local "
                             f"executor")
        if not s.get("slurm_local"):
            check_slurm_cluster(s.get("slurm_partition"))
        if s["device"] == "cuda" and s.get("slurm_gpus") == 0:
            raise UsageError("--slurm-gpus 0 with --device cuda: the jobs would have no GPU")
        if s["device"] == "cpu" and s.get("slurm_gpus"):  # --device auto resolved to cpu here too
            raise UsageError(f"--slurm-gpus {s['slurm_gpus']} with --device cpu: the packs would train on the CPU and "
                             f"leave the jobs' GPUs idle; give --device cuda, or leave --slurm-gpus out")

    @staticmethod
    def prepare_folder(out: Path, todo: list[int]):
        """A stopped driver's jobs may still be writing their packs: nothing is removed, and the jobs it recorded
        must be readable before any is waited for."""
        recorded_jobs(out, todo)

    def __init__(self, s: Settings, packs: list[list[dict]], out: Path, task, progress: Progress):
        self.s, self.packs, self.out = s, packs, out

    def submit(self, todo: list[int]) -> dict[int, Job]:
        import submitit
        s, out = self.s, self.out
        folder = (out / SLURM_FOLDER).resolve()
        executor = slurm_executor(s, folder)
        jobs_file = folder / JOBS_FILE
        recorded = recorded_jobs(out, todo)
        job_class = submitit.LocalJob if s.slurm_local else submitit.SlurmJob
        jobs, finished = {}, run_folder.finished_packs(out)
        for index, job_id in recorded.items():
            job = job_class(folder, job_id)
            # running, or ended with its pack written since todo was made: waited for, not trained again
            if job_alive(job) or (int(index) in finished and job.paths.result_pickle.exists()):
                jobs[int(index)] = job
        resumed = len(jobs)
        new = [index for index in todo if index not in jobs]
        settings = dataclasses.replace(s, threads=s.threads or 1)
        if new:
            said = io.StringIO()  # submitit prints sbatch's complaint before raising it: said once, in our line
            try:
                with contextlib.redirect_stderr(said), executor.batch():  # one job array
                    submitted = [executor.submit(PackJob(), settings, index, self.packs[index], str(out.resolve()))
                                 for index in new]
                print(said.getvalue(), end="", file=sys.stderr)  # sbatch's warnings, if any
            except (submitit.core.utils.FailedJobError, OSError) as error:  # sbatch refused, or could not run
                which = f"pack {new[0]}" if len(new) == 1 else f"packs {new[0]}…{new[-1]}"
                raise PackFailed(f"{which}: sbatch failed to submit the job array "
                                 f"({slurm_message(str(error) or type(error).__name__)}); the folder is kept: rerun "
                                 f"with --resume to submit it again") from None
            jobs.update(zip(new, submitted))
        recorded.update({str(index): job.job_id for index, job in jobs.items()})
        run_folder.write_atomic(jobs_file, lambda file: file.write(json.dumps(recorded, indent=1).encode()))
        where = "submitit's local executor" if s.slurm_local else "SLURM"
        print(f"pe_fast sweep: {len(new)} pack jobs submitted to {where}"
              + (f", {resumed} still running from before" if resumed else "") + f"; logs in {folder}",
              file=sys.stderr)
        states = None if s.slurm_local else SlurmStates([job.job_id for job in jobs.values()])
        return {index: SlurmJob(index, job, states) for index, job in sorted(jobs.items())}


# --executor NAME -> its executor (the choices of the flag: results.settings.EXECUTORS)
EXECUTORS: dict[str, type[Executor]] = {"local": LocalExecutor, "ray": RayExecutor, "slurm": SlurmExecutor}
