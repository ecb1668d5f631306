"""bench/measure.py's timing in turn, and the benchmarks that use it run as a user runs them (tiny shapes: what
is checked is that they run and report one timing per round, not the speeds)."""
from __future__ import annotations

import importlib.util
import json
import operator
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("measure", ROOT / "bench" / "measure.py")
measure = importlib.util.module_from_spec(spec)
spec.loader.exec_module(measure)


def test_in_turn_warms_up_once_then_interleaves_the_functions_round_by_round():
    calls = []
    functions = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    times = measure.in_turn(functions, rounds=3, inner={"b": 2})
    assert calls == ["a", "b"] + ["a", "b", "b"] * 3
    assert {name: len(t) for name, t in times.items()} == {"a": 3, "b": 3}
    assert all(t >= 0 for ts in times.values() for t in ts)


def test_per_round_compares_within_rounds_not_the_medians():
    slow, fast = [2.0, 100.0, 3.0], [1.0, 50.0, 1.0]  # ratios 2, 2, 3 round by round
    assert measure.per_round(operator.truediv, slow, fast) == 2.0
    assert sorted(slow)[1] / sorted(fast)[1] == 3.0  # what a ratio of the medians would have said
    assert measure.per_round(lambda a, b, c: a + b + c, [1.0, 2.0], [1.0, 2.0], [1.0, 2.0]) == 4.5


def run_benchmark(tmp_path: Path, script: str, *flags: str) -> dict:
    out = tmp_path / f"{script}.json"
    done = subprocess.run([sys.executable, f"bench/training/{script}.py", *flags, "--repeats", "2", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def test_training_benchmark_runs_and_reports_every_round(tmp_path):
    row = run_benchmark(tmp_path, "bench_training", "--shapes", "16x8x2", "--depth", "1")["rows"][0]
    assert len(row["stacked_all_ms"]) == len(row["one_by_one_all_ms"]) == len(row["large_matmul_all_gflops"]) == 2
    assert row["speedup"] > 0 and row["large_matmul_gflops"] > 0


def test_batched_matmul_benchmark_runs(tmp_path):
    result = run_benchmark(tmp_path, "bench_batched_matmul", "--rows", "64", "--width", "16")
    assert len(result["gemms"]) == 8 and all(g["looped_speedup"] > 0 for g in result["gemms"])


def test_training_backends_benchmark_runs_each_backend_every_round(tmp_path):
    row = run_benchmark(tmp_path, "bench_training_backends", "--shapes", "lst", "--depth", "1",
                        "--backends", "reference,cpp")["rows"][0]
    assert len(row["reference_all_ms"]) == len(row["cpp_all_ms"]) == 2 and row["speedup_cpp_vs_reference"] > 0
