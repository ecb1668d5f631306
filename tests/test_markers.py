"""The cost markers of tests/conftest.py name files that exist, so that a renamed slow file cannot slip into the quick
loop (python -m pytest -m "not slow") unnoticed, and the quick loop collects only files outside SLOW_FILES."""
import subprocess
import sys
from pathlib import Path

import conftest

TESTS = Path(__file__).resolve().parent


def test_every_marked_file_exists():
    files = {path.name for path in TESTS.glob("test_*.py")}
    assert conftest.SLOW_FILES - files == set() and conftest.TRITON_FILES - files == set()
    assert conftest.TRITON_FILES <= conftest.SLOW_FILES
    assert set(conftest.LONGEST_FIRST) <= conftest.SLOW_FILES


def test_the_quick_loop_leaves_the_slow_files_out():
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-n", "0", "-m", "not slow",
                           "-p", "no:cacheprovider"], cwd=TESTS.parent, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    collected = {line.split("::")[0].removeprefix("tests/") for line in done.stdout.splitlines() if "::" in line}
    assert collected and not collected & conftest.SLOW_FILES
    assert "test_markers.py" in collected
