"""Tests of pe_fast.tasks.lst against independent references (brute force, plain Python sets, loops)."""

import itertools
from fractions import Fraction

import numpy as np
import pytest
import torch

from pe_fast.tasks import lst, lst_puzzles
from pe_fast.tasks.lst_puzzles import solver


def _shown(grid):
    """The (cell, shape) pairs of a grid's shown shapes."""
    return {(cell, int(v)) for cell, v in enumerate(grid) if 1 <= v <= 4}


def _is_latin_square(square):
    rows = [list(square[r * 4 : r * 4 + 4]) for r in range(4)]
    cols = [[rows[r][c] for r in range(4)] for c in range(4)]
    return all(sorted(line) == [1, 2, 3, 4] for line in rows + cols)


def _reference_direct_condition(grid):
    """Binary / ternary by the definitions with Python sets; None means neither (quaternary or harder)."""
    query = list(grid).index(5)
    r, c = divmod(query, 4)
    row = {int(grid[r * 4 + k]) for k in range(4)} - {0, 5}
    col = {int(grid[k * 4 + c]) for k in range(4)} - {0, 5}
    if len(row) == 3 or len(col) == 3:
        return 0
    if len(row | col) == 3:
        return 1
    return None


# ----------------------------------------------------------------------------- solvers


def test_latin_squares_are_all_576_distinct_squares():
    squares = lst_puzzles.latin_squares()
    assert squares.shape == (576, 16)
    assert len({tuple(s) for s in squares}) == 576
    assert all(_is_latin_square(s) for s in squares)
    # The cache hands back the same array.
    assert lst_puzzles.latin_squares() is squares


def test_brute_force_answers_small_cases():
    # Only the query shown: any shape fits.
    assert lst_puzzles.brute_force_answers("5" + "0" * 15) == {1, 2, 3, 4}
    # A full row minus the query.
    assert lst_puzzles.brute_force_answers("1235" + "0" * 12) == {4}
    # Contradictory givens: no square fits.
    assert lst_puzzles.brute_force_answers("1105" + "0" * 12) == set()
    # Row 1 shows 1 and 2, the query's column nothing: the query holds 3 and row 1's last cell 4, or the reverse.
    assert lst_puzzles.brute_force_answers("1250" + "0" * 12) == {3, 4}
    # The same with a 3 below the query: its row and column leave only 4.
    assert lst_puzzles.brute_force_answers("1250" + "0030" + "0" * 8) == {4}


def test_brute_force_answers_match_a_loop_over_every_latin_square():
    """brute_force_answers and query_shapes (its many grids at once, bit sets) against the squares enumerated here
    from rows, and a loop over their cells."""
    rows = list(itertools.permutations(range(1, 5)))
    every = [sum(rows4, ()) for rows4 in itertools.product(rows, repeat=4) if _is_latin_square(sum(rows4, ()))]
    rng = np.random.default_rng(5)
    squares = lst_puzzles.latin_squares()
    grids = []
    for k in range(300):  # parts of Latin squares, and arbitrary digits (mostly no square fits)
        grid = squares[rng.integers(len(squares))] * (rng.random(16) < 0.5) if k % 2 else (
            rng.integers(0, 5, size=16) * (rng.random(16) < 0.3))
        grid[rng.integers(16)] = 5
        grids.append(grid.astype(np.int64))
    expected = [{square[list(grid).index(5)] for square in every
                 if all(v in (0, 5) or square[cell] == v for cell, v in enumerate(grid))} for grid in grids]
    assert [lst_puzzles.brute_force_answers(grid) for grid in grids] == expected
    many = solver.query_shapes(np.array(grids))
    assert [{shape + 1 for shape in np.flatnonzero(row)} for row in many] == expected
    assert sum(not e for e in expected) > 50 and sum(len(e) == 1 for e in expected) > 20


