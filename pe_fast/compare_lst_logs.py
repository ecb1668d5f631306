"""Compare an LST run with the authors' own training logs (issue 17).

    python -m pe_fast.compare_lst_logs DIR [DIR ...] [--out FILE] [--logs FILE]

For every PE setting (sin2d, learned σ) that DIR trained with seeds of the authors' 15, and every epoch of the
authors' logs (one every 200) that one of DIR's evaluations falls near, it prints our train and in-distribution
test accuracy next to theirs: mean ± sd over the seeds both have, the mean paired difference (ours − theirs, seed
by seed), that difference in units of their seed-sd (over all 15 of their seeds, a steadier scale than the
few shared ones), and theirs on the human-study puzzles (human108), which are not shipped and so theirs only.
A verdict line per setting says whether our last compared epoch lies within one of their seed-sds on both.
A setting trained with another PE dropout than theirs (0.1 on sin2d, none on the learned PE) says so in its
label: it is then a different training, not a reproduction.

Epochs are passes over the training split: ours is step × batch size / training puzzles, so the comparison is
by puzzles seen. The table also goes to DIR/compare_lst_logs.md, or to --out.

Several folders count as one run: the seeds of a setting pool across them, e.g. a `--seeds 2` run and a
`--seed-values 6068` run of the same configuration. They must have trained alike (every setting equal but the
seeds, the PEs and σ, the PE dropout, which the setting's label shows, and, at a constant learning rate, the
number of steps); a seed of one setting in two folders is refused. The table then goes to --out only.

The logs: the authors' own, which ship with pe_fast (pe_fast/data/lst_authors/SOURCE.md), or --logs FILE, a
table of the same columns as parquet or CSV.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pe_fast.markdown import inert
from pe_fast.models.absolute_pe import SINUSOIDAL_PES
from pe_fast.program_exit import brief, print_error
from pe_fast.results import run_folder
from pe_fast.results.reading import (MAY_DIFFER, ReportError, check_alike, check_named_once,
                                     check_parquet_size, named_folder, parquet_columns, read_run,
                                     recorded_settings)
from pe_fast.results.settings import Settings, pe_dropout_of
from pe_fast.sweep.settings import OneLineParser
from pe_fast.tasks.lst import AUTHORS_SINUSOIDAL_PE_DROPOUT
from pe_fast.tasks.lst_puzzles import AUTHORS_LOGS_FILE, authors_file

LOG_COLUMNS = {"pe", "sigma", "seed", "epoch", "phase", "condition", "accuracy"}
LOG_NUMBERS = ("sigma", "seed", "epoch", "accuracy")
COMPARED_PHASES = ("train", "test")  # the logs' phases compared, with our train_acc and test_acc
# An evaluation stands for a logged epoch when it lies within this share of the logs' 200-epoch spacing
EPOCH_MATCH = 0.1
OUTPUT = "compare_lst_logs.md"


class CompareError(ValueError):
    """Bad input: one line, exit code 2."""


def read_logs(path: Path | None = None) -> pd.DataFrame:
    """The average accuracies of the logs at path, by default the authors' (shipped with pe_fast): one row per
    (pe, sigma, seed, epoch, phase)."""
    if path is None:
        try:
            path = authors_file(AUTHORS_LOGS_FILE)
        except FileNotFoundError as error:  # an install without its package data
            raise CompareError(str(error))
    if not path.is_file():
        raise CompareError(f"the logs are not at {path}; give --logs a parquet or CSV file of the authors' columns")
    try:
        with open(path, "rb") as file:  # a file, not a path's text: pandas would expand a leading ~
            if path.suffix == ".parquet":  # a few MB may declare GBs of rows, as a results folder's tables may
                check_parquet_size(path, file)
                file.seek(0)
            # low_memory=False: the columns' types from the whole file, not per chunk with a DtypeWarning
            logs = parquet_columns(file) if path.suffix == ".parquet" else pd.read_csv(file, low_memory=False)
    except ReportError as error:
        raise CompareError(str(error))
    except Exception as error:
        raise CompareError(f"{path} is not a readable {'parquet' if path.suffix == '.parquet' else 'CSV'} file "
                           f"({type(error).__name__})")
    if not LOG_COLUMNS <= set(logs.columns):
        raise CompareError(f"{path} lacks the columns {sorted(LOG_COLUMNS - set(logs.columns))}")
    logs = logs[logs["condition"] == "average"]
    if logs.empty:
        raise CompareError(f"{path} has no rows of condition average, the accuracies compared")
    # averaged, matched to our σ, seeds and epochs: numbers, or the comparison fails far from the file's name
    text = next((c for c in LOG_NUMBERS if not pd.api.types.is_numeric_dtype(logs[c])
                 or pd.api.types.is_bool_dtype(logs[c])), None)
    if text is not None:
        raise CompareError(f"{path}: column {text} holds values that are not numbers")
    # σ is blank for the PEs without one; every other number is a real seed, epoch or accuracy
    bad = next((c for c in LOG_NUMBERS if np.isinf(logs[c]).any() or (c != "sigma" and logs[c].isna().any())),
               None)
    if bad is not None:
        raise CompareError(f"{path}: column {bad} holds {'infinite' if np.isinf(logs[bad]).any() else 'missing'} "
                           f"values in rows of condition average")
    if not logs["accuracy"].between(0, 1).all() or (logs["epoch"] < 0).any() or (logs["sigma"] <= 0).any():
        raise CompareError(f"{path}: an accuracy outside [0, 1], a negative epoch or a σ not above 0")
    missing = [phase for phase in COMPARED_PHASES if phase not in set(logs["phase"])]
    if missing:  # the comparison reads each; other phases (the authors' human108) are left aside
        raise CompareError(f"{path}: column phase holds no {' and no '.join(missing)} rows of condition average; "
                           f"the comparison needs {' and '.join(COMPARED_PHASES)}")
    # one accuracy per seed, epoch and phase: two were averaged into one, a missing one compared as NaN
    keys = ["pe", "sigma", "seed", "epoch"]
    twice = logs[logs.duplicated([*keys, "phase"], keep=False)]
    if not twice.empty:
        raise CompareError(f"{path}: two rows of condition average for {logged_row(twice.iloc[0])}, phase "
                           f"{str(twice.iloc[0]['phase'])[:20]!r}; give one accuracy each")
    compared = logs[logs["phase"].isin(COMPARED_PHASES)]
    phases = compared.groupby(keys, dropna=False)["phase"].nunique()
    if (phases < len(COMPARED_PHASES)).any():
        lacking = phases[phases < len(COMPARED_PHASES)].index[0]
        raise CompareError(f"{path}: {logged_row(dict(zip(keys, lacking)))} has a row of condition average for "
                           f"only one of {' and '.join(COMPARED_PHASES)}; the comparison needs both")
    return logs.pivot_table(index=keys, columns="phase", values="accuracy", dropna=False).reset_index()


def logged_row(row) -> str:
    """A logs row's PE, σ, seed and epoch, for a message."""
    return (f"pe {str(row['pe'])[:20]!r}, σ {row['sigma']:g}, seed {row['seed']:g}, epoch {row['epoch']:g}")


