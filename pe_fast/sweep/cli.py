"""`python -m pe_fast.sweep`: settings → task → grid → packs → results folder, and the one-line errors."""
from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from pe_fast.models import StackedTransformer
from pe_fast.models.absolute_pe import SIGMA_PES
from pe_fast.program_exit import print_error
from pe_fast.results import reading, run_folder
from pe_fast.results.settings import Settings
from pe_fast.sweep import UsageError, executors, folder, grid, live_curves, resume, settings
from pe_fast.sweep.progress import Progress
from pe_fast.sweep.task_loading import load_task
from pe_fast.tasks import KINDS
from pe_fast.train import BatchSampler, PackTrainer


def check_out_folder(name: str, probe: bool = True):
    try:
        run_folder.check_out_folder(name, probe)
    except run_folder.OutFolderError as error:
        raise UsageError(f"--out {error}")


def check_writable(out: Path):
    try:
        run_folder.check_writable(out)
    except run_folder.OutFolderError as error:
        raise UsageError(f"--out {error}")


def check_against_task(s: Settings, task):
    """What only the loaded task can tell, before the folder exists: the batch fits its training set, and each
    PE kind can be built on its tokens (e.g. sinnd needs the regions' centroids). The constructors hold the
    rules: one batch sampler and one small model of each kind are built."""
    try:
        BatchSampler(len(task.splits["train"]), s.batch_size, [0], torch.device("cpu"))
    except ValueError as error:
        raise UsageError(f"--batch-size {s.batch_size}: {error} of --task {s.task}")
    for kind in s.pe:
        try:
            StackedTransformer(grid.model_config(s, task, kind), [0], [1.0 if kind in SIGMA_PES else None],
                               task.coordinates)
        except ValueError as error:
            preset = KINDS[s.task].presets.get(s.preset or "", {})
            if "pe" in preset and tuple(s.pe) == settings.parse_list(preset["pe"], str, "--pe"):  # not a --pe given
                raise UsageError(f"--pe {kind}, of --preset {s.preset}: {error}; give --pe without it") from None
            raise UsageError(f"--pe {kind}: {error}") from None


def unreadable(error: OSError, out: Path) -> UsageError:
    """A file or folder in DIR this user may not read (mode 000, another owner's), found before the lock."""
    return UsageError(f"{error.filename or out}: {error.strerror or error}; the folder cannot be read")


def check_folder(out: Path, resume: bool, packs: int | None = None):
    """A new sweep's folder is empty (but for our own lock); a resumed one (of `packs` packs) has no link leading
    out of it, and nothing in packs/ that the sweep did not write."""
    try:
        _check_folder(out, resume, packs)
    except OSError as error:
        raise unreadable(error, out) from None


def _check_folder(out: Path, resume: bool, packs: int | None):
    if not out.is_dir():
        return
    if not resume and any(p.name != run_folder.LOCK for p in out.iterdir()):  # the lock: ours, or stale
        hint = f"; to continue it: --resume --out {out}" if (out / run_folder.CONFIG).is_file() else ""
        raise UsageError(f"--out {out} already exists and is not empty; choose a new folder{hint}")
    # the sweep writes each pack into packs/<index>/ only after training it: a file in either place would fail
    # that write, and the training before it would be lost
    if (problem := run_folder.packs_problem(out, packs)) is not None:
        raise UsageError(problem)
    # the files a resume makes again (a finished sweep's top-level files, their record): a folder or FIFO in
    # one's place failed that write after the others were rewritten (exit 1, "Is a directory")
    for name in (*run_folder.DIGESTED, run_folder.DIGESTS) if resume else ():
        path = out / name
        if (path.exists() or path.is_symlink()) and not path.is_file():
            raise UsageError(f"{path} is not a file; delete it and --resume makes it again from the packs")
    try:
        run_folder.check_inside(out)
    except run_folder.LeavesFolder as error:
        raise UsageError(str(error))