def test_classify_hidden_single_example():
    # Row 4 is _ _ ? 4. Shape 3 must sit somewhere in row 4, but columns 1 and 2 already hold a 3,
    # so it can only be the query: quaternary (neither the row nor the column alone pins it down).
    grid = "0003" "3000" "0300" "0054"
    assert lst_puzzles.brute_force_answers(grid) == {3}
    assert lst_puzzles.classify(grid) == (3, 2)


def test_classify_matches_brute_force_on_random_partial_grids():
    rng = np.random.default_rng(123)
    squares = lst_puzzles.latin_squares()
    solved = {0: 0, 1: 0, 2: 0}
    ambiguous = 0
    for _ in range(1500):
        square = squares[rng.integers(len(squares))]
        grid = square.copy()
        n_shown = int(rng.integers(0, 16))
        cells = rng.permutation(16)
        grid[cells[n_shown:]] = 0
        grid[cells[n_shown:][0]] = 5
        possible = lst_puzzles.brute_force_answers(grid)
        result = lst_puzzles.classify(grid)
        if len(possible) > 1:
            ambiguous += 1
            assert result is None, grid
        if result is not None:
            answer, condition = result
            assert possible == {answer}, grid
            direct = _reference_direct_condition(grid)
            assert condition == (2 if direct is None else direct), grid
            solved[condition] += 1
    # The sample exercises every condition and ambiguous grids.
    assert min(solved.values()) > 20 and ambiguous > 100


def test_classify_on_arbitrary_digit_grids_is_sound_when_completable():
    rng = np.random.default_rng(7)
    for _ in range(800):
        grid = rng.integers(0, 5, size=16) * (rng.random(16) < 0.5)
        grid[rng.integers(16)] = 5
        possible = lst_puzzles.brute_force_answers(grid)
        result = lst_puzzles.classify(grid)
        if result is not None and possible:
            assert possible == {result[0]}, grid
        if len(possible) > 1:
            assert result is None, grid


def test_classify_rejects_bad_grids_and_repeats():
    assert lst_puzzles.classify("1150" + "0" * 12) is None  # shape 1 twice in a row
    with pytest.raises(ValueError):
        lst_puzzles.classify("0" * 16)  # no query
    with pytest.raises(ValueError):
        lst_puzzles.classify("55" + "0" * 14)


# ----------------------------------------------------------------------------- generator


def test_generator_is_deterministic_valid_and_balanced():
    a = lst_puzzles.generate_puzzles(300, seed=5)
    b = lst_puzzles.generate_puzzles(300, seed=5)
    c = lst_puzzles.generate_puzzles(300, seed=6)
    np.testing.assert_array_equal(a.grids, b.grids)
    np.testing.assert_array_equal(a.answers, b.answers)
    np.testing.assert_array_equal(a.conditions, b.conditions)
    assert not np.array_equal(a.grids, c.grids)

    assert a.grids.dtype == np.int8 and a.answers.dtype == np.int64 and a.conditions.dtype == np.int64
    assert np.bincount(a.conditions, minlength=3).tolist() == [100, 100, 100]
    assert len({g.tobytes() for g in a.grids}) == len(a)
    squares = lst_puzzles.latin_squares()
    for grid, answer, condition in zip(a.grids, a.answers, a.conditions):
        assert (grid == 5).sum() == 1
        shown = (grid >= 1) & (grid <= 4)
        assert 3 <= shown.sum() <= 11
        # Consistent with a Latin square and a unique answer, by brute force.
        assert (squares[:, shown] == grid[shown]).all(axis=1).any()
        assert lst_puzzles.brute_force_answers(grid) == {int(answer)}
        direct = _reference_direct_condition(grid)
        assert condition == (2 if direct is None else direct)


def test_generator_split_and_condition_subsets():
    p = lst_puzzles.generate_puzzles(10, seed=1)
    assert np.bincount(p.conditions, minlength=3).tolist() == [4, 3, 3]
    q = lst_puzzles.generate_puzzles(12, seed=1, conditions=("quaternary",))
    assert (q.conditions == 2).all() and len(q) == 12
    assert len(lst_puzzles.generate_puzzles(0, seed=1)) == 0


