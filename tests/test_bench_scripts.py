"""bench/ by kind: every script there runs as bench/README.md says, `python bench/KIND/NAME.py` or
`bash bench/KIND/NAME.sh` from the repository root with nothing on PYTHONPATH, and its --help exits 0 and says what
it does (its header's first words). The scripts are found by glob, so a new one is held to the same; the Python
ones' --help runs share one child, since each imports torch and pe_fast (about 2 s)."""
from __future__ import annotations

import ast
import json
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


# Runs in one child each Python script's --help as `python SCRIPT --help` would: its folder first on sys.path, run
# as __main__; what it wrote and how it exited, as JSON. One child, so torch and pe_fast are imported once, not per
# script (the fixture took 70 s on 2 cores with a child per script).
HELP_RUNNER = """
import contextlib, io, json, runpy, sys
from pathlib import Path
done = {}
for script in sys.argv[1:]:
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv, sys.path[0] = [script, "--help"], str(Path(script).resolve().parent)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except Exception as error:
            code, _ = 1, err.write(repr(error))
    done[script] = (code, out.getvalue(), err.getvalue())
print(json.dumps(done))
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, subprocess.CompletedProcess]:
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    python = [s for s in SCRIPTS if s.endswith(".py")]
    child = subprocess.run([sys.executable, "-c", HELP_RUNNER, *python], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=300, check=True)
    done = {script: subprocess.CompletedProcess(script, *result)
            for script, result in json.loads(child.stdout.splitlines()[-1]).items()}
    for script in SCRIPTS:
        if script.endswith(".sh"):
            done[script] = subprocess.run(["bash", script, "--help"], cwd=ROOT, env=env, capture_output=True,
                                          text=True, timeout=120, check=False)
    return done


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
