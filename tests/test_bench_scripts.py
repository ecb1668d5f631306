"""bench/ by kind: every script there runs as bench/README.md says, `python bench/KIND/NAME.py` or
`bash bench/KIND/NAME.sh` from the repository root with nothing on PYTHONPATH, and its --help exits 0 and says what
it does (its header's first words). The scripts are found by glob, so a new one is held to the same; the --help runs
go side by side, since each Python one imports torch and pe_fast (about 2 s)."""
from __future__ import annotations

import ast
import concurrent.futures
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "bench").glob("*/*")
                 if path.suffix in (".py", ".sh") and path.name != "__init__.py")


def header(script: str) -> str:
    """The first line of the script's docstring or header comment: what its --help must say."""
    text = (ROOT / script).read_text()
    if script.endswith(".py"):
        return ast.get_docstring(ast.parse(text)).splitlines()[0]
    return next(line for line in text.splitlines() if line.startswith("# ")).removeprefix("# ")


@pytest.fixture(scope="module")
def helps() -> dict[str, subprocess.CompletedProcess]:
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}

    def run(script: str) -> subprocess.CompletedProcess:
        command = [sys.executable if script.endswith(".py") else "bash", script, "--help"]
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, max(2, os.cpu_count() or 2))) as pool:
        return dict(zip(SCRIPTS, pool.map(run, SCRIPTS)))


def test_every_script_is_in_a_kind_folder_and_in_the_readme():
    assert len(SCRIPTS) > 20 and {path.name for path in (ROOT / "bench").glob("*.*")} == {"README.md", "measure.py"}
    readme = (ROOT / "bench" / "README.md").read_text()
    assert [s for s in SCRIPTS if f"`{s.removeprefix('bench/')}`" not in readme] == []


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_runs_from_the_root_and_says_what_the_script_does(helps, script):
    done = helps[script]
    assert done.returncode == 0, done.stderr
    first_words = " ".join(header(script).split()[:5])
    assert first_words in " ".join(done.stdout.split()), done.stdout
