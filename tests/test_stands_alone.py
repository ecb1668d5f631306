"""The repository stands alone: a clone has everything the code, tests and docs point at.

Nothing refers to a path beside the repository (the machine it was developed on kept the authors' data and its
working notes one folder up), every relative link of the Markdown files resolves, and the LST task and
compare_lst_logs use the authors' data that ships in pe_fast/data/lst_authors.

Results folders are records, kept as they were written: docs/results/ is left out of the first two checks (its
README says which of its links dangle), bench/results/ out of the link check (its reports' figures were never
committed).
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pandas as pd
import pytest

import pe_fast
from pe_fast.compare_lst_logs import read_logs
from pe_fast.sweep.grid import AUTHOR_SEEDS
from pe_fast.tasks import lst, lst_puzzles

ROOT = Path(__file__).resolve().parents[1]
RECORDS = "docs/results/"
FIGURELESS_RECORDS = (RECORDS, "bench/results/")
THIS_FILE = str(Path(__file__).resolve().relative_to(ROOT))  # holds what the checks look for, as examples


def repository_files() -> list[str]:
    """What a commit of this tree holds: tracked files and the new ones git does not ignore, as long as they exist;
    none outside a git checkout."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return []
    return sorted(name for name in listed if (ROOT / name).is_file())


FILES = repository_files()
FOLDERS = {str(parent) for name in FILES for parent in Path(name).parents}
needs_git = pytest.mark.skipif(not FILES, reason="not a git checkout: no list of the repository's files")


def in_repository(path: Path) -> bool:
    """Whether path (absolute) is one of the repository's files or folders."""
    try:
        relative = path.resolve().relative_to(ROOT)
    except ValueError:
        return False
    return str(relative) in FILES or str(relative) in FOLDERS


def text_of(name: str) -> str | None:
    data = (ROOT / name).read_bytes()
    return None if b"\0" in data[:8192] else data.decode("utf-8", errors="replace")  # None: a binary file


# ----------------------------------------------------------------------------- (a) no path beside the repository

# The sibling folder itself, and the working notes and design document that lived there: notes/….md and
# design.md count only where no such file exists in the repository.
SIBLING = re.compile(r"\.\./shared\b")
NOTE = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*(?:notes/[\w.-]+\.md|design\.md))")