# ----------------------------------------------------------------------------- files


def test_write_read_round_trip(tmp_path):
    p = lst_puzzles.generate_puzzles(60, seed=3)
    path = tmp_path / "set.csv"
    lst_puzzles.write_puzzles(p, path)
    text = path.read_text().splitlines()
    assert text[0] == "ID,LST_num,condition,puzzles,solutions"
    q = lst_puzzles.read_puzzles(path)
    np.testing.assert_array_equal(p.grids, q.grids)
    np.testing.assert_array_equal(p.answers, q.answers)
    np.testing.assert_array_equal(p.conditions, q.conditions)
    assert q.source == str(path)


def test_leading_zeros_survive_and_folder_reads_sorted(tmp_path):
    folder = tmp_path / "set"
    folder.mkdir()
    (folder / "b.csv").write_text("ID,LST_num,condition,puzzles,solutions\n0,,Ternary,0300340102454032,3\n")
    # ternary: with the first cell blank, neither its row nor its column alone gives the answer
    (folder / "a.csv").write_text("ID,LST_num,condition,puzzles,solutions\n0,,Ternary,0000500234001000,4\n")
    (folder / "notes.txt").write_text("not a puzzle file")
    p = lst_puzzles.read_puzzle_folder(folder)
    assert ["".join(map(str, g)) for g in p.grids] == ["0000500234001000", "0300340102454032"]
    assert p.answers.tolist() == [4, 3] and p.conditions.tolist() == [1, 1]
    # A single file works too, and subset/concat keep rows aligned.
    single = lst_puzzles.read_puzzle_folder(folder / "a.csv")
    both = lst_puzzles.Puzzles.concat([single, p.subset([1])])
    np.testing.assert_array_equal(both.grids, p.grids)


HEADER = "ID,LST_num,condition,puzzles,solutions\n"
GOOD = "0,,Binary,2000500234001000,4\n"


@pytest.mark.parametrize(
    "content, line, words",
    [
        ("", 1, "empty"),
        ("ID,condition,puzzles\n" + GOOD, 1, "solutions"),
        (HEADER, 2, "no puzzles"),
        (HEADER + GOOD + "1,,Binary,200050023400100,4\n", 3, "16 digits"),
        (HEADER + GOOD + GOOD + "2,,Binary,20005002340010a0,4\n", 4, "16 digits"),
        (HEADER + "0,,Binary,2000500234001070,4\n", 2, "outside 0-5"),
        (HEADER + GOOD + "1,,Binary,2000000234001000,4\n", 3, "found 0"),
        (HEADER + "0,,Binary,2000500234005000,4\n", 2, "found 2"),
        (HEADER + GOOD + "1,,Binary,2000500234001000,0\n", 3, "solution"),
        (HEADER + "0,,Binary,2000500234001000,x\n", 2, "solution"),
        (HEADER + GOOD + "\n" + "1,,Hard,2000500234001000,4\n", 4, "unknown condition"),
        (HEADER + "0,,Binary,2000500234001000\n", 2, "fields"),
        # shape 1 twice in the first row
        (HEADER + GOOD + "1,,Binary,1100500000000000,2\n", 3, "no Latin square completes it (shape 1 twice in row 1)"),
        # no repeat, but the first row's last two cells need 3 and 4, and both columns already hold a 3
        (HEADER + "0,,Binary,1200003000035000,4\n", 2, "no Latin square completes it (its blanks"),
        # the query's column shows 2, 3 and 1
        (HEADER + "0,,Binary,2000500234001000,3\n", 2, "solution 3 contradicts it: its query must hold 4"),
        # row 1 shows 1 and 2, nothing else constrains the query: 3 and 4 both complete it
        (HEADER + GOOD + "1,,Binary,1250000000000000,3\n", 3,
         "puzzle 2 of the file, '1250000000000000': ambiguous: its query may hold 3 or 4"),
    ],
)
def test_malformed_files_raise_with_line_number(tmp_path, content, line, words):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(lst_puzzles.PuzzleFileError) as info:
        lst_puzzles.read_puzzles(path)
    assert str(info.value).startswith(f"{path}:{line}: ")
    assert words in str(info.value)
    assert info.value.line == line