def our_epochs(directory: Path, config: dict, settings: Settings, curves: pd.DataFrame) -> pd.Series:
    """Each evaluation's step as passes over the training split (puzzles seen / training puzzles)."""
    task = config.get("task")
    sizes = task.get("sizes") if isinstance(task, dict) else None
    train_size = sizes.get("train") if isinstance(sizes, dict) else None
    # a count the task wrote (its training puzzles), which the epochs divide by
    if isinstance(train_size, bool) or not isinstance(train_size, int) or train_size < 1:
        found = (f"task is {brief(task)}" if not isinstance(task, dict) else
                 f"task.sizes is {brief(sizes)}" if not isinstance(sizes, dict) else
                 f"task.sizes.train is {brief(train_size) if 'train' in sizes else 'missing'}")
        raise CompareError(f"{directory / 'config.json'}: {found}, not the training split's number of puzzles "
                           f"(task.sizes.train); is this an LST run of pe_fast?")
    return curves["step"] * settings.batch_size / train_size


def dropout_note(settings: Settings, pe: str) -> str:
    """'' where the run drops out x + PE as the authors' code does for this PE kind, else what differs."""
    ours = pe_dropout_of(settings, pe)
    theirs = AUTHORS_SINUSOIDAL_PE_DROPOUT if pe in SINUSOIDAL_PES else 0.0
    return "" if ours == theirs else f" (PE dropout {ours:g}, theirs {theirs:g})"


