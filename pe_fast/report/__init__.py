"""`python -m pe_fast.report DIR`: tables, figures and a plain summary of a sweep's results folder.

    python -m pe_fast.report runs/lst-20260101-120000

writes DIR/report.md and DIR/figures/*.png. Works on a finished sweep (DIR/results.parquet, curves.parquet,
pe_tables.npz) and on one still running (the finished packs in DIR/packs/<index>/). Every number in the report is
computed from those files; nothing is hard-coded. A missing or empty folder stops with one line, exit code 2.

The package: reading.py (the folder, through pe_fast.run_folder), numbers.py (statistics, alignment, summary,
statement), figures.py, cli.py (report.md: write_report, and main).
"""
from pe_fast.report.cli import main, write_report
from pe_fast.report.reading import load_run

__all__ = ["load_run", "main", "write_report"]