def test_a_puzzle_whose_other_blanks_complete_several_ways_is_read(tmp_path):
    """One answer at the query is what a puzzle needs: row 1 shown in full leaves the other 12 cells 24 ways to
    complete (576 squares / 24 first rows), and the query's answer one."""
    path = tmp_path / "open.csv"
    path.write_text(HEADER + "0,,Binary,1235000000000000,4\n")
    shown = np.array([1, 2, 3])
    squares = lst_puzzles.latin_squares()
    assert ((squares[:, :3] == shown).all(axis=1)).sum() == 24
    assert lst_puzzles.read_puzzles(path).answers.tolist() == [4]


def test_missing_file_and_empty_folder(tmp_path):
    with pytest.raises(lst_puzzles.PuzzleFileError, match=r":0: no such file"):
        lst_puzzles.read_puzzles(tmp_path / "absent.csv")
    with pytest.raises(lst_puzzles.PuzzleFileError, match=r":0: .*no \*\.csv"):
        lst_puzzles.read_puzzle_folder(tmp_path)
    with pytest.raises(lst_puzzles.PuzzleFileError, match=r":0: no such"):
        lst_puzzles.read_puzzle_folder(tmp_path / "absent")


# ----------------------------------------------------------------------------- encodings and distances


def test_encode_one_hot():
    grids = lst_puzzles.generate_puzzles(30, seed=2).grids
    x = lst_puzzles.encode(grids)
    assert x.shape == (30, 16, 5) and x.dtype == torch.float32
    for p, grid in enumerate(grids):
        for cell, v in enumerate(grid):
            expected = [0.0] * 5
            if v:
                expected[v - 1] = 1.0
            assert x[p, cell].tolist() == expected


def _reference_jaccard(a, b):
    sa = {(cell, int(v)) for cell, v in enumerate(a) if v}
    sb = {(cell, int(v)) for cell, v in enumerate(b) if v}
    union = sa | sb
    return 0.0 if not union else float(1 - Fraction(len(sa & sb), len(union)))