# Folders compared as one run may differ as pooled ones may (pe_fast.results.reading.MAY_DIFFER), and also in how
# many items they evaluated and, at a constant learning rate, in their number of steps: the comparison is per logged
# epoch.
# Where a PE kind's dropout differs, the setting's label says so.
ALSO_MAY_DIFFER = frozenset({"eval_items"})


def read_lst_run(directory: Path) -> tuple[pd.DataFrame, Settings]:
    """One folder's learned and sin2d curves, with their epoch and their setting's label, and its settings."""
    try:
        run = read_run(directory)
    except ReportError as error:
        raise CompareError(str(error))
    if (run.config.get("settings") or {}).get("task") != "lst":
        raise CompareError(f"{directory} is not an LST run (its config.json names task "
                           f"{(run.config.get('settings') or {}).get('task')!r})")
    try:
        settings = recorded_settings(directory, run)
    except ReportError as error:
        raise CompareError(str(error))
    if not {"pe", "sigma", "train_acc", "test_acc"} <= set(run.curves.columns):  # no curves.parquet: empty
        raise CompareError(f"{directory} has no curves (pe, sigma, train_acc, test_acc) to compare")
    curves = run.curves[run.curves["pe"].isin(["learned", "sin2d"])].copy()
    if curves.empty:
        raise CompareError(f"{directory} has no learned or sin2d curves with train_acc and test_acc to compare")
    curves["epoch"] = our_epochs(directory, run.config, settings, curves)
    curves["setting"] = [("sin2d" if pe == "sin2d" else f"learned σ={sigma:g}") + dropout_note(settings, pe)
                         for pe, sigma in zip(curves["pe"], curves["sigma"])]
    curves["folder"] = str(directory)
    return curves, settings


def pooled_curves(directories: list[Path]) -> pd.DataFrame:
    """The curves of every folder as one run's, after checking that they trained alike."""
    runs = [read_lst_run(directory) for directory in directories]
    settings = {directory: s for directory, (_, s) in zip(directories, runs)}
    constant = all(s.schedule == "constant" for s in settings.values())
    try:
        check_alike(settings, MAY_DIFFER | ALSO_MAY_DIFFER | ({"steps"} if constant else set()))
    except ReportError as error:
        raise CompareError(str(error))
    curves = pd.concat([c for c, _ in runs], ignore_index=True)
    seeds = curves.drop_duplicates(["setting", "seed", "folder"])
    twice = seeds[seeds.duplicated(["setting", "seed"])]
    if len(twice):
        setting, seed = twice.iloc[0][["setting", "seed"]]
        raise CompareError(f"seed {seed} of {setting} is in more than one of the folders; give each seed once")
    return curves


