"""Which shape a puzzle's query must hold, and how hard that is to see: the rule-based solver (classify) that
labels each puzzle's condition, and brute force over the 576 Latin squares (brute_force_answers; query_shapes for
many grids at once)."""
from __future__ import annotations

import functools
import itertools
from typing import Sequence

import numpy as np

from pe_fast.tasks.lst_puzzles.puzzles import NUM_CELLS, NUM_SHAPES, QUERY

# Shapes as bits of a 4-bit mask, so a row's or column's shapes are one integer.
_BIT = (0, 1, 2, 4, 8)
_FULL = 0b1111
_SHAPE_OF_BIT = {1: 1, 2: 2, 4: 3, 8: 4}
_POPCOUNT = tuple(bin(m).count("1") for m in range(16))
_ROWS = tuple(tuple(r * 4 + c for c in range(4)) for r in range(4))
_COLS = tuple(tuple(r * 4 + c for r in range(4)) for c in range(4))

_LATIN_SQUARES: np.ndarray | None = None


def latin_squares() -> np.ndarray:
    """All 576 4x4 Latin squares over shapes 1..4, [576,16] int8 row-major (computed once)."""
    global _LATIN_SQUARES
    if _LATIN_SQUARES is None:
        rows = list(itertools.permutations(range(1, 5)))
        squares = []

        def extend(chosen):
            if len(chosen) == 4:
                squares.append([v for row in chosen for v in row])
                return
            for row in rows:
                if all(row[c] != prev[c] for prev in chosen for c in range(4)):
                    extend(chosen + [row])

        extend([])
        _LATIN_SQUARES = np.array(squares, dtype=np.int8)
    return _LATIN_SQUARES


def _as_grid(grid) -> np.ndarray:
    """One grid as a [16] int array (accepts a 16-digit string, a sequence, or a 4x4 array)."""
    if isinstance(grid, str):
        grid = [int(ch) for ch in grid]
    g = np.asarray(grid).reshape(-1).astype(np.int64)
    if g.shape != (NUM_CELLS,) or g.min() < 0 or g.max() > QUERY or (g == QUERY).sum() != 1:
        raise ValueError(f"a grid is {NUM_CELLS} values in 0..5 with exactly one query (5), got {grid!r}")
    return g


def brute_force_answers(grid) -> set[int]:
    """The query values of every Latin square that agrees with the grid's shown shapes.

    One element means the answer is unique; none means the grid cannot be completed.
    """
    return {shape for shape, fits in enumerate(query_shapes(_as_grid(grid)[None])[0], 1) if fits}


def query_shapes(grids: np.ndarray) -> np.ndarray:
    """brute_force_answers of many checked grids [P,16] at once, as [P,4] bool: whether some Latin square that
    agrees with grid p's shown shapes holds shape s + 1 at its query."""
    squares = _squares_showing()
    cells = np.arange(NUM_CELLS)
    fits = np.bitwise_and.reduce(squares[cells, grids], axis=1)  # [P, words]: the squares agreeing with each grid
    query = np.argmax(grids == QUERY, axis=1)
    return np.stack([(fits & squares[query, shape]).any(axis=1) for shape in range(1, NUM_SHAPES + 1)], axis=1)


