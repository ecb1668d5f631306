"""The Latin Square Task's puzzles: files, solver, generator, Jaccard distances, generalisation set, splits.

The task of "Learning interpretable positional encodings in transformers depends on initialization"
(arXiv 2406.08272). A 4x4 grid in which every row and every column holds each of four shapes once;
some cells show their shape, some are blank and one blank cell is the query. The model predicts the
query's shape.

A grid is 16 integers in row-major order: 0 = blank, 1-4 = shape, 5 = query. Puzzle files are CSV
with the header ``ID,LST_num,condition,puzzles,solutions`` (the authors' format); ``puzzles`` is the
grid written as 16 digits and ``solutions`` the query's shape (1-4).

Conditions (relational complexity) follow the authors' rule-based solver:

* binary: the query's row alone, or its column alone, shows the three other shapes;
* ternary: neither alone does, but the row and column together show three distinct shapes;
* quaternary: the query is only forced after reasoning about other blank cells.

For quaternary we propagate two rules over the whole grid until the query is filled: a blank cell
whose row and column leave one shape ("naked single"), and a shape that fits in only one blank cell
of a row or column ("hidden single"). The authors' quaternary strategies are hidden singles: with
naked singles alone 785 of their 3,000 quaternary puzzles stay unsolved; with both rules our
labels reproduce all 9,000 of theirs.

The package: puzzles.py (constants, Puzzles, CSV files, the encoding, the split, the authors' puzzles), solver.py,
generator.py (new puzzles and the generalisation set), distances.py (Jaccard).
"""
from pe_fast.tasks.lst_puzzles.distances import jaccard_distance_matrix, nearest_jaccard_distance
from pe_fast.tasks.lst_puzzles.generator import (DEFAULT_GENERALISATION, DEFAULT_OOD_MIN_DISTANCE,
                                                 DEFAULT_OOD_PER_CONDITION, default_generalisation_set,
                                                 generalisation_set, generate_puzzles)
from pe_fast.tasks.lst_puzzles.puzzles import (AUTHORS_DATA, AUTHORS_LOGS_FILE, AUTHORS_PUZZLE_FILES, BLANK,
                                               CONDITIONS, CSV_HEADER, NUM_CELLS, NUM_SHAPES, NUM_SYMBOLS, QUERY,
                                               PuzzleFileError, Puzzles, authors_file, authors_puzzles, encode,
                                               first_repeat, read_puzzle_folder, read_puzzles, stratified_split,
                                               write_puzzles)
from pe_fast.tasks.lst_puzzles.solver import brute_force_answers, classify, latin_squares

__all__ = ["AUTHORS_DATA", "AUTHORS_LOGS_FILE", "AUTHORS_PUZZLE_FILES", "BLANK", "CONDITIONS", "CSV_HEADER",
           "DEFAULT_GENERALISATION", "DEFAULT_OOD_MIN_DISTANCE", "DEFAULT_OOD_PER_CONDITION", "NUM_CELLS",
           "NUM_SHAPES", "NUM_SYMBOLS", "QUERY", "PuzzleFileError", "Puzzles", "authors_file", "authors_puzzles",
           "brute_force_answers", "classify", "default_generalisation_set", "encode", "first_repeat",
           "generalisation_set", "generate_puzzles", "jaccard_distance_matrix", "latin_squares",
           "nearest_jaccard_distance", "read_puzzle_folder", "read_puzzles", "stratified_split", "write_puzzles"]
