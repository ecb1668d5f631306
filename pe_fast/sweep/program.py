"""`python -m pe_fast.sweep` as a program: the sweep, then its report. The one module that joins the two, above
both (pe_fast.results.LAYERS): the sweep itself (cli.py) never imports the report."""
from __future__ import annotations

from pathlib import Path

from pe_fast.results.reading import Run, load_run
from pe_fast.results.settings import Settings
from pe_fast.sweep import cli


def write_report(out: Path):
    from pe_fast.report import write_report  # the report's imports (matplotlib) when the sweep has finished only
    write_report(out)


def run(s: Settings) -> Run:
    return load_run(cli.run(s, write_report))


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, write_report)
