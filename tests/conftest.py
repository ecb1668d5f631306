"""Under pytest-xdist (the README's test command runs one worker per core) each worker's torch, and each sweep
a test starts as a process of its own, uses one thread: workers of several threads each would fight for the cores."""
import os

import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the sweeps the tests start as processes of their own


# Tests by cost, so that the next engineer has a quick loop (python -m pytest -m "not slow", docs/developers.md).
# slow: the files whose tests start sweeps or other processes, compile (Triton, torch.compile, C++) or run a benchmark
# script: each takes 10 s or more on 2 cores (python -m pytest --durations=0). triton: they need triton installed
# (the interpreter suites, the ahead-of-time compiles); gpu: a test that runs only on a CUDA device (by name).
SLOW_FILES = {
    "test_bad_data.py", "test_bad_input.py", "test_bench_measure.py", "test_bench_peers.py",
    "test_bench_scripts.py", "test_compare_lst_logs.py", "test_cpp_kernels_ctest.py", "test_digits.py",
    "test_fused_sublayers.py", "test_interp_tools.py", "test_live_curves.py", "test_migrate.py",
    "test_open_models.py", "test_optimizer_axes.py", "test_pe_dropout.py", "test_precision.py",
    "test_precision_check.py", "test_python_api.py", "test_readme_commands.py", "test_report.py",
    "test_report_pooling.py", "test_rsa.py", "test_seed_values.py", "test_slurm_real.py", "test_stands_alone.py",
    "test_sweep.py", "test_sweep_docs.py", "test_sweep_regions.py", "test_sweep_scale.py", "test_task_registry.py",
    "test_triton_attention.py", "test_triton_compile.py", "test_until_converged.py",
}
# pytest-xdist hands each worker whole files (--dist loadfile) in the order collected, and the longest files would
# come last (it sorts by number of tests, and they hold few): they start first, longest first (python -m pytest
# --durations=0, summed a file), so that the workers finish together. pyproject's addopts turns xdist's own order off.
LONGEST_FIRST = ("test_sweep_scale.py", "test_triton_compile.py", "test_slurm_real.py", "test_readme_commands.py",
                 "test_fused_sublayers.py", "test_bad_input.py", "test_sweep_regions.py", "test_precision.py",
                 "test_triton_attention.py", "test_open_models.py", "test_pe_dropout.py")
TRITON_FILES = {"test_fused_sublayers.py", "test_triton_attention.py", "test_triton_compile.py"}
MARKERS = {"slow": "10 s or more a file: sweeps, processes, compiles (left out of the quick loop)",
           "triton": "needs triton: the interpreter suites and the ahead-of-time compiles",
           "gpu": "runs only on a CUDA device"}


def pytest_configure(config):
    for name, meaning in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")


def pytest_collection_modifyitems(config, items):
    import pytest
    rank = {file: i for i, file in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    for item in items:
        file = item.path.name
        if file in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
        if file in TRITON_FILES:
            item.add_marker(pytest.mark.triton)
        if "cuda" in item.name or "gpu" in item.name:
            item.add_marker(pytest.mark.gpu)
