"""report.md from a results folder, and `python -m pe_fast.report DIR`."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from pe_fast.markdown import inert
from pe_fast.program_exit import print_error
from pe_fast.results import run_folder
from pe_fast.report import pooling, rsa
from pe_fast.report.figures import FIGURES, draw_figures
from pe_fast.report.numbers import (Alignment, Convergence, alignment, convergence, convergence_lines, fmt,
                                    map_alignment, statement, stopping_lines, summary_markdown)
from pe_fast.results.reading import ReportError, Run, named_folder, read_run, task_name
from pe_fast.results.summary import is_baseline, sigma_label
from pe_fast.tasks import KINDS
from pe_fast.tasks.base import TaskView

def config_markdown(config: dict) -> str:
    if not config:
        return "No config.json in the folder."
    settings = config.get("settings") or {}
    lines = ["| setting | value |", "|---|---|"]
    for key, value in settings.items():
        if isinstance(value, list):
            value = ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
        lines.append(f"| {inert(key)} | {inert(value)} |")
    for key in ("torch", "time"):
        if key in config:
            lines.append(f"| {key} | {inert(config[key])} |")
    if "models" in config:
        lines.append(f"| models planned | {len(config['models'])} |")
    task = config.get("task") or {}
    for key in ("pool_source", "ood_source", "sizes", "ood_min_distance_achieved", "source", "tokens"):
        if key in task:
            value = json.dumps(task[key]) if isinstance(task[key], (dict, list)) else task[key]
            lines.append(f"| task {key} | {inert(value)} |")
    return "\n".join(lines)


@dataclasses.dataclass
class Report:
    """What report.md is written from: the run, its task's view, the attention alignment, the convergence checks
    and the figures drawn (name -> caption) or not (why)."""
    name: str
    directory: Path
    run: Run
    task: str
    view: TaskView
    align: Alignment | None
    checks: list[Convergence]
    drawn: dict[str, str]
    skipped: list[str]

    @property
    def results(self) -> pd.DataFrame:
        return self.run.results


@dataclasses.dataclass(frozen=True)
class Section:
    """One part of report.md: its lines, where it applies, in the order of SECTIONS."""
    name: str
    applies: Callable[[Report], bool]
    lines: Callable[[Report], list[str]]


def always(report: Report) -> bool:
    return True


def title_lines(r: Report) -> list[str]:
    lines = [f"# pe_fast report: {inert(r.name, cell=False)}", ""]  # a folder's name is anyone's text
    lines += [f"> {inert(note, cell=False)}" for note in r.run.notes] + ([""] if r.run.notes else [])
    baselines = int(is_baseline(r.results["pe"]).sum())
    kinds = r.results["data_kind"].dropna() if "data_kind" in r.results else pd.Series(dtype=str)
    data_kind = kinds.iloc[0] if len(kinds) else None  # fmri / simulated from real FC / netsim
    return lines + [f"Task **{r.task}**" + (f" on data: **{inert(data_kind, cell=False)}**" if data_kind else "")
                    + f", {len(r.results) - baselines} trained models"
                    + (f" and {baselines} baseline rows" if baselines else "") + ".", ""]


def convergence_section(r: Report) -> list[str]:
    stops = stopping_lines(r.results, r.run.settings.get("steps"))
    return ["## Convergence", "", *(convergence_lines(r.checks, r.view)
                                    or ["No curves.parquet: convergence cannot be judged."]), "",
            *stops, *([""] if stops else [])]


def statement_section(r: Report) -> list[str]:
    return ["## What the numbers show", "", statement(r.run, r.view, r.checks), ""]


def alignment_paragraph(r: Report) -> list[str]:
    view, align = r.view, r.align
    paper = f"; the paper reports {view.paper_rho[0]} {view.paper_rho[1]}." if view.paper_rho else "."
    return [f"**Attention alignment vs generalisation:** Spearman ρ = {fmt(align.rho, 3)} over {align.n} models "
            f"(alignment = {align.source} averaged over layers and heads; generalisation = {view.score}){paper}", ""]


def map_alignment_paragraph(r: Report) -> list[str]:
    view, maps = r.view, map_alignment(r.results, r.view)
    if not maps.n:
        return [f"**Attention-map alignment** (the paper's measure) needs {view.reference_pe} models in the run (add "
                f"`{view.reference_pe}` to `--pe`).", ""]
    return [f"**Attention-map alignment with the {view.reference_pe} models vs generalisation** (the paper's "
            f"measure): Spearman ρ = {fmt(maps.rho, 3)} over {maps.n} models (attn_map_alignment = Pearson r of a "
            f"model's attention map, mean over heads and the {view.score.split('_')[0]} items, with the "
            f"{view.reference_pe} models' mean map, averaged over layers; {view.reference_pe} models against their "
            f"other seeds)" + (f"; the paper reports {view.paper_rho[0]}." if view.paper_rho else "."), ""]


def summary_section(r: Report) -> list[str]:
    return ["## Summary (mean ± sd over seeds)", "", summary_markdown(r.results, r.view), "",
            "sd is the population standard deviation over seeds (as in summary.txt).", ""]


def rsa_section(r: Report) -> list[str]:
    """rsatoolbox's ρ_a of the PE RDMs with the ground truth's, per (PE, σ)."""
    lines = ["## RSA with rsatoolbox", ""]
    if not rsa.available():
        return lines + ["rsatoolbox is not installed (pip install \"pe_fast[rsa]\"); `python -m pe_fast.report DIR "
                        "--rdms` exports the RDMs once it is.", ""]
    table = rsa.rank_table(r.run, r.task, r.directory)
    if table.empty:
        return lines + ["No model with a PE table, or no ground truth to compare with.", ""]
    lines += ["Rank correlation ρ_a (rsatoolbox, `rho-a`) of each model's PE dissimilarities (1 − cosine similarity "
              "of its first PE table's rows) with the ground truth's; mean over the models of a (PE, σ), with a 95 % "
              "bootstrap interval over them.", "",
              "| PE | σ | ground truth | models | ρ_a | 95 % interval |", "|---|---|---|---|---|---|"]
    for row in table.itertuples():
        lines.append(f"| {row.pe} | {sigma_label(row.sigma)} | {row.ground_truth} | {row.models} | {fmt(row.rho_a)} | "
                     f"{fmt(row.ci_low)} … {fmt(row.ci_high)} |")
    return lines + [""]


def figures_section(r: Report) -> list[str]:
    lines = ["## Figures", ""]
    for name, caption in r.drawn.items():
        lines += [f"### {name.replace('_', ' ')}", "", caption, "", f"![{name}](figures/{name}.png)", ""]
    if r.skipped:
        lines += ["Not drawn:", ""] + [f"* {inert(s, cell=False)}" for s in r.skipped] + [""]
    return lines


# report.md, top to bottom
SECTIONS = (
    Section("title", always, title_lines),
    Section("convergence", always, convergence_section),
    Section("what the numbers show", always, statement_section),
    Section("attention alignment", lambda r: r.align is not None, alignment_paragraph),
    # None for runs from before the attn_map_alignment column, or a task without a reference PE
    Section("attention-map alignment", lambda r: map_alignment(r.results, r.view) is not None,
            map_alignment_paragraph),
    Section("summary", always, summary_section),
    Section("RSA", always, rsa_section),
    Section("figures", always, figures_section),
    Section("configuration", always, lambda r: ["## Configuration", "", config_markdown(r.run.config), ""]),
)


def report_markdown(report: Report) -> str:
    return "\n".join(line for section in SECTIONS if section.applies(report) for line in section.lines(report))


def write_report(directory: str | os.PathLike, more_files: tuple[str, ...] = ()) -> Path:
    """Write DIR/report.md and DIR/figures/*.png from the results in DIR; return the report's path. more_files:
    the files the caller writes beside them afterwards (--rdms), checked with them before anything is drawn."""
    directory = Path(directory)
    run = read_run(directory)  # which refuses a link out of DIR: report.md and figures/ are written inside it only
    report, figures = directory / run_folder.REPORT, directory / run_folder.FIGURES
    files = [report, *(directory / name for name in more_files)]
    wrong = next((path for path in files if path.is_dir()), figures if figures.exists() and not figures.is_dir()
                 else None)
    if wrong is not None:  # before a figure is drawn
        raise ReportError(f"{wrong} is in the way: the report writes {', '.join(path.name for path in files)} as "
                          f"files and {run_folder.FIGURES}/ as a folder; move it away")
    # each figure it may draw (or remove, where it draws it no more) replaces a file: a folder, FIFO or link there
    # failed after the figures before it were redrawn
    figure = next((path for path in (figures / f"{name}.png" for name in FIGURES)
                   if path.is_symlink() or (path.exists() and not path.is_file())), None)
    if figure is not None:
        raise ReportError(f"{figure} is in the way: the report writes its figures as files there; move it away")
    task = task_name(run)
    view = KINDS[task].view
    align = alignment(run.results, view)
    # the folder read, its links resolved once: every write goes there from the root without following a link, so
    # that the folder (or figures/ in it) swapped for a link while the report runs leads no write out of it
    top = directory.resolve()
    drawn, skipped = draw_figures(run, view, align, top)
    text = report_markdown(Report(top.name, directory, run, task, view, align,
                                  convergence(run.curves, view), drawn, skipped))
    run_folder.write_atomic(top / run_folder.REPORT, lambda file: file.write(text.encode()), under=Path(top.anchor))
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--version"]:
        import pe_fast
        print(f"pe-fast {pe_fast.__version__}")
        return 0
    if argv and argv[0] in ("-h", "--help"):
        from pe_fast import report  # the package's docstring holds the usage
        print("\n\n".join(report.__doc__.split("\n\n")[:3]).strip())
        print("\n--out POOLED  with several folders: the folder to pool them into (made; not inside one of them)\n"
              "--rdms        also write DIR/rdms.hdf5, every model's and the ground truth's RDMs for rsatoolbox "
              "(pip install -e \".[rsa]\")")
        return 0
    usage = ("usage: python -m pe_fast.report DIR [--rdms] (one results folder), or python -m pe_fast.report DIR "
             "DIR ... --out POOLED [--rdms] (several, pooled as one run)")
    argv = [part for a in argv for part in (["--out", a[len("--out="):]] if a.startswith("--out=") else [a])]
    out = None
    if "--out" in argv:  # its value first: --out --rdms C took C as the pooled folder once --rdms was taken out
        at = argv.index("--out")
        out, argv = (argv[at + 1] if at + 1 < len(argv) else ""), argv[:at] + argv[at + 2:]
        if out.startswith("-"):
            print_error(f"--out {out!r}: a flag where the pooled folder's name belongs (a folder named so: "
                        f"./{out}); {usage}")
            return 2
    rdms = "--rdms" in argv
    argv = [a for a in argv if a != "--rdms"]
    if unknown := next((a for a in argv if a.startswith("-")), None):  # a misspelled --rdms once got the usage alone
        print(f"error: unrecognized argument {unknown!r}; {usage}", file=sys.stderr)
        return 2
    if out == "":
        print(f"error: --out names no folder; {usage}", file=sys.stderr)
        return 2
    if not argv or (out is None and len(argv) != 1):
        print(f"error: {usage}", file=sys.stderr)
        return 2
    if rdms and not rsa.available():
        print("error: --rdms needs rsatoolbox, which is not installed: pip install \"pe_fast[rsa]\"", file=sys.stderr)
        return 2
    try:
        folders = [named_folder(a) for a in argv]
        folder = folders[0] if out is None else pooling.pool(folders, Path(out))
        report = write_report(folder, (rsa.RDMS_FILE,) if rdms else ())
        if rdms:
            run = read_run(folder)
            print(f"RDMs written to {rsa.export(run, task_name(run), folder)}", file=sys.stderr)
    except ReportError as error:
        print_error(error)
        return 2
    except OSError as error:  # a read-only folder, a full disk: nothing more is written
        print_error(f"{error.filename or argv[0]}: {error.strerror or error}; the report could not be written")
        return 2
    print(f"report written to {report}", file=sys.stderr)
    return 0