@functools.cache
def _squares_showing() -> np.ndarray:
    """[16, 6, words] uint8: bit q of [c, v] set where Latin square q shows shape v at cell c; a blank (0) or the
    query (5) agrees with every square. Bit sets, so that a grid's agreeing squares are one AND per cell."""
    squares = latin_squares()
    table = np.empty((NUM_CELLS, QUERY + 1, (len(squares) + 7) // 8), dtype=np.uint8)
    for cell in range(NUM_CELLS):
        for value in range(QUERY + 1):
            agrees = (squares[:, cell] == value) if 1 <= value <= NUM_SHAPES else np.ones(len(squares), bool)
            table[cell, value] = np.packbits(agrees)
    return table


def _unit_masks(values: Sequence[int]) -> tuple[list[int], list[int]]:
    row_used, col_used = [0] * 4, [0] * 4
    for cell, v in enumerate(values):
        if v:
            row_used[cell >> 2] |= _BIT[v]
            col_used[cell & 3] |= _BIT[v]
    return row_used, col_used


def propagate(values: list[int], target: int) -> bool:
    """Fill forced blank cells of ``values`` (in place, blanks are 0) until ``target`` is filled.

    Rules, each sound for any grid that can be completed to a Latin square:
    naked single (row and column leave one shape) and hidden single (a shape missing from a row or
    column fits only one of its blank cells). Returns False when the rules get stuck or meet a
    contradiction.
    """
    while True:
        row_used, col_used = _unit_masks(values)
        candidates = [0] * NUM_CELLS
        naked = []
        for cell in range(NUM_CELLS):
            if values[cell] == 0:
                mask = _FULL & ~(row_used[cell >> 2] | col_used[cell & 3])
                if mask == 0:
                    return False
                candidates[cell] = mask
                if _POPCOUNT[mask] == 1:
                    naked.append(cell)
        if naked:
            # Naked singles first: cheap, and they usually unlock the rest.
            for cell in naked:
                values[cell] = _SHAPE_OF_BIT[candidates[cell]]
            if values[target]:
                return True
            continue

        progress = False
        for units, used in ((_ROWS, row_used), (_COLS, col_used)):
            for unit, unit_used in zip(units, used):
                for shape in range(1, NUM_SHAPES + 1):
                    bit = _BIT[shape]
                    if unit_used & bit:
                        continue
                    places = [cell for cell in unit if candidates[cell] & bit]
                    if not places:
                        return False
                    if len(places) == 1 and values[places[0]] == 0:
                        values[places[0]] = shape
                        progress = True
        if values[target]:
            return True
        if not progress:
            return False


def repeated_shape(values: Sequence[int]) -> str | None:
    """Where the grid (blanks 0) shows a shape twice, as "shape 2 twice in row 1" (rows and columns from 1), or
    None."""
    for kind, units in (("row", _ROWS), ("column", _COLS)):
        for number, unit in enumerate(units, 1):
            shown = [values[cell] for cell in unit if values[cell]]
            twice = next((shape for shape in shown if shown.count(shape) > 1), None)
            if twice is not None:
                return f"shape {twice} twice in {kind} {number}"
    return None


def solve(values: list[int], query: int) -> tuple[int, int] | None:
    """(answer, condition) for the blank cell ``query`` of ``values`` (blanks 0), or None."""
    row_used, col_used = _unit_masks(values)
    row, col = row_used[query >> 2], col_used[query & 3]
    if _POPCOUNT[row] == 3:
        return _SHAPE_OF_BIT[_FULL & ~row], 0
    if _POPCOUNT[col] == 3:
        return _SHAPE_OF_BIT[_FULL & ~col], 0
    both = row | col
    if _POPCOUNT[both] == 3:
        return _SHAPE_OF_BIT[_FULL & ~both], 1
    if both == _FULL:
        return None  # no shape left for the query: the grid cannot be completed
    work = list(values)
    if propagate(work, query):
        return work[query], 2
    return None


def classify(grid) -> tuple[int, int] | None:
    """Rule-based (answer 1..4, condition 0..2) of a puzzle, or None if the rules cannot solve it.

    The condition is the hardest step the query needs: 0 binary (its row or its column alone),
    1 ternary (row and column together), 2 quaternary (other blank cells must be deduced first,
    by naked and hidden singles). A grid showing a shape twice in a row or column gives None; other
    grids are assumed to be completable, as every real puzzle is.
    """
    g = _as_grid(grid)
    query = int(np.flatnonzero(g == QUERY)[0])
    values = [0 if v == QUERY else int(v) for v in g]
    if repeated_shape(values) is not None:
        return None
    return solve(values, query)

