"""Bad data files and data-dependent flags, through the real command-line entry points: exit code 2, exactly one
line on stderr naming the flag and the file or the problem, no traceback, no results folder (issue 42). The
pattern and the tiny flag sets are tests/test_bad_input.py's; the cases that need files of their own are here."""
import io
import os
import subprocess
import warnings
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from test_bad_input import FMRI, LST, NETSIM, assert_one_line, fill, inputs, without
from sweep_harness import narrowed, sweep_command, without_read_override
from test_user_data import save_dlabel, save_dtseries, write_table

from pe_fast.compare_lst_logs import main as compare_main
from pe_fast.data import DataError, load_user_data
from pe_fast.sweep.cli import main as sweep_main
from pe_fast.tasks.lst_puzzles import AUTHORS_DATA, AUTHORS_PUZZLE_FILES


def regions_at(path: Path, points) -> str:
    """A regions table of len(points) regions r0, r1, .. at the given x, y, z, in two networks."""
    return str(write_table(path, [f"r{i},{x},{y},{z},{'ab'[i % 2]}" for i, (x, y, z) in enumerate(points)]))


def data_files(tmp_path: Path) -> dict[str, str]:
    """test_bad_input's files (NPY: 2 subjects × 60 time points × 10 regions) and the broken ones of this file."""
    files = inputs(tmp_path)
    files["ONE_POINT"] = regions_at(tmp_path / "one_point.csv", [(1, 2, 3)] * 10)
    # 8 of 10 on one point: 28 of the 45 pairs 0 mm apart, the median distance 0 (the near_3d probe's scale)
    files["MOSTLY_ONE_POINT"] = regions_at(tmp_path / "mostly.csv", [(1, 2, 3)] * 8 + [(0, 0, 0), (5, 5, 5)])
    for name, shape in (("NO_SUBJECTS", (0, 60, 10)), ("NO_TIME", (2, 0, 10))):
        path = tmp_path / f"{name.lower()}.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("timeseries", shape=shape, dtype="f4", chunks=True, maxshape=(None, None, 10))
        files[name] = str(path)
    series = np.random.default_rng(0).normal(size=(2, 60, 10)).astype("f4")
    np.save(tmp_path / "four_regions.npy", series[..., :4])
    files["FOUR_REGIONS"] = str(tmp_path / "four_regions.npy")
    series.tofile(tmp_path / "raw.bin")
    with h5py.File(tmp_path / "external.h5", "w") as f:  # its data in raw.bin, beside it
        f.create_dataset("timeseries", shape=series.shape, dtype="f4", external=[(str(tmp_path / "raw.bin"), 0,
                                                                                 series.nbytes)])
    with h5py.File(tmp_path / "source.h5", "w") as f:
        f["timeseries"] = series
    layout = h5py.VirtualLayout(shape=series.shape, dtype="f4")
    layout[...] = h5py.VirtualSource(tmp_path / "source.h5", "timeseries", shape=series.shape)
    with h5py.File(tmp_path / "virtual.h5", "w") as f:
        f.create_virtual_dataset("timeseries", layout)
    with h5py.File(tmp_path / "linked.h5", "w") as f:  # its time series a link into source.h5
        f["timeseries"] = h5py.ExternalLink(str(tmp_path / "source.h5"), "/timeseries")
    files.update(LINKED=str(tmp_path / "linked.h5"), SOURCE=str(tmp_path / "source.h5"))
    with h5py.File(tmp_path / "huge.h5", "w") as f:  # a few kB on disk, 4 PiB declared
        f.create_dataset("timeseries", shape=(10**6, 10**6, 1000), dtype="f4", chunks=(1, 100, 100))
    files["ENUM"] = str(tmp_path / "enum.h5")  # categories stored as small integers
    with h5py.File(files["ENUM"], "w") as f:
        f.create_dataset("timeseries", data=(np.random.default_rng(0).standard_normal((3, 40, 8)) > 0).astype("i1"),
                         dtype=h5py.enum_dtype({"off": 0, "on": 1}, basetype="i1"))
    files["BITFIELD"] = str(tmp_path / "bitfield.h5")  # 16-bit fields, which h5py reads as uint16
    with h5py.File(files["BITFIELD"], "w") as f:
        space = h5py.h5s.create_simple((2, 40, 8))
        h5py.h5d.create(f.id, b"timeseries", h5py.h5t.STD_B16LE, space).write(
            h5py.h5s.ALL, h5py.h5s.ALL, np.random.default_rng(0).integers(0, 2**16, (2, 40, 8), dtype="u2"))
    with h5py.File(tmp_path / "null.h5", "w") as f:  # a null dataspace: no shape, no size
        f.create_dataset("timeseries", data=h5py.Empty("f8"))
    files.update(EXTERNAL=str(tmp_path / "external.h5"), VIRTUAL=str(tmp_path / "virtual.h5"),
                 HUGE=str(tmp_path / "huge.h5"), NULL=str(tmp_path / "null.h5"))
    files["TWO_ANSWER_COLUMNS"] = str(tmp_path / "two_answer_columns.csv")  # the second says otherwise
    Path(files["TWO_ANSWER_COLUMNS"]).write_text("ID,LST_num,condition,puzzles,solutions,solutions\n"
                                                 "0,,Binary,2000500234001000,4,1\n")
    files["NOT_LATIN"] = str(tmp_path / "not_latin.csv")  # its second puzzle shows shape 1 twice in its first row
    Path(files["NOT_LATIN"]).write_text("ID,LST_num,condition,puzzles,solutions\n0,,Binary,2000500234001000,4\n"
                                        "1,,Binary,1100500000000000,2\n")
    files["AMBIGUOUS"] = str(tmp_path / "two_answers.csv")  # its query may hold 3 or 4: row 1 shows 1, 2
    Path(files["AMBIGUOUS"]).write_text("ID,LST_num,condition,puzzles,solutions\n0,,Binary,1250000000000000,3\n")
    # the authors' first 300 binary puzzles, each valid alone
    authors = (AUTHORS_DATA / AUTHORS_PUZZLE_FILES[0]).read_text().splitlines(keepends=True)[:301]
    files["TRAIN300"] = str(tmp_path / "train300.csv")
    Path(files["TRAIN300"]).write_text("".join(authors))
    files["MISLABELLED"] = str(tmp_path / "wrong_condition.csv")  # binary puzzles labelled quaternary
    Path(files["MISLABELLED"]).write_text("".join(authors).replace(",Binary,", ",Quaternary,"))
    files["REPEATED"] = str(tmp_path / "repeated.csv")  # line 2's puzzle again on line 302
    Path(files["REPEATED"]).write_text("".join(authors) + authors[1])
    files["REPEATED_ACROSS"] = str(tmp_path / "twice")  # one file twice in a folder
    (tmp_path / "twice").mkdir()
    for name in ("a.csv", "b.csv"):
        (tmp_path / "twice" / name).write_text("".join(authors))
    files["NO_RULE"] = str(tmp_path / "no_rule.csv")  # one answer by brute force; no condition's rules reach it
    Path(files["NO_RULE"]).write_text(authors[0] + "900,,Binary,0023200400005040,3\n")
    files["FIVE_EACH"] = str(tmp_path / "five_each.csv")  # a tenth of 5, rounded, is no test puzzle
    Path(files["FIVE_EACH"]).write_text(authors[0] + "".join(
        line for name in AUTHORS_PUZZLE_FILES for line in (AUTHORS_DATA / name).read_text().splitlines(True)[1:6]))
    files["OOD_OF_TRAINING"] = str(tmp_path / "ood_of_training.csv")  # training puzzles 290-300
    Path(files["OOD_OF_TRAINING"]).write_text(authors[0] + "".join(authors[290:]))
    (tmp_path / "empty").mkdir()
    files["EMPTY_FOLDER"] = str(tmp_path / "empty")
    files["SUPERSCRIPT"] = str(tmp_path / "superscript.csv")  # '³' passes str.isdigit, not int()
    Path(files["SUPERSCRIPT"]).write_text("ID,LST_num,condition,puzzles,solutions\n0,,Binary,12³0500000000000,3\n")
    for name, make in (("ZERO_LINK", lambda p: p.symlink_to("/dev/zero")), ("PIPE", os.mkfifo),
                       ("FOLDER_NAMED_CSV", Path.mkdir)):
        folder = tmp_path / name.lower()  # a puzzle folder: a good file, then one that never ends
        folder.mkdir()
        (folder / "a.csv").write_text(Path(files["NOT_LATIN"]).read_text().splitlines()[0] + "\n"
                                      "0,,Binary,1235000000000000,4\n")
        make(folder / "b.csv")
        files[name] = str(folder)
    with h5py.File(tmp_path / "unwritten.h5", "w") as f:  # 1 GiB of chunks never written: the fill value
        f.create_dataset("timeseries", shape=(2, 12_500_000, 10), dtype="f4", chunks=(1, 1_000_000, 10),
                         fillvalue=1.0)
    files["UNWRITTEN"] = str(tmp_path / "unwritten.h5")
    with h5py.File(tmp_path / "damaged.h5", "w") as f:
        f.create_dataset("timeseries", data=np.random.default_rng(1).normal(size=(2, 60, 10)), chunks=(1, 60, 10),
                         compression="gzip")
        chunk = f["timeseries"].id.get_chunk_info(0)
    with open(tmp_path / "damaged.h5", "r+b") as f:  # the first chunk's deflate stream overwritten
        f.seek(chunk.byte_offset)
        f.write(b"\xff" * chunk.size)
    files["DAMAGED"] = str(tmp_path / "damaged.h5")
    files["SPARSE"] = str(tmp_path / "sparse.npy")  # 8 GB declared, a few kB on disk
    with open(files["SPARSE"], "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": (2, 50_000_000, 10)})
        f.truncate(f.tell() + 8 * 10**9)
    files["ENCRYPTED_NPZ"] = str(tmp_path / "encrypted.npz")  # members marked encrypted: zipfile wants a password
    np.savez(files["ENCRYPTED_NPZ"], a=np.zeros((60, 10), "f4"), b=np.ones((60, 10), "f4"))
    raw = bytearray(Path(files["ENCRYPTED_NPZ"]).read_bytes())
    for signature, flags_at in ((b"PK\x01\x02", 8), (b"PK\x03\x04", 6)):  # central and local headers' flag bits
        at = raw.find(signature)
        while at >= 0:
            raw[at + flags_at] |= 1
            at = raw.find(signature, at + 4)
    Path(files["ENCRYPTED_NPZ"]).write_bytes(bytes(raw))
    # round 17: a second directory entry pointing at the first member's bytes read one subject as two; a stored
    # member with one byte changed read as values (its checksum not checked); two names, one NFC and one NFD
    rows = np.random.default_rng(3).normal(size=(2, 30, 10)).astype("f4")
    members = {}
    for name, run in zip("ab", rows):
        member = io.BytesIO()
        np.save(member, run)
        members[f"{name}.npy"] = member.getvalue()
    for key, names in (("TWICE_POINTED_NPZ", "ab"), ("DAMAGED_NPZ", "ab"), ("NFC_NFD_NPZ", ("s\u00e9", "se\u0301"))):
        files[key] = str(tmp_path / f"{key.lower()}.npz")
        with zipfile.ZipFile(files[key], "w") as archive:
            for name, data in zip(names, members.values()):
                archive.writestr(f"{name}.npy", data)
    raw = bytearray(Path(files["TWICE_POINTED_NPZ"]).read_bytes())
    second = raw.find(b"PK\x01\x02", raw.find(b"PK\x01\x02") + 4)
    raw[second + 42:second + 46] = (0).to_bytes(4, "little")  # b.npy's entry: a.npy's local header
    Path(files["TWICE_POINTED_NPZ"]).write_bytes(bytes(raw))
    raw = bytearray(Path(files["DAMAGED_NPZ"]).read_bytes())
    raw[raw.find(b"a.npy") + 5 + 128 + 40] ^= 0x10  # a byte of a.npy's values
    Path(files["DAMAGED_NPZ"]).write_bytes(bytes(raw))
    files["DANGLING_H5"] = str(tmp_path / "dangling.h5")  # two datasets, and 'timeseries' a link to neither
    with h5py.File(files["DANGLING_H5"], "w") as f:
        f["a"], f["b"] = series, series[:, :, :5]
        f["timeseries"] = h5py.SoftLink("/nowhere")
    files["LYING_NPZ"] = str(tmp_path / "lying.npz")  # a stored member whose header claims 100 rows, holding 60
    with zipfile.ZipFile(files["LYING_NPZ"], "w") as archive:  # its checksum right: the header alone lies
        for name, value in (("a", 0), ("b", 1)):
            member = io.BytesIO()
            np.save(member, np.full((60, 10), value, "i1"))
            archive.writestr(f"{name}.npy", member.getvalue().replace(b"(60, 10)", b"(99, 10)", 1))
    def member(array):
        buffer = io.BytesIO()
        np.save(buffer, array)
        return buffer.getvalue()
    series = np.random.default_rng(2).normal(size=(4, 60, 10))
    files["NPZ_NAME_TWICE"], files["NPZ_NO_SUFFIX"] = str(tmp_path / "twice.npz"), str(tmp_path / "no_suffix.npz")
    with warnings.catch_warnings():  # zipfile warns of the duplicate name it writes
        warnings.simplefilter("ignore")
        with zipfile.ZipFile(files["NPZ_NAME_TWICE"], "w") as z:
            for name, subject in (("s1.npy", 0), ("s2.npy", 1), ("s3.npy", 2), ("s1.npy", 3)):
                z.writestr(name, member(series[subject]))
    with zipfile.ZipFile(files["NPZ_NO_SUFFIX"], "w") as z:  # numpy reads "s1" too
        for name, subject in (("s1", 0), ("s2.npy", 1), ("s3.npy", 2)):
            z.writestr(name, member(series[subject]))
    files["TWO_LABELS"] = str(write_table(tmp_path / "two_labels.csv", [f"r{i},{i},0,0,a,x" for i in range(10)],
                                          header="label,x,y,z,network,Label"))
    files["LONG_ROW"] = str(write_table(tmp_path / "row_too_long.csv", [f"r{i},{i},0,0,a" + ",extra" * (i == 3)
                                                                     for i in range(10)]))
    files["SPLIT_NETWORKS"] = str(write_table(tmp_path / "split_networks.csv", [f"r{i},{i},0,0,{n}" for i, n in
                                                                                 enumerate(["1", "1.0", "2"] * 3 + ["2"])]))
    files["NAN_NETWORKS"] = str(write_table(tmp_path / "nan_networks.csv", [f"r{i},{i},0,0,{n}" for i, n in
                                                                             enumerate(["a", "b", "nan", "NaN"] * 2
                                                                                       + ["a", "b"])]))
    files["TINY"] = regions_at(tmp_path / "tiny.csv", [(i * 1e-170, 0, 0) for i in range(10)])
    # round 16: 1e-5 apart passed the nanometre rule and the sinusoidal PE over them was one table for all regions;
    # a table in metres, a brain's 0.14 across, the same
    files["IN_METRES"] = regions_at(tmp_path / "regions_in_metres.csv",
                                    [(i * 0.014, 0.01 * (i % 3), 0) for i in range(10)])
    # round 18: and with one region far off, the span above the rule
    files["METRES_AND_ONE_FAR"] = regions_at(tmp_path / "regions_metres_one_far.csv",
                                             [(i * 0.014, 0.01 * (i % 3), 0) for i in range(9)] + [(1.2, 0, 0)])
    np.save(tmp_path / "long_double.npy", np.random.default_rng(0).standard_normal((2, 60, 10)).astype(np.longdouble))
    files["LONG_DOUBLE"] = str(tmp_path / "long_double.npy")
    # round 17: one network, or one each, left the network measures NaN or meaningless
    for name, network in (("ONE_NETWORK", lambda i: "x"), ("OWN_NETWORKS", lambda i: f"n{i}")):
        files[name] = str(write_table(tmp_path / f"{name.lower()}.csv",
                                      [f"r{i},{i},{i % 3},0,{network(i)}" for i in range(10)]))
    files["FAR"] = regions_at(tmp_path / "remote.csv", [(i * 1e200, 0, 0) for i in range(10)])
    files["TMP"] = str(tmp_path.resolve())
    return files


