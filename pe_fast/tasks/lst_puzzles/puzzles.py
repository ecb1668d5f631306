"""LST puzzles as data: the grid's constants, a set of puzzles (Puzzles), their CSV files, the one-hot encoding the
models read, the train/test split, and the authors' puzzles that ship with pe_fast."""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

CONDITIONS = ("binary", "ternary", "quaternary")

BLANK = 0
QUERY = 5
NUM_CELLS = 16
NUM_SHAPES = 4
# Channels of the one-hot encoding: shapes 1-4, then the query marker.
NUM_SYMBOLS = 5

CSV_HEADER = ("ID", "LST_num", "condition", "puzzles", "solutions")
_REQUIRED_COLUMNS = ("condition", "puzzles", "solutions")
# File spelling of each condition, in condition-id order.
_FILE_CONDITION_NAMES = ("Binary", "Ternary", "Quaternary")


class PuzzleFileError(ValueError):
    """A puzzle file that cannot be used; the message reads ``"{path}:{line}: {problem}"``.

    ``line`` counts physical lines with the header as line 1; line 0 means the file as a whole
    (missing, unreadable, a folder without CSV files). ``setting``: the task's setting that named the file, where
    the error knows it (one file may be named by two).
    """

    def __init__(self, path: str | os.PathLike, line: int, problem: str, setting: str | None = None):
        self.path = str(path)
        self.line = line
        self.problem = problem
        self.setting = setting
        super().__init__(f"{self.path}:{line}: {problem}")


@dataclass
class Puzzles:
    """A set of puzzles: ``grids`` [P,16] int8, ``answers`` [P] int64 (1..4), ``conditions`` [P] int64
    (index into CONDITIONS) and a human-readable ``source``."""

    grids: np.ndarray
    answers: np.ndarray
    conditions: np.ndarray
    source: str = ""

    def __post_init__(self):
        self.grids = np.asarray(self.grids, dtype=np.int8).reshape(-1, NUM_CELLS)
        self.answers = np.asarray(self.answers, dtype=np.int64).reshape(-1)
        self.conditions = np.asarray(self.conditions, dtype=np.int64).reshape(-1)
        if not len(self.grids) == len(self.answers) == len(self.conditions):
            raise ValueError(
                f"Puzzles: {len(self.grids)} grids, {len(self.answers)} answers and "
                f"{len(self.conditions)} conditions must have the same length"
            )

    def __len__(self) -> int:
        return len(self.grids)

    def subset(self, index) -> "Puzzles":
        """The puzzles selected by ``index`` (integer array, boolean mask or slice)."""
        if isinstance(index, slice):
            index = np.arange(len(self))[index]
        index = np.asarray(index)
        return Puzzles(self.grids[index], self.answers[index], self.conditions[index], self.source)

    @classmethod
    def concat(cls, parts: Sequence["Puzzles"], source: str | None = None) -> "Puzzles":
        """All puzzles of ``parts`` in order; the source defaults to the parts' sources joined by '+'."""
        parts = list(parts)
        if not parts:
            raise ValueError("Puzzles.concat needs at least one set of puzzles")
        if source is None:
            source = "+".join(dict.fromkeys(p.source for p in parts))
        return cls(
            np.concatenate([p.grids for p in parts]),
            np.concatenate([p.answers for p in parts]),
            np.concatenate([p.conditions for p in parts]),
            source,
        )

    def condition_counts(self) -> dict[str, int]:
        return {name: int((self.conditions == k).sum()) for k, name in enumerate(CONDITIONS)}


