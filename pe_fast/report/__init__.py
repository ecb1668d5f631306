"""`python -m pe_fast.report DIR`: tables, figures and a plain summary of a sweep's results folder.

    python -m pe_fast.report runs/lst-20260101-120000
    python -m pe_fast.report runs/learned runs/sin1d --out runs/learned-and-sin1d

writes DIR/report.md and DIR/figures/*.png. Works on a finished sweep (DIR/results.parquet, curves.parquet,
pe_tables.npz) and on one still running (the finished packs in DIR/packs/<index>/). Every number in the report is
computed from those files; nothing is hard-coded. A missing or empty folder stops with one line, exit code 2.
Several finished sweeps of one configuration that trained different models (PE kinds, σ, seeds) pool into the
results folder --out, reported as one run and paired by seed; folders that trained otherwise are refused.

The package: numbers.py (statistics, alignment, the statement), figures.py, pooling.py (several folders as one),
cli.py (report.md: write_report, and main). It reads folders through pe_fast.results, as the sweep writes them.
"""
from pe_fast.report.cli import main, write_report
from pe_fast.results.reading import load_run  # pe_fast.report.load_run, as before the results layer

__all__ = ["load_run", "main", "write_report"]
