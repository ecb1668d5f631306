"""`python -m pe_fast.sweep`: train a grid of PE types × σ × seeds as stacked packs and write a results folder.

    python -m pe_fast.sweep --task lst --pe learned,sin2d,none --sigmas 0.1,0.2,2.0 --seeds 3 --steps 2000 --out DIR

DIR gets config.json at the start, packs/<index>/ as each pack finishes, and at the end results.parquet (one row
per model), curves.parquet (one row per model and evaluation), pe_tables.npz (each model's final PE tables),
summary.txt and report.md (pe_fast.results.run_folder describes the layout). Each pack checkpoints its training
state, so a killed sweep continues with `--resume --out DIR` and ends with the results an uninterrupted run would
have.
`--executor ray` trains the packs as Ray tasks, on this machine or a cluster. A user mistake stops with one line
and exit code 2, before anything is written.

From Python: `pe_fast.sweep.run(task="lst", sigmas=[0.2, 2.0], ...)` takes the flags as keyword arguments and
returns the results folder as a `pe_fast.results.reading.Run` (api.py).

The package: settings.py (flags + task defaults + preset → one frozen Settings), validation.py (the rules every
setting must satisfy), runtime.py (what the machine offers: CUDA, Ray, SLURM, packages), resume.py (--resume: the
settings back from DIR/config.json), task_loading.py (the task from the settings), grid.py (models, packs, model
and training configurations), executors.py (local, Ray and SLURM; one pack's unit of work), folder.py (what the
sweep writes at its start and end), progress.py (the progress line), cli.py (run and main), program.py (the sweep,
then the report: python -m pe_fast.sweep).
"""


class UsageError(ValueError):
    """A mistake in the user's flags or files: reported as one line, exit code 2. A ValueError, so that a Python
    caller's `except ValueError` catches a bad argument as it would from any other function."""


def __getattr__(name: str):
    """pe_fast.sweep.run (api.py), imported when first used: importing pe_fast.sweep.settings stays light."""
    if name == "run":
        from pe_fast.sweep.api import run
        return run
    raise AttributeError(f"module 'pe_fast.sweep' has no attribute {name!r}")