def _check_puzzle_field(text: str) -> tuple[list[int] | None, str | None]:
    """Parse the 16-digit grid; returns (grid, None) or (None, problem)."""
    digits = text.isascii() and text.isdigit()  # isdigit alone passes '³' and other digits int() refuses
    if len(text) != NUM_CELLS or not digits:
        problem = f"puzzle must be {NUM_CELLS} digits 0-5, got {text!r} ({len(text)} characters)"
        if digits and len(text) < NUM_CELLS:
            problem += "; leading zeros lost by a spreadsheet or pandas?"
        return None, problem
    grid = [int(ch) for ch in text]
    for cell, digit in enumerate(grid):
        if digit > QUERY:
            return None, f"puzzle {text!r}: digit {digit} in cell {cell} is outside 0-5"
    n_query = grid.count(QUERY)
    if n_query != 1:
        return None, f"puzzle {text!r} must have exactly one query cell (5), found {n_query}"
    return grid, None


def _check_solutions(path: Path, lines: list[int], grids: np.ndarray, answers: np.ndarray):
    """Each grid an LST puzzle with its file's solution as its one answer, by brute force over the 576 Latin squares
    (what a puzzle means): one that no Latin square completes, whose completions hold another shape at the query, or
    several shapes (the task scores one answer per puzzle), would be scored against a wrong answer. Blanks other
    than the query may have several completions: a third of the authors' puzzles do, none at the query."""
    from pe_fast.tasks.lst_puzzles.solver import query_shapes, repeated_shape  # solver imports this module
    fits = query_shapes(grids)
    bad = np.flatnonzero(~fits[np.arange(len(grids)), answers - 1] | (fits.sum(axis=1) > 1))
    if not bad.size:
        return
    k = bad[0]
    shapes = " or ".join(str(shape) for shape in np.flatnonzero(fits[k]) + 1)
    if not fits[k].any():
        repeat = repeated_shape([0 if v == QUERY else int(v) for v in grids[k]])
        problem = f"no Latin square completes it ({repeat or 'its blanks cannot all be filled'})"
    elif not fits[k, answers[k] - 1]:
        problem = f"solution {answers[k]} contradicts it: its query must hold {shapes}"
    else:
        problem = f"ambiguous: its query may hold {shapes}, and a puzzle has one answer"
    raise PuzzleFileError(path, lines[k], f"puzzle {k + 1} of the file, {''.join(map(str, grids[k]))!r}: {problem}")


def _check_conditions(path: Path, lines: list[int], grids: np.ndarray, conditions: np.ndarray):
    """Each puzzle's condition the one the rules solve it in (pe_fast.tasks.lst_puzzles.solver.classify, which
    solves every one of the authors' 9,000 in the condition they give): the task's per-condition splits and scores
    read the file's."""
    from pe_fast.tasks.lst_puzzles.solver import classify  # solver imports this module
    for k, (grid, condition) in enumerate(zip(grids, conditions)):
        solved = classify(grid)
        if solved is None:  # one answer by brute force, but none of the task's conditions' rules reach it
            raise PuzzleFileError(path, lines[k], f"puzzle {k + 1} of the file, {''.join(map(str, grid))!r}: the "
                                                  f"rules of the task's conditions do not solve it (it needs "
                                                  f"guessing), so it has no condition of theirs")
        if solved[1] != condition:
            raise PuzzleFileError(path, lines[k], f"puzzle {k + 1} of the file, {''.join(map(str, grid))!r}: its "
                                                  f"condition {_FILE_CONDITION_NAMES[condition]} contradicts it: the "
                                                  f"rules solve it as {_FILE_CONDITION_NAMES[solved[1]]}")


def first_repeat(grids: np.ndarray) -> tuple[int, int] | None:
    """(k, j): puzzle k is puzzle j (j < k) again, the first such k; None where every grid differs."""
    seen: dict[bytes, int] = {}
    for k, grid in enumerate(np.ascontiguousarray(grids)):
        j = seen.setdefault(grid.tobytes(), k)
        if j != k:
            return k, j
    return None