def check_resumable(out: Path, s: Settings, packs: list[list[dict]], task):
    """What --resume finds in DIR/packs is readable (check_folder: and the sweep's own, no foreign or linked pack
    folder): every finished pack's results this pack's models, every checkpoint loading safely and of this pack's
    shapes. Read only, before the lock is taken: a refusal writes nothing."""
    finished = run_folder.finished_packs(out)
    try:
        reading.check_task_recorded(out, {**run_folder.read_config(out), "settings": s.to_json()}, task)
    except reading.ReportError as error:
        raise UsageError(f"{error}, or start a new sweep") from None
    for index in sorted(finished):  # every finished pack readable as the results will read it, before training
        try:
            results, curves, pe_tables = reading.read_pack(run_folder.pack_folder(out, index), s.task)
            # the numbers the readers refuse (an accuracy of 5): the folder it finishes would not read
            reading.check_values(run_folder.pack_folder(out, index), results, curves, s.to_json(), list(s.packs))
            folder.check_pack_holds(run_folder.pack_folder(out, index), results, packs[index], s, index)
            reading.check_pack_weights(out, index, [m["model_id"] for m in packs[index]],
                                       s.to_json(), pe_tables, dict(zip(results["model_id"], results["steps"])),
                                       packs[index])
            reading.check_trained_with(out / run_folder.CONFIG, s.trained_with(), run_folder.pack_folder(out, index))
            reading.check_digests(run_folder.pack_folder(out, index))  # last: the checks above say what is wrong
            reading.check_pack_files(run_folder.pack_folder(out, index))
        except reading.ReportError as error:
            raise UsageError(f"{error}; delete {run_folder.pack_folder(out, index)} to retrain pack {index}")
    for index in (i for i in range(len(packs)) if i not in finished):  # every checkpoint readable, safely so
        try:
            run_folder.check_checkpoint(out, index, PackTrainer.REQUIRED_STATE_KEYS, s.steps)
            executors.check_checkpoint_fits(s, task, packs[index], out, index)
        except run_folder.UnreadableCheckpoint as error:
            raise UsageError(str(error))


def default_out(s: Settings) -> str:
    """The folder of a sweep started without --out: runs/<task>-<date>-<time>."""
    return str(Path("runs") / f"{s.task}-{time.strftime('%Y%m%d-%H%M%S')}")


def run(s: Settings, write_report: Callable[[Path], object] | None = None) -> Path:
    """Train the sweep and write its results folder; then write_report(DIR) unless --no-report. The sweep does not
    import the report: pe_fast.sweep.program, above both, passes pe_fast.report's writer."""
    resume = s.packs is not None
    name = s.out if s.out is not None else default_out(s)
    check_out_folder(name, probe=False)  # probed after the checks of what it holds: a refused folder is untouched
    out = Path(name)
    s = dataclasses.replace(s, out=str(out))
    holder = run_folder.lock_holder(out) if out.is_dir() else None
    if holder is not None:
        raise UsageError(run_folder.locked_message(out, holder))
    check_folder(out, resume, None if s.packs is None else len(s.packs))
    if not resume:
        check_writable(out)
    # a results.parquet that does not read is not finished: the top-level files are made again from the packs,
    # each checked against its own record; so too where the record of the top-level files is missing (a sweep
    # killed between them and it: its lock left behind)
    if resume and run_folder.is_finished(out) and (out / run_folder.DIGESTS).is_file():
        try:  # read as the report and load_run will: a tampered finished folder is not "finished", it is refused
            reading.read_run(out)
        except reading.ReportError as error:
            raise UsageError(f"--resume: {error}") from None
        print(f"{out} is finished; nothing to resume", file=sys.stderr)
        return out
    executors.apply_runtime(s)
    task = load_task(s)
    grid.check_one_model_fits(s, task)  # first: checking against the task builds a model
    check_against_task(s, task)
    models = grid.expand_grid(s)
    if not resume:
        how = "--max-pack" if s.max_pack else f"fits half the free memory of {s.device}"
        s = dataclasses.replace(s, max_pack=grid.choose_pack_size(s, task))
    packs = grid.pack_models(s, models)
    s = dataclasses.replace(s, packs=tuple(tuple(m["model_id"] for m in pack) for pack in packs))
    if s.tensorboard and (problem := live_curves.folder_problem(out, models, live_curves.varying_axes(s))):
        raise UsageError(problem)
    if resume:  # before the lock (a refusal writes nothing); a sweep resuming beside it would write its own packs
        try:
            check_resumable(out, s, packs, task)
        except OSError as error:
            raise unreadable(error, out) from None
        check_writable(out)
    created = not out.exists()
    try:
        run_folder.acquire_lock(out, notice=lambda line: print(f"note: {line}", file=sys.stderr))
    except run_folder.FolderLocked as error:
        raise UsageError(str(error))
    try:
        try:  # again under the lock: another sweep may have written the folder since the first look
            check_folder(out, resume, None if s.packs is None else len(s.packs))
        except UsageError:
            run_folder.release_lock(out)
            if created:
                with contextlib.suppress(OSError):  # not empty: the other sweep's, keep it
                    out.rmdir()
            raise
        if not resume:
            print(f"pe_fast sweep: pack size {s.max_pack} ({how})", file=sys.stderr)
            folder.start_folder(s, out, task, models, packs)
        executor = executors.EXECUTORS[s.executor]
        finished = run_folder.finished_packs(out)
        for index in finished:  # a finished pack's checkpoint or step file: left by a kill as it finished, or put
            run_folder.checkpoint_path(out, index).unlink(missing_ok=True)  # there; never read, removed
            run_folder.step_path(out, index).unlink(missing_ok=True)
        todo = [i for i in range(len(packs)) if i not in finished]
        executor.prepare_folder(out, todo)
        if task.data_line is not None:
            print(task.data_line, file=sys.stderr)
        print(f"pe_fast sweep: task {s.task}, {len(models)} models in {len(packs)} packs "
              f"({len(finished)} finished before), {s.steps} steps each, on {s.device} "
              f"({s.executor}, {s.threads or torch.get_num_threads()} threads, {s.precision}"
              f"{dict(on=', compiled', graphs=', compiled, CUDA graphs').get(s.compile, '')})", file=sys.stderr)
        progress = Progress(packs, s.steps, finished)
        executors.run_packs(s, todo, packs, out, task, progress)
        progress.close()
        table = folder.finish_folder(s, out, task, models, len(packs))
        # a report of the unfinished sweep (python -m pe_fast.report DIR while it ran) no longer describes it
        stale = run_folder.remove_report(out)
    finally:
        run_folder.release_lock(out)
    if stale and (write_report is None or s.no_report):
        print(f"note: removed the report of the unfinished sweep ({', '.join(stale)}); python -m pe_fast.report "
              f"{out} writes it for the finished one (and redraws {run_folder.FIGURES}/)", file=sys.stderr)
    print(table.to_string(index=False))
    if write_report is not None and not s.no_report:
        try:
            write_report(out)
        except Exception as error:  # the results are safe; the report can be rerun with python -m pe_fast.report
            print(f"warning: the report failed ({type(error).__name__}: {error}); the results are complete; "
                  f"rerun: python -m pe_fast.report {out}", file=sys.stderr)
    print(f"results written to {out}", file=sys.stderr)
    return out


