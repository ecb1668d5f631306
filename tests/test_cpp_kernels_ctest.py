"""The C++ kernels on their own (kernels/, no torch): configure and build CMakeLists.txt into a temporary
directory and run its ctest suite (kernels/tests/*.cpp, each against a naive double-precision implementation)."""
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
