"""A sweep's results as files and as Python objects: the layer between the sweep, which writes them, and the report,
which reads them. Neither imports the other; both import this.

    run_folder.py   the folder's layout and its crash-safe writes (lock, atomic files, packs, checkpoints)
    settings.py     the settings record (config.json's "settings"), the task's own settings among them
    migrate.py      every older format of config.json's settings and of checkpoints, read as today's
    reading.py      a folder, finished or running, as a Run (pe_fast.load_run); its recorded settings; whether
                    folders pooled as one run trained alike
    summary.py      what both sides sum up: the summary table, baselines, optimizer axes, attention-map alignment

pe_fast's layers, lowest first. A module imports from its own unit (a package or module named here) and from units
of lower layers only: never from a unit beside it or above it (tests/test_layers.py checks every import).
"""

LAYERS = (
    ("pe_fast", "pe_fast._C", "pe_fast.seeds", "pe_fast.columns"),
    ("pe_fast.ops", "pe_fast.stacked_optim", "pe_fast.data", "pe_fast.host_to_device"),
    ("pe_fast.nn", "pe_fast.precision", "pe_fast.metrics"),
    ("pe_fast.models",),
    ("pe_fast.memory", "pe_fast.train", "pe_fast.tasks"),
    ("pe_fast.results",),
    ("pe_fast.sweep", "pe_fast.report"),
    ("pe_fast.sweep.program",),  # `python -m pe_fast.sweep`: the sweep, then the report
    ("pe_fast.sweep.api", "pe_fast.sweep.__main__", "pe_fast.compare_lst_logs", "pe_fast.cli"),
)
# Shortcuts imported when first used: pe_fast.load_run (results.reading) and pe_fast.sweep.run (sweep.api)
UPWARD_SHORTCUTS = {("pe_fast", "pe_fast.results.reading"), ("pe_fast.sweep", "pe_fast.sweep.api")}