# (case, the command's flags, what the one line must hold). Tokens are data_files()'s, also in the expected line
# as {TOKEN}; "." is the test's folder, which holds the files of data_files().
CASES = [
    ("all centroids on one point", FMRI + ["--data", "NPY", "--regions", "ONE_POINT"],
     "--regions {ONE_POINT}: regions 'r0', 'r1', 'r2' and 7 more share the centroid (1, 2, 3)"),
    ("most centroids on one point", FMRI + ["--data", "NPY", "--regions", "MOSTLY_ONE_POINT"],
     "--regions {MOSTLY_ONE_POINT}: regions 'r0', 'r1', 'r2' and 5 more share the centroid (1, 2, 3)"),
    ("chunked h5 without subjects", FMRI + ["--data", "NO_SUBJECTS"],
     "--data {NO_SUBJECTS}: the file holds no subjects"),
    ("chunked h5 without time points", FMRI + ["--data", "NO_TIME"],
     "--data {NO_TIME}: subject 'subject0' has shape (0, 10)"),
    ("h5 data in an external file", FMRI + ["--data", "EXTERNAL"],
     "--data {EXTERNAL}: dataset 'timeseries' keeps its data in an external file"),
    # passed by when the file was searched for datasets: "cannot tell which of its datasets [] holds ..."
    ("h5 external link", FMRI + ["--data", "LINKED"],
     "--data {LINKED}: 'timeseries' is an external link to {SOURCE}:/timeseries, data of another file"),
    ("h5 virtual dataset", FMRI + ["--data", "VIRTUAL"],
     "--data {VIRTUAL}: dataset 'timeseries' is a virtual dataset, mapping data of other files"),
    ("h5 enum dataset", FMRI + ["--data", "ENUM"],  # read as its integers: categories taken for a time series
     "--data {ENUM}: dataset 'timeseries' holds an HDF5 enum (categories ['off', 'on']), not numbers"),
    ("h5 bitfield dataset", FMRI + ["--data", "BITFIELD"],  # read as uint16: bit patterns taken for a time series
     "--data {BITFIELD}: dataset 'timeseries' holds HDF5 bitfield values, not numbers"),
    ("h5 dataset with a null dataspace", FMRI + ["--data", "NULL"],
     "--data {NULL}: dataset 'timeseries' is empty (a null dataspace)"),
    ("h5 declaring more than memory", FMRI + ["--data", "HUGE"],
     "--data {HUGE}: dataset 'timeseries' declares shape (1000000, 1000000, 1000)"),
    # the user gave no --pe: the preset's is named as the preset's
    ("preset PE without the centroids it needs", FMRI + ["--data", "NPY", "--preset", "all-pes"],
     "--pe sinnd, of --preset all-pes: PE 'sinnd' needs token coordinates"),
    ("given PE without the centroids it needs, beside a preset", FMRI + ["--data", "NPY", "--preset", "all-pes",
                                                                         "--pe", "learned,sinnd"],
     "--pe sinnd: PE 'sinnd' needs token coordinates"),
    ("window longer than the data", FMRI + ["--data", "NPY", "--window", "100000"],
     "--window 100000 is longer than the shortest run of the data (60 time points)"),
    ("window longer than the simulation", NETSIM + ["--window", "100000"],
     "--window 100000 is longer than the shortest run of the data (200 time points)"),
    ("more modules than nodes", NETSIM + ["--modules", "50"], "--modules 50 is more than --nodes 12"),
    ("more modules than the default nodes", without(without(NETSIM, "--nodes"), "--modules") + ["--modules", "101"],
     "--modules 101 is more than --nodes 100"),
    ("regions table a folder", FMRI + ["--data", "NPY", "--regions", "."], "--regions {TMP}: a folder, not a file"),
    ("data a folder", FMRI + ["--data", "."], "--data {TMP}: a folder, not a file"),
    ("puzzle folder of other CSV files", LST + ["--lst-train", "."],  # mostly.csv: the first CSV file by name
     "--lst-train {TMP}/mostly.csv:1: missing column(s) condition, puzzles, solutions"),
    # the first was read, the second ignored
    ("generalisation puzzles with two answer columns", LST + ["--lst-ood", "TWO_ANSWER_COLUMNS"],
     "--lst-ood {TWO_ANSWER_COLUMNS}:1: its header names column solutions twice: give each column once"),
    ("generalisation puzzle not a Latin square", LST + ["--lst-ood", "NOT_LATIN"],
     "--lst-ood {NOT_LATIN}:3: puzzle 2 of the file, '1100500000000000': no Latin square completes it (shape 1 twice in row 1)"),
    ("generalisation puzzle with two answers", LST + ["--lst-ood", "AMBIGUOUS"],
     "--lst-ood {AMBIGUOUS}:2: puzzle 1 of the file, '1250000000000000': ambiguous: its query may hold 3 or 4"),
    ("puzzle folder without CSV files", LST + ["--lst-train", "EMPTY_FOLDER"],
     "--lst-train {EMPTY_FOLDER}:0: folder has no *.csv puzzle files"),
    ("puzzle in superscript digits", LST + ["--lst-ood", "SUPERSCRIPT"],
     "--lst-ood {SUPERSCRIPT}:2: puzzle must be 16 digits 0-5, got '12³0500000000000'"),
    ("puzzle folder with a link to /dev/zero", LST + ["--lst-ood", "ZERO_LINK"],
     "--lst-ood {ZERO_LINK}/b.csv:0: not a regular file (a pipe, device or socket)"),
    # each once accepted: scored per condition by the label, split into training and test twice, generalisation
    # scored on training puzzles
    ("puzzle condition the rules contradict", LST + ["--lst-train", "MISLABELLED"],
     "--lst-train {MISLABELLED}:2: puzzle 1 of the file, '2000500234001000': its condition Quaternary contradicts "
     "it: the rules solve it as Binary"),
    ("puzzle no condition's rules solve", LST + ["--lst-train", "NO_RULE"],
     "--lst-train {NO_RULE}:2: puzzle 1 of the file, '0023200400005040': the rules of the task's conditions do not "
     "solve it"),
    # its test split was empty: a traceback at the first evaluation, after config.json was written
    ("puzzle file too small for a test split", LST + ["--lst-train", "FIVE_EACH", "--batch-size", "8"],
     "--lst-train {FIVE_EACH}:0: its 15 puzzles leave no test puzzle"),
    ("puzzle file repeating a puzzle", LST + ["--lst-train", "REPEATED"],
     "--lst-train {REPEATED}:302: repeats the puzzle of line 2: give each puzzle once"),
    ("puzzle folder repeating a file", LST + ["--lst-train", "REPEATED_ACROSS"],
     "--lst-train {REPEATED_ACROSS}/b.csv:0: its puzzle 1 repeats puzzle 1 of a.csv: give each puzzle once"),
    ("generalisation puzzles the training set holds", LST + ["--lst-train", "TRAIN300", "--lst-ood",
                                                             "OOD_OF_TRAINING"],
     "--lst-ood {OOD_OF_TRAINING}:0: its puzzle 1 is a training puzzle (puzzle 290 of {TRAIN300})"),
    ("puzzle folder with a pipe", LST + ["--lst-ood", "PIPE"],
     "--lst-ood {PIPE}/b.csv:0: not a regular file (a pipe, device or socket)"),
    # it said "a pipe, device or socket", sending the user to look for one
    ("puzzle folder with a folder named b.csv", LST + ["--lst-ood", "FOLDER_NAMED_CSV"],
     "--lst-ood {FOLDER_NAMED_CSV}/b.csv:0: a folder, not a puzzle CSV file"),
    # the error named --lst-train, the first flag naming the file
    ("one file as training and generalisation puzzles", LST + ["--lst-train", "TRAIN300", "--lst-ood", "TRAIN300"],
     "--lst-ood {TRAIN300}:0: its puzzle 1 is a training puzzle (puzzle 1 of {TRAIN300})"),
    ("h5 of chunks never written", FMRI + ["--data", "UNWRITTEN"],
     "--data {UNWRITTEN} declares 1,907 MiB once read, from 0.0 MiB on disk"),
    ("h5 with a damaged chunk", FMRI + ["--data", "DAMAGED"],
     "--data {DAMAGED}: cannot read dataset 'timeseries'"),
    ("sparse npy", FMRI + ["--data", "SPARSE"], "--data {SPARSE} declares 7,629 MiB once read, from 0.0 MiB on disk"),
    # round 16: a traceback (zipfile's RuntimeError asking for a password), or cipher text read as values; another
    # dataset read in a dangling link's place
    ("npz members encrypted", FMRI + ["--data", "ENCRYPTED_NPZ"],
     "--data {ENCRYPTED_NPZ}: its member 'a.npy' is encrypted"),
    ("npz directory entry pointing at another member", FMRI + ["--data", "TWICE_POINTED_NPZ"],
     "--data {TWICE_POINTED_NPZ}: members a.npy and b.npy overlap in the file"),
    ("npz member damaged", FMRI + ["--data", "DAMAGED_NPZ"],
     "--data {DAMAGED_NPZ}: member a.npy does not match its checksum"),
    ("npz subject named twice, NFC and NFD", FMRI + ["--data", "NFC_NFD_NPZ"],
     "--data {NFC_NFD_NPZ}: it holds two arrays named 'sé'"),
    ("h5 time series a link to nothing", FMRI + ["--data", "DANGLING_H5"],
     "--data {DANGLING_H5}: 'timeseries' is a link that leads to nothing in the file (it names '/nowhere')"),
    ("npz member longer than it holds", FMRI + ["--data", "LYING_NPZ"],
     "--data {LYING_NPZ}: member a.npy declares shape (99, 10), more than the member holds"),
    # each read as one subject fewer, without a word
    ("npz naming an array twice", FMRI + ["--data", "NPZ_NAME_TWICE"],
     "--data {NPZ_NAME_TWICE}: it holds two arrays named 's1'"),
    ("npz member without .npy", FMRI + ["--data", "NPZ_NO_SUFFIX"],
     "--data {NPZ_NO_SUFFIX}: its member 's1' is not a .npy array"),
    ("regions table with label twice", FMRI + ["--data", "NPY", "--regions", "TWO_LABELS"],
     "--regions {TWO_LABELS}: the regions table's header names column 'label' twice"),
    # 4 regions have 2 connectivity gradients, not the 3 the PE is compared with: once a traceback after training
    ("data of 4 regions", FMRI + ["--data", "FOUR_REGIONS"],
     "--data {FOUR_REGIONS}: 4 regions; the sweep needs at least 5"),
    # its extra field was dropped without a word (a short row is refused)
    ("regions table row longer than its header", FMRI + ["--data", "NPY", "--regions", "LONG_ROW"],
     "--regions {LONG_ROW}:5: the regions table's row holds 6 fields, its header 5: give one field per column"),
    # two networks where one was meant: the modularity and same-network probes on the split
    ("regions network written two ways", FMRI + ["--data", "NPY", "--regions", "SPLIT_NETWORKS"],
     "--regions {SPLIT_NETWORKS}: network cells '1' and '1.0' write one number two ways"),
    # distances underflowed to 0: refused for regions sharing one centroid, which they do not
    ("regions in metres, one far off", FMRI + ["--data", "NPY", "--regions", "METRES_AND_ONE_FAR"],
     "--regions {METRES_AND_ONE_FAR}: the x, y, z columns lie a median 0.0"),
    # a missing value written as numpy writes it, and again in another spelling: taken for two networks
    ("regions network cells that are NaN", FMRI + ["--data", "NPY", "--regions", "NAN_NETWORKS"],
     "--regions {NAN_NETWORKS}: region 'r2' has no network (its cell 'nan')"),
    ("regions in one network", FMRI + ["--data", "NPY", "--regions", "ONE_NETWORK"],
     "--regions {ONE_NETWORK}: its network column puts every region in one network"),
    ("regions in networks of their own", FMRI + ["--data", "NPY", "--regions", "OWN_NETWORKS"],
     "--regions {OWN_NETWORKS}: its network column puts each region in a network of its own"),
    ("regions in metres", FMRI + ["--data", "NPY", "--regions", "IN_METRES"],
     "--regions {IN_METRES}: the x, y, z columns span only 0.126 mm, less than 1 mm"),
    ("regions a nanometre apart", FMRI + ["--data", "NPY", "--regions", "TINY"],
     "--regions {TINY}: the x, y, z columns span only 9e-170"),
    # a variation float64 flattens passed the constant-region check
    ("data in long double", FMRI + ["--data", "LONG_DOUBLE"], "--data {LONG_DOUBLE}: values of type float128"),
    ("netsim without coupling", NETSIM + ["--coupling", "0"], "--coupling must be finite and > 0"),
    ("regions far beyond a brain", FMRI + ["--data", "NPY", "--regions", "FAR"],
     "--regions {FAR}: the x, y, z columns hold values beyond ±1,000,000"),
]