def outside_references(name: str, text: str) -> list[str]:
    found = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()}" for m in SIBLING.finditer(text)]
    for m in NOTE.finditer(text):
        path = m.group(1)
        if not (in_repository(ROOT / path) or in_repository((ROOT / name).parent / path)):
            found.append(f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {path}")
    return found


@needs_git
def test_nothing_points_beside_the_repository():
    found = []
    for name in FILES:
        text = text_of(name)
        if text is not None and not name.startswith(RECORDS) and name != THIS_FILE:
            found += outside_references(name, text)
    assert not found, "references to files outside the repository:\n" + "\n".join(found)


def test_the_outside_check_tells_in_repository_paths_apart(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "FILES", ["docs/notes/paper.md"])
    monkeypatch.setattr(sys.modules[__name__], "FOLDERS", {"docs/notes", "docs", "."})
    assert not outside_references("x.py", "docs/notes/paper.md §2, notes-on-design.md, docs/notes.md")
    assert not outside_references("docs/x.md", "as notes/paper.md says")  # relative to the file's folder
    beside = ".." + "/shared/data/lst"  # split, so that this file does not hold what it looks for
    assert outside_references("x.py", f"{beside}; notes/paper.md §2; see design.md's table") == [
        "x.py:1: " + beside[:9], "x.py:1: notes/paper.md", "x.py:1: design.md"]


# ----------------------------------------------------------------------------- (b) Markdown links resolve

FENCED = re.compile(r"^\s*(```|~~~).*?^\s*\1", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"(`+).+?\1", re.DOTALL)
INLINE = re.compile(r"!?\[[^\]]*\]\(\s*(?:<([^>]*)>|([^)\s]+))(?:\s+[\"'(][^)]*)?\s*\)")
DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def link_targets(text: str) -> list[str]:
    """The link targets of a Markdown text, outside code blocks and code spans."""
    prose = CODE_SPAN.sub("code", FENCED.sub("", text))  # a word, so that no line starts anew after a span
    targets = [m.group(1) if m.group(1) is not None else m.group(2) for m in INLINE.finditer(prose)]
    after_break = True  # a reference definition cannot continue a paragraph: it starts after a blank line or another
    for line in prose.splitlines():
        definition = DEFINITION.match(line) if after_break else None
        if definition:
            targets.append(definition.group(1))
        after_break = bool(definition) or not line.strip()
    return targets


def broken_links(name: str, text: str) -> list[str]:
    broken = []
    for target in link_targets(text):
        if SCHEME.match(target) or target.startswith("#"):
            continue  # a web address, or a place in this same file
        path = unquote(target.split("#")[0].split("?")[0])
        resolved = ROOT / path.lstrip("/") if path.startswith("/") else (ROOT / name).parent / path
        if not in_repository(resolved):
            broken.append(f"{name}: {target}")
    return broken


@needs_git
def test_every_relative_markdown_link_resolves():
    broken = []
    for name in FILES:
        if name.endswith(".md") and not name.startswith(FIGURELESS_RECORDS):
            broken += broken_links(name, (ROOT / name).read_text(encoding="utf-8", errors="replace"))
    assert not broken, "Markdown links to nothing in the repository:\n" + "\n".join(broken)


@needs_git
def test_the_link_check_reads_links_as_markdown_does():
    text = ("[a](README.md) [b](docs/#top) ![c](pe_fast/) [d](https://example.org/x) [e](#local) "
            "[f](<missing one.md> \"title\") `[g](in-code.md)`\n```\n[h](in-block.md)\n```\n\n[i]: ./nowhere.md\n"
            "text\n[j]: not-a-definition, the paragraph goes on\n")
    assert link_targets(text) == ["README.md", "docs/#top", "pe_fast/", "https://example.org/x", "#local",
                                  "missing one.md", "./nowhere.md"]
    assert broken_links("x.md", text) == ["x.md: missing one.md", "x.md: ./nowhere.md"]
    assert broken_links("docs/x.md", "[up](../README.md) [out](../../README.md)") == ["docs/x.md: ../../README.md"]


# ----------------------------------------------------------------------------- (c) the shipped authors' data


def test_shipped_data_lies_in_the_package():
    assert lst_puzzles.AUTHORS_DATA.is_relative_to(Path(pe_fast.__file__).resolve().parent)
    for name in (*lst_puzzles.AUTHORS_PUZZLE_FILES, lst_puzzles.AUTHORS_LOGS_FILE, "LICENSE", "SOURCE.md"):
        assert lst_puzzles.authors_file(name).stat().st_size > 0
    assert "MIT License" in (lst_puzzles.AUTHORS_DATA / "LICENSE").read_text()


def test_lst_task_trains_on_the_authors_puzzles_by_default(tmp_path):
    # a small ood set of our own keeps the test fast: the default builds one against the pool
    lst_puzzles.write_puzzles(lst_puzzles.generate_puzzles(3, seed=0), tmp_path / "ood.csv")
    task = lst.LSTTask(ood_path=tmp_path / "ood.csv")
    assert task.description["pool_source"] == str(lst_puzzles.AUTHORS_DATA)
    assert task.description["sizes"] == {"train": 8100, "test": 900, "ood": 3}
    assert task.description["conditions"]["train"] == {"binary": 2700, "ternary": 2700, "quaternary": 2700}
    pool = lst_puzzles.Puzzles.concat([task.puzzles["train"], task.puzzles["test"]])
    authors = lst_puzzles.authors_puzzles()
    assert len(authors) == 9000 and sorted(map(bytes, pool.grids)) == sorted(map(bytes, authors.grids))


def test_the_shipped_logs_are_the_authors():
    """The parquet holds what the authors' per-model files hold: 315 models (sin2d and learned σ = 0.1 … 2.0, their
    15 seeds), every 200 epochs to 4,000, 3 phases × 4 conditions; one model's file starts at epoch 600."""
    logs = pd.read_parquet(lst_puzzles.authors_file(lst_puzzles.AUTHORS_LOGS_FILE))
    assert list(logs.columns) == ["pe", "sigma", "seed", "epoch", "phase", "condition", "loss", "accuracy"]
    assert logs.shape == (79_344, 8)
    assert [logs[c].dtype.kind for c in ("sigma", "seed", "epoch", "loss", "accuracy")] == ["f", "i", "i", "f", "f"]
    assert set(logs["pe"]) == {"sin2d", "learned"} and logs.loc[logs["pe"] == "sin2d", "sigma"].isna().all()
    assert sorted(logs["sigma"].dropna().unique()) == pytest.approx([k / 10 for k in range(1, 21)])
    assert set(logs["seed"]) == set(AUTHOR_SEEDS) and len(AUTHOR_SEEDS) == 15
    assert sorted(logs["epoch"].unique()) == list(range(0, 4001, 200))
    assert set(logs["phase"]) == {"train", "test", "human108"}
    assert set(logs["condition"]) == {"average", "binary", "ternary", "quaternary"}
    assert logs.groupby(["pe", "sigma", "seed"], dropna=False).ngroups == 315
    assert logs["loss"].notna().equals(logs["condition"] == "average") and logs["accuracy"].between(0, 1).all()
    late = logs[(logs["pe"] == "learned") & (logs["sigma"] == 0.1) & (logs["seed"] == 6312)]
    assert late["epoch"].min() == 600 and len(late) == 18 * 12
    # their generalisation at epoch 4,000, mean ± sd over seeds in %: σ = 0.2 95.6 ± 3.8, σ = 2.0 37.7 ± 16.5
    human = logs[(logs["phase"] == "human108") & (logs["condition"] == "average") & (logs["epoch"] == 4000)]
    for sigma, mean, sd in ((0.2, 95.6, 3.8), (2.0, 37.7, 16.5)):
        accuracy = 100 * human.loc[np.isclose(human["sigma"], sigma), "accuracy"]
        assert (round(accuracy.mean(), 1), round(accuracy.std(ddof=0), 1)) == (mean, sd)


def test_compare_lst_logs_finds_the_shipped_logs_from_anywhere(tmp_path):
    """No --logs, run from a folder outside the repository: the comparison still reads the authors' logs."""
    assert read_logs()["seed"].nunique() == 15
    run = tmp_path / "run"
    shutil.copytree(ROOT / "docs" / "results" / "h100-paper-learned-16k", run)
    done = subprocess.run([sys.executable, "-m", "pe_fast.compare_lst_logs", str(run)], cwd=tmp_path, check=False,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "learned σ=2** at their epoch 200" in done.stdout