def read_puzzles(path: str | os.PathLike) -> Puzzles:
    """Read one puzzle CSV file; raises PuzzleFileError on the first problem found (each row's form first, then
    whether the rows are puzzles with their solutions)."""
    path = Path(path)
    if path.is_dir():
        raise PuzzleFileError(path, 0, "a folder, not a puzzle CSV file")
    if not path.is_file():  # a pipe would never end, a link to /dev/zero never stop growing
        raise PuzzleFileError(path, 0, "not a regular file (a pipe, device or socket)" if path.exists()
                              else "no such file")
    try:
        # utf-8-sig: tolerate the byte-order mark some spreadsheet programs write.
        with open(path, newline="", encoding="utf-8-sig") as fh:
            # The csv module keeps every field a string, so grids keep their leading zeros.
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                raise PuzzleFileError(path, 1, "file is empty (expected the header " + ",".join(CSV_HEADER) + ")")
            header = [name.strip() for name in header]
            missing = [name for name in _REQUIRED_COLUMNS if name not in header]
            if missing:
                # the header unquoted: the file a folder's config.json names may be anyone's (a secret's first line)
                raise PuzzleFileError(path, 1, f"missing column(s) {', '.join(missing)} in its header line of "
                                               f"{len(header)} fields (expected the header {','.join(CSV_HEADER)})")
            repeated = next((name for name in _REQUIRED_COLUMNS if header.count(name) > 1), None)
            if repeated is not None:  # the first would be read and the second, which may say otherwise, ignored
                raise PuzzleFileError(path, 1, f"its header names column {repeated} twice: give each column once")
            column = {name: header.index(name) for name in _REQUIRED_COLUMNS}
            conditions_by_name = {name.lower(): k for k, name in enumerate(CONDITIONS)}

            grids, lines, answers, conditions = [], [], [], []
            for row in reader:
                line = reader.line_num
                if not row or all(not field.strip() for field in row):
                    continue  # blank line, e.g. at the end of the file
                if len(row) != len(header):
                    raise PuzzleFileError(path, line, f"expected {len(header)} fields, found {len(row)}")
                grid, problem = _check_puzzle_field(row[column["puzzles"]].strip())
                if problem:
                    raise PuzzleFileError(path, line, problem)
                solution = row[column["solutions"]].strip()
                if solution not in ("1", "2", "3", "4"):
                    raise PuzzleFileError(path, line, f"solution must be 1-4, got {solution!r}")
                condition = row[column["condition"]].strip()
                if condition.lower() not in conditions_by_name:
                    raise PuzzleFileError(
                        path, line,
                        f"unknown condition {condition!r} (expected one of {', '.join(_FILE_CONDITION_NAMES)})"
                    )
                grids.append(grid)
                lines.append(line)
                answers.append(int(solution))
                conditions.append(conditions_by_name[condition.lower()])
    except PuzzleFileError:
        raise
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise PuzzleFileError(path, 0, f"cannot read file: {exc}") from exc
    if not grids:
        raise PuzzleFileError(path, 2, "no puzzles after the header")
    if (repeat := first_repeat(np.array(grids))) is not None:  # it would land in both the training and test split
        raise PuzzleFileError(path, lines[repeat[0]], f"repeats the puzzle of line {lines[repeat[1]]}: give each "
                                                      f"puzzle once")
    _check_solutions(path, lines, np.array(grids), np.array(answers))
    _check_conditions(path, lines, np.array(grids), np.array(conditions))
    return Puzzles(np.array(grids), np.array(answers), np.array(conditions), str(path))


def read_puzzle_folder(path: str | os.PathLike) -> Puzzles:
    """Read every ``*.csv`` in a folder (sorted by name) into one set, or a single file."""
    path = Path(path)
    if path.is_file():
        return read_puzzles(path)
    if not path.is_dir():
        raise PuzzleFileError(path, 0, "not a regular file or folder (a pipe, device or socket)" if path.exists()
                              else "no such file or folder")
    files = sorted(f for f in path.glob("*.csv") if not f.name.startswith("."))  # a hidden copy is not a part
    if not files:
        raise PuzzleFileError(path, 0, "folder has no *.csv puzzle files: give a puzzle CSV file or a folder of them")
    parts = [read_puzzles(f) for f in files]
    puzzles = Puzzles.concat(parts, source=str(path))
    if (repeat := first_repeat(puzzles.grids)) is not None:  # each file's own repeats are refused as it is read
        starts = np.cumsum([0] + [len(part) for part in parts])
        file_of = lambda k: int(np.searchsorted(starts, k, side="right")) - 1  # noqa: E731
        k, j = repeat
        raise PuzzleFileError(files[file_of(k)], 0, f"its puzzle {k - starts[file_of(k)] + 1} repeats puzzle "
                                                    f"{j - starts[file_of(j)] + 1} of {files[file_of(j)].name}: give "
                                                    f"each puzzle once")
    return puzzles