def compare(directories: list[Path], logs: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The comparison table (one row per setting and compared epoch) and the verdict lines."""
    curves = pooled_curves(directories)
    logged = np.sort(logs["epoch"].unique())
    spacing = np.diff(logged).min() if len(logged) > 1 else 200
    curves["their_epoch"] = logged[np.abs(curves["epoch"].to_numpy()[:, None] - logged[None]).argmin(1)]
    curves = curves[np.abs(curves["epoch"] - curves["their_epoch"]) <= EPOCH_MATCH * spacing]
    rows, verdicts = [], []
    for (pe, sigma, label), ours in curves.groupby(["pe", "sigma", "setting"], dropna=False, sort=True):
        theirs_all = logs[(logs["pe"] == pe) & (logs["sigma"].isna() if pe == "sin2d"
                                                 else np.isclose(logs["sigma"], sigma))]
        shared = sorted(set(ours["seed"]) & set(theirs_all["seed"]))
        if not shared:
            verdicts.append(f"* **{label}**: none of its seeds is one of the authors'; nothing to compare.")
            continue
        for epoch, at in ours[ours["seed"].isin(shared)].groupby("their_epoch"):
            # per seed, the evaluation nearest to their epoch
            at = at.loc[(at["epoch"] - epoch).abs().groupby(at["seed"]).idxmin()].set_index("seed")
            theirs_epoch = theirs_all[theirs_all["epoch"] == epoch].set_index("seed")
            theirs = theirs_epoch.loc[at.index]
            row = {"setting": label, "their epoch": int(epoch), "our epoch": float(at["epoch"].mean()),
                   "seeds": len(at)}
            for phase, column in zip(COMPARED_PHASES, ("train_acc", "test_acc")):
                difference = at[column] - theirs[phase]
                scale = theirs_epoch[phase].std(ddof=1)
                if scale > 0:
                    in_sd = difference.mean() / scale
                else:  # every seed of theirs at the same accuracy (100 % training accuracy): any difference is outside
                    in_sd = np.copysign(np.inf, difference.mean()) if difference.mean() else 0.0
                row.update({f"ours {phase}": at[column].mean(), f"ours {phase} sd": at[column].std(ddof=0),
                            f"theirs {phase}": theirs[phase].mean(), f"theirs {phase} sd": theirs[phase].std(ddof=0),
                            f"Δ {phase}": difference.mean(), f"Δ {phase} / their sd": in_sd})
            row["theirs human108"] = theirs["human108"].mean() if "human108" in theirs else np.nan
            rows.append(row)
        last = rows[-1]
        within = all(abs(last[f"Δ {p} / their sd"]) <= 1 for p in ("train", "test"))
        verdicts.append(
            f"* **{label}** at their epoch {last['their epoch']} (ours {last['our epoch']:.0f}, {last['seeds']} "
            f"shared seeds): {'within' if within else 'not within'} one of their seed-sds "
            f"(train Δ {100 * last['Δ train']:+.1f} points = {in_sds(last['Δ train / their sd'], ' sd')}, test Δ "
            f"{100 * last['Δ test']:+.1f} points = {in_sds(last['Δ test / their sd'], ' sd')}).")
    return pd.DataFrame(rows), verdicts


def in_sds(ratio: float, unit: str = "") -> str:
    """A difference in their seed-sds; infinite where all their seeds agree exactly and ours differ."""
    return f"{ratio:+.2f}{unit}" if np.isfinite(ratio) else "outside: their seeds' sd is 0"


def percent(mean: float, sd: float) -> str:
    return f"{100 * mean:.1f} ± {100 * sd:.1f}"


def markdown(table: pd.DataFrame, verdicts: list[str], directories: list[Path]) -> str:
    names = " + ".join(inert(directory.resolve().name, cell=False) for directory in directories)
    lines = [f"# {names} against the authors' LST logs", "",
             "Accuracy in %, mean ± sd over the seeds both runs have; Δ = ours − theirs paired by seed, also in "
             "units of their seed-sd over all 15 seeds. human108: their generalisation puzzles (not shipped).", "",
             "| setting | their epoch | our epoch | seeds | train: ours | theirs | Δ (sd) | test: ours | theirs | "
             "Δ (sd) | theirs human108 |", "|" + "---|" * 11]
    for r in table.to_dict("records"):
        cells = [r["setting"], str(r["their epoch"]), f"{r['our epoch']:.0f}", str(r["seeds"])]
        for p in ("train", "test"):
            cells += [percent(r[f"ours {p}"], r[f"ours {p} sd"]), percent(r[f"theirs {p}"], r[f"theirs {p} sd"]),
                      f"{100 * r[f'Δ {p}']:+.1f} ({in_sds(r[f'Δ {p} / their sd'])})"]
        cells.append("–" if np.isnan(r["theirs human108"]) else f"{100 * r['theirs human108']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + ["", "Verdicts (the last compared epoch):", "", *verdicts, ""])


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m pe_fast.compare_lst_logs",
                           description="an LST run's accuracy next to the authors' own logs")
    parser.add_argument("directories", nargs="+", metavar="DIR",
                        help="an LST results folder (--out of pe_fast.sweep --task lst); several count as one run")
    parser.add_argument("--out", help=f"write the table here (default: DIR/{OUTPUT} for one folder, none for several)")
    parser.add_argument("--logs", help="logs to compare with, parquet or CSV (default: the authors' own, which ship "
                        "with pe_fast)")
    args = parser.parse_args(argv)
    try:
        directories = [named_folder(d) for d in args.directories]
        check_named_once(directories)
        if args.logs is not None and not args.logs.strip():  # Path("") is ".": not the authors' logs either
            raise CompareError(f"--logs {args.logs!r} names no file")
        logs = read_logs(Path(args.logs) if args.logs is not None else None)
        named = "--out " if args.out is not None else ""
        try:
            if args.out is not None:  # "" once meant DIR's own table, "   " a file of that name here
                run_folder.check_out_name(args.out, "file")
            out = Path(args.out) if args.out is not None else directories[0] / OUTPUT if len(directories) == 1 \
                else None
            # the outermost: a finished pack's folder (packs/0) reads as a results folder of its own
            homes = [p for p in out.resolve().parents if run_folder.is_results_folder(p)] if out else []
            home = homes[-1] if homes else None
            # the one file of a results folder it may replace: that folder's own table, when it is the one compared
            own_table = out is not None and out.name == OUTPUT and \
                out.parent.resolve() in {d.resolve() for d in directories}
            if args.out is not None and home is not None and "packs" in out.resolve().relative_to(home).parts[:1]:
                raise CompareError(f"--out {out} lies in the packs of the results folder {home}; write the table "
                                   f"elsewhere")
            # a file it holds, or one a sweep writes there (a new ground_truth.npz would spoil it for its readers; a
            # table over .lock kept every later --resume out, and a live sweep from releasing it)
            ours = out is not None and out.name in (run_folder.CONFIG, run_folder.DIGESTS, run_folder.LOCK,
                                                    *run_folder.DIGESTED)
            if args.out is not None and home is not None and not own_table and (
                    out.exists() or out.is_symlink() or ours):
                raise CompareError(f"--out {out} is a file of the results folder {home}; write the table under a "
                                   f"new name")
            if out is not None:
                run_folder.check_outside_package(out)
            if out is not None and out.exists() and not out.is_file():  # a FIFO would block the write for ever
                raise CompareError(f"{named}{out} is not a regular file; name a new file")
        except OSError as error:  # a name too long, a folder not to be entered
            raise CompareError(f"{named}{out}: cannot write ({error.strerror or error})")
        except run_folder.OutFolderError as error:
            raise CompareError(f"{named}{error}")
        table, verdicts = compare(directories, logs)
        if table.empty:
            raise CompareError(f"none of the evaluations of {', '.join(map(str, directories))} lies near an epoch "
                               f"of the authors' logs (every 200 epochs) for a seed of theirs")
        text = markdown(table, verdicts, directories)
        if out is not None:
            try:  # written beside and renamed over: a link planted at out is replaced, never written through
                run_folder.write_atomic(out, lambda file: file.write(text.encode()))
            except OSError as error:
                raise CompareError(f"{named}{out}: cannot write ({error.strerror or error})")
    except (CompareError, ReportError) as error:  # ReportError: a folder named by nothing
        print_error(error)
        return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    from pe_fast.program_exit import exit_now
    exit_now(main())