def test_jaccard_matches_python_sets():
    rng = np.random.default_rng(0)
    a = lst_puzzles.generate_puzzles(40, seed=8).grids
    b = np.concatenate([lst_puzzles.generate_puzzles(30, seed=9).grids, rng.integers(0, 6, size=(5, 16)),
                        np.zeros((1, 16))])
    d = lst_puzzles.jaccard_distance_matrix(a, b)
    assert d.shape == (40, 36)
    expected = np.array([[_reference_jaccard(x, y) for y in b] for x in a])
    np.testing.assert_allclose(d, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lst_puzzles.nearest_jaccard_distance(a, b), expected.min(axis=1), rtol=0, atol=1e-12)
    assert lst_puzzles.jaccard_distance_matrix(np.zeros((1, 16)), np.zeros((1, 16)))[0, 0] == 0.0
    # Exact fractions compare equal to their decimal literal (here 4/5 vs 0.8).
    one = np.array([[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]])
    other = np.array([[1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
    assert lst_puzzles.jaccard_distance_matrix(one, other)[0, 0] == 0.8
    assert lst_puzzles.nearest_jaccard_distance(one, other)[0] >= 0.8


def test_generalisation_set_is_far_balanced_and_new():
    train = lst_puzzles.generate_puzzles(300, seed=11)
    ood = lst_puzzles.generalisation_set(train, n_per_condition=8, min_distance=0.7, seed=4, batch_per_condition=300)
    assert np.bincount(ood.conditions, minlength=3).tolist() == [8, 8, 8]
    train_keys = {g.tobytes() for g in train.grids}
    assert not any(g.tobytes() in train_keys for g in ood.grids)
    assert len({g.tobytes() for g in ood.grids}) == len(ood)
    for grid, answer in zip(ood.grids, ood.answers):
        assert min(_reference_jaccard(grid, t) for t in train.grids) >= 0.7
        assert lst_puzzles.brute_force_answers(grid) == {int(answer)}
    again = lst_puzzles.generalisation_set(train, n_per_condition=8, min_distance=0.7, seed=4, batch_per_condition=300)
    np.testing.assert_array_equal(ood.grids, again.grids)


def test_generalisation_set_raises_when_threshold_unreachable():
    # A training grid with the query in every cell: every candidate shares its query pair with one.
    grids = np.zeros((16, 16), dtype=np.int8)
    grids[np.arange(16), np.arange(16)] = 5
    train = lst_puzzles.Puzzles(grids, np.ones(16), np.zeros(16), "queries only")
    with pytest.raises(ValueError, match="farthest candidate"):
        lst_puzzles.generalisation_set(train, n_per_condition=2, min_distance=1.0, seed=0, batch_per_condition=50,
                                       max_candidates=100)


# ----------------------------------------------------------------------------- probes, coordinates, split


def test_probes_and_coordinates():
    coords = lst.grid_coordinates()
    assert coords.shape == (16, 2)
    assert [tuple(rc) for rc in coords] == [divmod(i, 4) for i in range(16)]
    t = lst.probes()
    assert t.shape == (3, 16, 16) and t.dtype == torch.float32
    assert lst.PROBE_NAMES == ("same_row", "same_col", "same_row_or_col")
    for i, j in itertools.product(range(16), range(16)):
        ri, ci = divmod(i, 4)
        rj, cj = divmod(j, 4)
        row, col = ri == rj and i != j, ci == cj and i != j
        assert t[:, i, j].tolist() == [float(row), float(col), float(row or col)]


def test_stratified_split():
    p = lst_puzzles.generate_puzzles(301, seed=12)
    counts = np.bincount(p.conditions, minlength=3)
    train, test = lst_puzzles.stratified_split(p, test_fraction=0.1, seed=42)
    assert np.bincount(test.conditions, minlength=3).tolist() == [round(0.1 * n) for n in counts]
    assert len(train) + len(test) == len(p)
    keys = [g.tobytes() for g in p.grids]
    assert sorted(keys) == sorted([g.tobytes() for g in train.grids] + [g.tobytes() for g in test.grids])
    again_train, _ = lst_puzzles.stratified_split(p, test_fraction=0.1, seed=42)
    np.testing.assert_array_equal(train.grids, again_train.grids)
    other_train, _ = lst_puzzles.stratified_split(p, test_fraction=0.1, seed=1)
    assert not np.array_equal(train.grids, other_train.grids)


# ----------------------------------------------------------------------------- data location and task


def test_task_from_files(tmp_path):
    lst_puzzles.write_puzzles(lst_puzzles.generate_puzzles(300, seed=21), tmp_path / "train.csv")
    ood = lst_puzzles.generalisation_set(lst_puzzles.read_puzzles(tmp_path / "train.csv"), 4, 0.6, seed=2,
                                         batch_per_condition=100)
    lst_puzzles.write_puzzles(ood, tmp_path / "ood.csv")
    task = lst.LSTTask(train_path=tmp_path / "train.csv", ood_path=tmp_path / "ood.csv")
    assert (task.name, task.num_tokens, task.token_dim, task.num_classes, task.readout_token) == ("lst", 16, 5, 4, 15)
    assert set(task.splits) == {"train", "test", "ood"}
    assert [len(task.splits[k]) for k in ("train", "test", "ood")] == [270, 30, 12]
    for split in task.splits.values():
        assert split.x.shape[1:] == (16, 5) and split.x.dtype == torch.float32
        assert split.y.dtype == torch.int64 and int(split.y.min()) >= 0 and int(split.y.max()) <= 3
        assert split.condition.dtype == torch.int64
    # Targets are the query's shape minus one, read off the one-hot grid by brute force.
    x, y = task.splits["ood"].x, task.splits["ood"].y
    for k in range(len(y)):
        grid = [int(np.argmax(t)) + 1 if t.any() else 0 for t in x[k].numpy()]
        assert lst_puzzles.brute_force_answers(grid) == {int(y[k]) + 1}
    assert task.probes.shape == (3, 16, 16) and task.coordinates.shape == (16, 2)
    assert task.condition_names == lst_puzzles.CONDITIONS and task.probe_names == lst.PROBE_NAMES
    assert task.description["sizes"] == {"train": 270, "test": 30, "ood": 12}
    assert task.description["ood_min_distance_achieved"] >= 0.6


def test_task_without_its_package_data_says_so(tmp_path, monkeypatch):
    """The authors' puzzles ship with pe_fast: an install that lost them fails, naming the file, rather than
    training on something else."""
    monkeypatch.setattr(lst_puzzles.puzzles, "AUTHORS_DATA", tmp_path)  # where authors_file reads it
    with pytest.raises(FileNotFoundError, match="generated_puzzle_data_binary_dist80.csv is missing.*reinstall"):
        lst.LSTTask()


# ----------------------------------------------------------------------------- the authors' puzzles


def test_classifier_reproduces_authors_labels():
    puzzles = lst_puzzles.authors_puzzles()
    assert len(puzzles) == 9000
    agree = 0
    for grid, answer, condition in zip(puzzles.grids, puzzles.answers, puzzles.conditions):
        assert lst_puzzles.brute_force_answers(grid) == {int(answer)}
        agree += lst_puzzles.classify(grid) == (int(answer), int(condition))
    # Measured: all 9,000 agree.
    assert agree / len(puzzles) >= 0.99


def test_generalisation_set_against_authors_puzzles():
    puzzles = lst_puzzles.authors_puzzles()
    ood = lst_puzzles.generalisation_set(puzzles, n_per_condition=10, seed=1, batch_per_condition=500)
    assert np.bincount(ood.conditions, minlength=3).tolist() == [10, 10, 10]
    d = lst_puzzles.jaccard_distance_matrix(ood.grids, puzzles.grids)
    assert d.min() >= lst_puzzles.DEFAULT_OOD_MIN_DISTANCE


def test_the_shipped_default_generalisation_set_is_what_the_generator_draws():
    """The LST task reads its default generalisation set from a file instead of drawing it (5 s of one core
    each sweep): drawn here again against the authors' puzzles, it must be that file, puzzle by puzzle."""
    per_condition, min_distance, seed = lst_puzzles.DEFAULT_GENERALISATION
    drawn = lst_puzzles.generalisation_set(lst_puzzles.authors_puzzles(), per_condition, min_distance, seed)
    shipped = lst_puzzles.default_generalisation_set()
    assert len(shipped) == 3 * per_condition, (
        "regenerate with: python -c 'from pe_fast.tasks.lst_puzzles.generator import "
        "write_default_generalisation_set as w; w()'")
    np.testing.assert_array_equal(shipped.grids, drawn.grids)
    np.testing.assert_array_equal(shipped.answers, drawn.answers)
    np.testing.assert_array_equal(shipped.conditions, drawn.conditions)
    assert shipped.source == drawn.source
    task = lst.LSTTask()
    np.testing.assert_array_equal(task.puzzles["ood"].grids, drawn.grids)
    assert task.description["ood_source"] == drawn.source
    # any other setting draws its own
    other = lst.LSTTask(ood_per_condition=5)
    assert len(other.puzzles["ood"]) == 15 and other.description["ood_source"] == drawn.source