def write_puzzles(puzzles: Puzzles, path: str | os.PathLike) -> None:
    """Write puzzles in the authors' CSV format (readable by read_puzzles)."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(CSV_HEADER)
        for k in range(len(puzzles)):
            writer.writerow(
                [
                    k,
                    "",
                    _FILE_CONDITION_NAMES[int(puzzles.conditions[k])],
                    "".join(str(int(v)) for v in puzzles.grids[k]),
                    int(puzzles.answers[k]),
                ]
            )


def grid_array(grids) -> np.ndarray:
    if isinstance(grids, Puzzles):
        grids = grids.grids
    g = np.asarray(grids).astype(np.int64).reshape(-1, NUM_CELLS)
    if g.size and (g.min() < 0 or g.max() > QUERY):
        raise ValueError("grid values must be in 0..5")
    return g


def encode(grids) -> torch.Tensor:
    """One-hot tokens [P,16,5] float32: channels 0-3 = shapes 1-4, channel 4 = query, blank = zeros."""
    g = torch.as_tensor(grid_array(grids))
    return torch.nn.functional.one_hot(g, NUM_SYMBOLS + 1)[..., 1:].to(torch.float32)



def stratified_split(puzzles: Puzzles, test_fraction: float = 0.1, seed: int = 42) -> tuple[Puzzles, Puzzles]:
    """Split into (train, test) with ``round(test_fraction * count)`` test puzzles of each condition,
    drawn at random (deterministic for a seed); both keep the original order."""
    if not 0.0 <= test_fraction <= 1.0:
        raise ValueError(f"test_fraction must be in [0, 1], got {test_fraction}")
    rng = np.random.default_rng(seed)
    is_test = np.zeros(len(puzzles), dtype=bool)
    for c in np.unique(puzzles.conditions):
        members = np.flatnonzero(puzzles.conditions == c)
        n_test = int(round(test_fraction * len(members)))
        is_test[rng.permutation(members)[:n_test]] = True
    train, test = puzzles.subset(np.flatnonzero(~is_test)), puzzles.subset(np.flatnonzero(is_test))
    train.source, test.source = f"{puzzles.source}[train]", f"{puzzles.source}[test]"
    return train, test


# Their 9,000 puzzles and their training logs (data/lst_authors/SOURCE.md says where from and what each file is).
AUTHORS_DATA = Path(__file__).resolve().parents[2] / "data" / "lst_authors"
# In name order, as a folder of them reads: the pool's order, and so which puzzle each training batch indexes.
AUTHORS_PUZZLE_FILES = tuple(f"generated_puzzle_data_{name}_dist80.csv" for name in sorted(CONDITIONS))
AUTHORS_LOGS_FILE = "training_logs.parquet"


def authors_file(name: str) -> Path:
    """One file of the authors' data that ships with pe_fast; FileNotFoundError where this install lacks it."""
    path = AUTHORS_DATA / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: it ships with pe_fast (package data); reinstall pe_fast")
    return path


def authors_puzzles() -> Puzzles:
    """The authors' 9,000 puzzles, 3,000 per condition: the LST task's default training pool."""
    return Puzzles.concat([read_puzzles(authors_file(name)) for name in AUTHORS_PUZZLE_FILES], source=str(AUTHORS_DATA))