class Terminated(BaseException):
    """SIGTERM (kill, a scheduler's stop): the sweep ends as on Ctrl-C, its lock released."""


def terminate(signum, frame):
    raise Terminated


@contextlib.contextmanager
def ends_on_sigterm():
    """SIGTERM raises Terminated in the main thread while the sweep runs: its default killed the process where it
    stood, leaving DIR/.lock for the next --resume to take over with a notice."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers belong to the main thread
        yield
        return
    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None, write_report: Callable[[Path], object] | None = None) -> int:
    with ends_on_sigterm():
        return _main(argv, write_report)


def _main(argv: list[str] | None, write_report: Callable[[Path], object] | None) -> int:
    try:
        args = settings.build_parser().parse_args(argv)  # one line and 2 for an unknown flag; 0 after --help
    except SystemExit as exit_:
        return exit_.code
    out = args.out or "DIR"
    try:
        s = resume.from_resume(args) if args.resume else settings.from_flags(args)
        if s.out is None:  # named here, so that the lines below name the folder this sweep writes
            s = dataclasses.replace(s, out=default_out(s))
        out = s.out
        run(s, write_report)
    except UsageError as error:
        print_error(error)
        return 2
    except executors.PackFailed as error:
        print_error(error)
        return 1
    except reading.ReportError as error:  # a pack written now that does not read back: the folder is not whole
        print(f"error: {error}; the finished packs and checkpoints are kept: fix or delete what it names, then "
              f"continue with python -m pe_fast.sweep --resume --out {out}", file=sys.stderr)
        return 1
    except OSError as error:  # a full disk, a lost mount: the checkpoints written before it are whole
        where = f" ({error.filename})" if error.filename else ""
        print(f"error: {out}: {error.strerror or error}{where}; the finished packs and checkpoints are kept: "
              f"free the space or fix the folder, then continue with python -m pe_fast.sweep --resume --out {out}",
              file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Terminated) as stop:
        print(f"\n{'terminated' if isinstance(stop, Terminated) else 'interrupted'}; the finished packs and "
              f"checkpoints are kept: continue with python -m pe_fast.sweep --resume --out {out}", file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)
    return 0