@pytest.mark.parametrize("args, must_name", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_data(args, must_name, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # "." and a default --out would land here
    files = data_files(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    threads = torch.get_num_threads()
    try:
        code = sweep_main(narrowed(*fill(args, files), "--out", str(tmp_path / "run")))
    finally:
        torch.set_num_threads(threads)
    assert_one_line(capsys, code, must_name.format(**files))
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no results folder, nothing else either


def test_a_file_that_is_not_a_puzzle_file_is_refused_without_quoting_it(tmp_path, capsys):
    """A puzzle folder's CSV may be a link to anyone's file (and a folder's config.json may name any folder): the
    refusal names the file and what its header lacks, never its text."""
    secret = tmp_path / "secret.txt"
    secret.write_text("root:s3cr3t-hash:0:0\n")
    (tmp_path / "puzzles").mkdir()
    (tmp_path / "puzzles" / "a.csv").symlink_to(secret)
    threads = torch.get_num_threads()
    try:
        code = sweep_main(LST + ["--lst-train", str(tmp_path / "puzzles"), "--out", str(tmp_path / "run")])
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "a.csv:1: missing column(s) condition, puzzles, solutions in its header line" in err and "s3cr3t" not in err


def test_centroids_that_coincide_for_at_most_half_the_pairs_are_taken(tmp_path):
    """Two regions on one point, or 5 of 10 (10 of 45 pairs), leave the median distance above 0."""
    files = inputs(tmp_path)
    two_on_one_point = [(0, 0, 0)] * 2 + [(0, 0, i) for i in range(2, 10)]
    half_on_one_point = [(1, 2, 3)] * 5 + [(i, 0, 0) for i in range(5)]
    for points in (two_on_one_point, half_on_one_point):
        data = load_user_data(files["NPY"], regions_at(tmp_path / "r.csv", points))
        np.testing.assert_array_equal(data.centroids, points)


def test_cifti_regions_table_on_one_point_is_refused(tmp_path):
    """The other user source of centroids: a CIFTI parcellation's regions table (an atlas's own are fine)."""
    series = save_dtseries(tmp_path / "run.dtseries.nii", np.random.default_rng(0).normal(size=(10, 12)))
    table = write_table(tmp_path / "t.csv", [f"{label},4,5,6,a" for label in "ABCD"])
    with pytest.raises(DataError, match=r"t\.csv: regions 'A', 'B', 'C' and 1 more share the centroid \(4, 5, 6\)"):
        load_user_data(series, table, parcellation=save_dlabel(tmp_path / "p.dlabel.nii"))


def test_compare_lst_logs_bad_argument_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        compare_main([str(tmp_path), "--no-such-flag"])
    assert_one_line(capsys, exit_.value.code, "unrecognized arguments: --no-such-flag")
    assert list(tmp_path.iterdir()) == []


def test_compressed_npz_that_inflates_far_beyond_its_size_is_refused_unread(tmp_path, capsys):
    """A 0.3 MB .npz whose member inflates to 258 MiB (516 as float64): refused from its declared size, as a results folder's
    files are (pe_fast.data.declared_size), not read whole first."""
    import zipfile
    bomb = tmp_path / "bomb.npz"
    shape = (2, 33_000, 1024)  # 258 MiB of float32 zeros: above the 256 MiB floor
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive, \
            archive.open("ts.npy", "w", force_zip64=True) as member:
        np.lib.format.write_array_header_1_0(member, {"descr": "<f4", "fortran_order": False, "shape": shape})
        for _ in range(shape[0] * 33):
            member.write(bytes(4 * 1000 * 1024))
    code = sweep_main(FMRI + ["--data", str(bomb), "--out", str(tmp_path / "run")])
    assert_one_line(capsys, code, f"--data {bomb} declares 516 MiB once read, from 0.3 MiB on disk")
    assert not (tmp_path / "run").exists()


def test_small_integers_are_judged_by_the_floats_they_become(tmp_path, capsys):
    """int8 values (1 byte each on disk) become float64 once read: a 0.1 MB .npz of 40 M int8 values passed the
    rule counted in stored bytes (40 MB, under the 256 MiB floor) and then took GBs as floats (issue 55)."""
    bomb = tmp_path / "small_ints.npz"
    values = np.zeros((4, 5_000_000, 10), np.int8)
    values[:, ::7] = 1
    np.savez_compressed(bomb, s=values)
    assert bomb.stat().st_size < 2**20
    code = sweep_main(FMRI + ["--data", str(bomb), "--out", str(tmp_path / "run")])
    assert_one_line(capsys, code, f"--data {bomb} declares 1,526 MiB once read, from")
    assert not (tmp_path / "run").exists()


def test_chunked_h5_values_are_judged_as_the_same_values_stored_contiguously(tmp_path):
    """A chunked dataset is read in its own dtype, not float32 first: values near 1e100 (inf as float32) and a
    large offset with small variation (constant as float32) load as the contiguous copy of the same data does."""
    rng = np.random.default_rng(0)
    for values in (rng.normal(size=(2, 60, 10)) * 1e100, 1e6 + 1e-3 * rng.normal(size=(2, 60, 10))):
        for layout, options in (("contiguous", {}), ("chunked", dict(chunks=(1, 60, 10), compression="gzip"))):
            with h5py.File(tmp_path / f"{layout}.h5", "w") as f:
                f.create_dataset("timeseries", data=values, **options)
        contiguous, chunked = (load_user_data(tmp_path / f"{layout}.h5") for layout in ("contiguous", "chunked"))
        for a, b in zip(contiguous.runs, chunked.runs):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("flag", ["--data", "--regions"])
def test_a_data_file_the_user_may_not_read_is_one_line_naming_its_flag(flag, tmp_path):
    """A mode-000 --data file once ended in exit 1, "free the space or fix the folder", as if a disk had filled."""
    files = {"--data": tmp_path / "x.npy", "--regions": tmp_path / "regions.csv"}
    np.save(files["--data"], np.random.default_rng(0).standard_normal((4, 60, 12)).astype(np.float32))
    write_table(files["--regions"], [f"r{i},{i},0,0,n{i % 3}" for i in range(12)])
    files[flag].chmod(0)
    done = subprocess.run([*without_read_override(), *sweep_command(
        "--task", "fmri", "--data", str(files["--data"]), "--regions", str(files["--regions"]), "--steps", "2",
        "--out", str(tmp_path / "run"))], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-1500:]
    assert done.stderr.startswith(f"error: {flag} {files[flag]}") and "Permission denied" in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


def test_network_numbers_are_compared_as_written_not_as_floats(tmp_path):
    """Networks 9007199254740992 and 9007199254740993 (2**53 and one more) were refused as one number written two
    ways, equal as floats (round 17): they are two networks; 1 and 1.0 are still one number written two ways."""
    files = inputs(tmp_path)
    big = write_table(tmp_path / "big.csv", [f"r{i},{i},{i % 3},0,{2**53 + i % 2}" for i in range(10)])
    data = load_user_data(files["NPY"], big)
    assert data.network_names == [str(2**53), str(2**53 + 1)] and list(data.networks) == [0, 1] * 5
    twice = write_table(tmp_path / "twice.csv", [f"r{i},{i},{i % 3},0,{['1', '1.0', '2'][i % 3]}" for i in range(10)])
    with pytest.raises(DataError, match="network cells '1' and '1.0' write one number two ways"):
        load_user_data(files["NPY"], twice)


def test_h5_integers_of_odd_precision_are_read_as_their_values(tmp_path):
    """A contiguous dataset of 12-bit integers at a bit offset of 4 was memory-mapped as raw int32: 25 read as 400,
    with the padding's bits (round 17). Where the file's type is not numpy's, h5py converts."""
    from h5py import h5d, h5s, h5t
    values = np.random.default_rng(0).integers(-1000, 1000, (3, 20, 6)).astype("i4")
    path = tmp_path / "odd_bits.h5"
    with h5py.File(path, "w") as f:
        kind = h5t.STD_I32LE.copy()
        kind.set_precision(12)
        kind.set_offset(4)
        h5d.create(f.id, b"timeseries", kind, h5s.create_simple(values.shape)).write(h5s.ALL, h5s.ALL, values)
    data = load_user_data(path)
    np.testing.assert_array_equal(np.stack([np.asarray(run) for run in data.runs]), values)
