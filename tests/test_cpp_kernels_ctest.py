"""The C++ kernels on their own (kernels/, no torch): configure and build CMakeLists.txt into a temporary
directory and run its ctest suite (kernels/tests/*.cpp, each against a naive double-precision implementation);
and the kernels' A/B benchmark builds."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("ctest") is None, reason="needs cmake and ctest")
def test_kernel_unit_tests_pass(tmp_path):
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    for command in (["cmake", "-S", str(ROOT), "-B", str(tmp_path), *generator],
                    ["cmake", "--build", str(tmp_path)],
                    ["ctest", "--output-on-failure"]):
        step = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert step.returncode == 0, f"{' '.join(command)}\n{step.stdout[-4000:]}\n{step.stderr[-4000:]}"
    assert "tests passed" in step.stdout


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs g++ and a git checkout")
def test_kernel_ab_benchmark_builds_and_compares_with_head():
    """bench/op/kernel_ab.sh: HEAD's kernels against the working tree's, on a tiny shape; a bad revision is one
    error line and exit code 2."""
    run = subprocess.run(["bash", "bench/op/kernel_ab.sh", "HEAD", "5", "4", "1", "2", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("N=5 d_head=4 probes=1 problems=2: forward old"), run.stdout
    bad = subprocess.run(["bash", "bench/op/kernel_ab.sh", "no-such-revision"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0, bad.stderr
