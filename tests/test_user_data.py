"""The user's own files: every format round-trips against numpy on the raw arrays; bad input is a DataError."""
import warnings
import zipfile

import h5py
import nibabel as nib
import numpy as np
import pytest
from nibabel import cifti2

from pe_fast.data import DataError, correlation_fc, load_user_data

RNG = np.random.default_rng(0)
SERIES = RNG.normal(size=(3, 50, 6)).astype(np.float32) + 100.0  # subjects x time x regions


def write_table(path, rows, header="label,x,y,z,network"):
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


def pearson_mean(runs):
    # Independent reference: numpy's corrcoef per run, averaged with weights = run lengths.
    total = sum(len(r) * np.corrcoef(np.asarray(r, np.float64).T) for r in runs)
    return total / sum(len(r) for r in runs)


def test_npy_3d_is_memory_mapped_subjects_and_fc_is_the_data_correlation(tmp_path):
    np.save(tmp_path / "ts.npy", SERIES)
    d = load_user_data(tmp_path / "ts.npy")
    assert d.subjects == ["subject0", "subject1", "subject2"] and len(d.runs) == 3
    assert all(isinstance(r, np.memmap) and not r.flags.writeable for r in d.runs)
    np.testing.assert_array_equal(np.stack(d.runs), SERIES)
    np.testing.assert_allclose(d.fc, pearson_mean(list(SERIES)), atol=1e-10)
    assert list(d.labels) == [f"region_{i}" for i in range(6)]
    assert d.centroids is None and d.networks is None and d.kind == "fmri"
    assert "correlation of the data" in d.source


def test_npy_2d_is_one_subject(tmp_path):
    np.save(tmp_path / "one.npy", SERIES[0].astype(np.float64))
    d = load_user_data(tmp_path / "one.npy")
    assert d.subjects == ["subject0"]
    np.testing.assert_array_equal(d.runs[0], SERIES[0])


def test_regions_table_gives_labels_centroids_and_networks_by_name_or_int(tmp_path):
    np.save(tmp_path / "ts.npy", SERIES)
    rows = [f"r{i},{i},{-i},{2 * i},{'DMN' if i < 3 else 'Vis'}" for i in range(6)]
    d = load_user_data(tmp_path / "ts.npy", write_table(tmp_path / "a.csv", rows))
    assert list(d.labels) == [f"r{i}" for i in range(6)]
    np.testing.assert_array_equal(d.centroids, [[i, -i, 2 * i] for i in range(6)])
    assert d.network_names == ["DMN", "Vis"] and list(d.networks) == [0, 0, 0, 1, 1, 1]
    rows = [f"r{i},{7 if i % 2 else 3}" for i in range(6)]
    d = load_user_data(tmp_path / "ts.npy", write_table(tmp_path / "b.csv", rows, "label,network"))
    assert d.centroids is None and d.network_names == ["3", "7"] and list(d.networks) == [0, 1] * 3


def test_regions_table_saved_with_a_byte_order_mark_reads_as_without(tmp_path):
    """Excel's "CSV UTF-8" starts the file with U+FEFF: the same table as the one without it."""
    np.save(tmp_path / "ts.npy", SERIES)
    rows = [f"r{i},{i},{-i},{2 * i},{'DMN' if i < 3 else 'Vis'}" for i in range(6)]
    plain = load_user_data(tmp_path / "ts.npy", write_table(tmp_path / "plain.csv", rows))
    marked = load_user_data(tmp_path / "ts.npy", write_table(tmp_path / "excel.csv", rows, "\ufefflabel,x,y,z,network"))
    assert (tmp_path / "excel.csv").read_bytes()[:3] == b"\xef\xbb\xbf"
    assert list(marked.labels) == list(plain.labels) == [f"r{i}" for i in range(6)]
    np.testing.assert_array_equal(marked.centroids, plain.centroids)
    assert marked.network_names == plain.network_names and list(marked.networks) == list(plain.networks)


def test_npz_one_array_and_one_array_per_subject(tmp_path):
    np.savez(tmp_path / "one.npz", SERIES)
    d = load_user_data(tmp_path / "one.npz")
    assert len(d.runs) == 3 and isinstance(d.runs[0], np.memmap)
    np.testing.assert_array_equal(np.stack(d.runs), SERIES)
    np.savez_compressed(tmp_path / "subjects.npz", alice=SERIES[0], bob=SERIES[1:])  # bob: 2 runs
    d = load_user_data(tmp_path / "subjects.npz")
    assert d.subjects == ["alice", "bob", "bob"] and d.run_names == ["run0", "run0", "run1"]
    for got, want in zip(d.runs, SERIES):
        np.testing.assert_array_equal(got, want)
    assert "compressed" in d.source
    d = load_user_data(tmp_path / "subjects.npz", dataset="alice")
    assert d.subjects == ["subject0"]


def test_uncompressed_npz_memory_map_reads_the_right_bytes_for_float64_and_fortran_order(tmp_path):
    a = np.asfortranarray(RNG.normal(size=(40, 6)))
    np.savez(tmp_path / "f.npz", first=SERIES[0], second=a)
    with zipfile.ZipFile(tmp_path / "f.npz") as z:
        assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())
    d = load_user_data(tmp_path / "f.npz")
    assert all(isinstance(r, np.memmap) for r in d.runs) and d.runs[1].dtype == np.float64
    np.testing.assert_array_equal(d.runs[0], SERIES[0])
    np.testing.assert_array_equal(d.runs[1], a)


def test_h5_contiguous_is_memory_mapped_and_chunked_is_read(tmp_path):
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f["meta/tr"] = np.array([0.72])
        f["timeseries"] = SERIES
    d = load_user_data(tmp_path / "c.h5")
    assert isinstance(d.runs[0], np.memmap)
    np.testing.assert_array_equal(np.stack(d.runs), SERIES)
    with h5py.File(tmp_path / "z.hdf5", "w") as f:
        f.create_dataset("group/bold", data=SERIES, chunks=(1, 10, 6), compression="gzip")
        f["labels"] = np.arange(6)
    d = load_user_data(tmp_path / "z.hdf5")  # the first 3D dataset
    np.testing.assert_array_equal(np.stack(d.runs), SERIES)
    d = load_user_data(tmp_path / "z.hdf5", dataset="group/bold")
    assert len(d.runs) == 3


# ------------------------------------------------------------------ CIFTI

def brain_models():
    left = cifti2.BrainModelAxis.from_surface(np.arange(8), nvertex=10, name="CortexLeft")
    right = cifti2.BrainModelAxis.from_surface(np.array([0, 2, 3, 5]), nvertex=6, name="CortexRight")
    return left + right  # 12 grayordinates


CODES = np.array([1, 1, 2, 2, 2, 0, 3, 3, 1, 4, 4, 2])  # 0 = unlabelled; parcel 4 = 'D'
NAMES = {0: ("???", (0, 0, 0, 0)), 1: ("A", (1, 0, 0, 1)), 2: ("B", (0, 1, 0, 1)), 3: ("C", (0, 0, 1, 1)),
         4: ("D", (1, 1, 0, 1)), 5: ("unused", (1, 1, 1, 1))}


def save_dtseries(path, data, models=None):
    hdr = cifti2.Cifti2Header.from_axes((cifti2.SeriesAxis(0, 0.8, data.shape[0]), models or brain_models()))
    img = cifti2.Cifti2Image(data.astype(np.float32), hdr)
    img.nifti_header.set_intent("ConnDenseSeries")
    nib.save(img, path)
    return path


def save_dlabel(path, codes=CODES, models=None, names=None):
    hdr = cifti2.Cifti2Header.from_axes((cifti2.LabelAxis(["parcels"], [names or NAMES]), models or brain_models()))
    img = cifti2.Cifti2Image(codes[None].astype(np.int32), hdr)
    img.nifti_header.set_intent("ConnDenseLabel")
    nib.save(img, path)
    return path


def test_cifti_parcel_means_equal_numpy_on_the_grayordinates(tmp_path):
    raw = [RNG.normal(size=(30, 12)), RNG.normal(size=(25, 12))]
    runs = [save_dtseries(tmp_path / f"sub{i}_rest.dtseries.nii", x) for i, x in enumerate(raw)]
    parc = save_dlabel(tmp_path / "atlas.dlabel.nii")
    d = load_user_data(runs, parcellation=parc)
    assert list(d.labels) == ["A", "B", "C", "D"]  # 'unused' has no grayordinate; '???' is key 0
    assert d.subjects == ["sub0_rest", "sub1_rest"] and d.tr_seconds == pytest.approx(0.8)
    for got, x in zip(d.runs, raw):
        x = x.astype(np.float32).astype(np.float64)
        want = np.stack([x[:, CODES == k].mean(1) for k in (1, 2, 3, 4)], axis=1)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    rows = ["C,1,2,3,vis", "A,4,5,6,dmn", "D,0,0,0,vis", "B,7,8,9,dmn"]  # any order: matched by name
    d = load_user_data(runs[0], write_table(tmp_path / "r.csv", rows), parcellation=parc)
    np.testing.assert_array_equal(d.centroids, [[4, 5, 6], [7, 8, 9], [1, 2, 3], [0, 0, 0]])
    assert [d.network_names[k] for k in d.networks] == ["dmn", "dmn", "vis", "vis"]


# ------------------------------------------------------------------ bad input → one-line DataError

def raises(match, *args, **kwargs):
    with pytest.raises(DataError, match=match) as e:
        load_user_data(*args, **kwargs)
    assert "\n" not in str(e.value) and ": " in str(e.value)
    return str(e.value)


def test_wrong_dimensions_unknown_extension_unreadable_and_missing(tmp_path):
    np.save(tmp_path / "4d.npy", np.zeros((2, 3, 4, 5)))
    raises(r"4d\.npy.*4 dimensions.*\[subjects, time, regions\]", tmp_path / "4d.npy")
    np.save(tmp_path / "1d.npy", np.zeros(5))
    raises("1 dimensions", tmp_path / "1d.npy")
    (tmp_path / "x.mat").write_bytes(b"0")
    raises(r"unknown file type '\.mat'.*\.npy", tmp_path / "x.mat")
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    raises("junk.npy: not a .npy file", tmp_path / "junk.npy")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    raises("not a readable .npz", tmp_path / "junk.npz")
    (tmp_path / "junk.h5").write_bytes(b"not hdf5")
    raises("not a readable HDF5", tmp_path / "junk.h5")
    raises("no such file", tmp_path / "absent.npy")
    np.save(tmp_path / "s.npy", np.array([["a", "b"], ["c", "d"]]))
    raises("not real numbers", tmp_path / "s.npy")
    np.save(tmp_path / "short.npy", np.zeros((1, 4)))
    raises("at least 2 time points", tmp_path / "short.npy")


def test_nan_and_inf_are_located_in_a_chunked_scan(tmp_path, monkeypatch):
    import pe_fast.data.user_data as ud

    monkeypatch.setattr(ud, "_CHUNK_ELEMENTS", 12)  # 2 rows of 6 regions per chunk: the scan must carry offsets
    bad = SERIES.copy()
    bad[2, 37, 4] = np.nan
    np.save(tmp_path / "nan.npy", bad)
    msg = raises("nan at subject 'subject2' run0, time 37, region 4", tmp_path / "nan.npy")
    assert "remove or interpolate" in msg
    bad = SERIES.copy()
    bad[1, 5, 0] = -np.inf
    np.savez(tmp_path / "inf.npz", bad)
    raises("-inf at subject 'subject1' run0, time 5, region 0", tmp_path / "inf.npz")


def test_finite_values_too_large_to_correlate_are_refused_in_one_line(tmp_path):
    """1.7e308 is finite, but its square is not: the FC would be NaN (issue 55)."""
    bad = SERIES.astype(np.float64)  # float32 would hold it as inf
    bad[0, 3, 2] = 1.7e308
    np.save(tmp_path / "huge.npy", bad)
    msg = raises(r"1\.7e\+308 at subject 'subject0' run0, time 3, region 2", tmp_path / "huge.npy")
    assert "rescale the series" in msg


def test_a_region_too_faint_to_correlate_is_refused_not_called_constant(tmp_path):
    """Variation of 1e-300 is real, but its squares underflow: the sd read 0 and the series was refused as "every
    region ... is constant". Data with a large offset and small variation (BOLD around 1e4) still read."""
    faint = SERIES.astype(np.float64) * 1e-300
    np.save(tmp_path / "faint.npy", faint)
    msg = raises(r"region 0 of subject 'subject0' run0 varies by only .*e-300, below 1e-150", tmp_path / "faint.npy")
    assert "rescale the series" in msg and "constant" not in msg
    offset = 1e4 + SERIES.astype(np.float64) * 1e-6
    np.save(tmp_path / "offset.npy", offset)
    assert len(load_user_data(tmp_path / "offset.npy").runs) == len(SERIES)


def test_float32_series_read_without_a_warning(tmp_path):
    """The size check compares in float64: 1e150 cast to float32 warned "overflow encountered in cast" on stderr at
    every float32 --data, two lines above any refusal's one."""
    np.save(tmp_path / "f32.npy", SERIES.astype(np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_user_data(tmp_path / "f32.npy").subjects


def test_constant_region_is_refused(tmp_path):
    flat = SERIES.copy()
    flat[0, :, 3] = 5.0
    np.save(tmp_path / "flat.npy", flat)
    raises("region 3 is constant in subject 'subject0'", tmp_path / "flat.npy")


def test_regions_table_problems(tmp_path):
    np.save(tmp_path / "ts.npy", SERIES)
    ts = tmp_path / "ts.npy"
    rows = [f"r{i},0,0,0,a" for i in range(5)]
    raises(r"5 rows but .*ts\.npy has 6 regions", ts, write_table(tmp_path / "few.csv", rows))
    rows = [f"r{i},0,0" for i in range(6)]
    raises(r"column\(s\) \['x', 'y'\] but not all of x, y, z", ts, write_table(tmp_path / "xy.csv", rows, "label,x,y"))
    rows = [f"{i},net" for i in range(6)]
    raises("no 'label' column", ts, write_table(tmp_path / "nolabel.csv", rows, "name,network"))
    # the advice the file needs: its encoding, its separator (it has a header line)
    text = write_table(tmp_path / "plain.csv", rows).read_text()
    (tmp_path / "utf16.csv").write_text(text, encoding="utf-16")
    raises("the regions table is not UTF-8 text .*: save it as CSV UTF-8", ts, tmp_path / "utf16.csv")
    (tmp_path / "utf16le.csv").write_bytes(text.encode("utf-16-le"))  # no byte-order mark: it decodes as UTF-8
    raises("the regions table is not UTF-8 text .*NUL bytes", ts, tmp_path / "utf16le.csv")
    (tmp_path / "semicolons.csv").write_text(text.replace(",", ";"))
    raises("one column holding semicolons, tabs or bars: separate its columns with commas", ts,
           tmp_path / "semicolons.csv")
    rows = [f"r{i % 5},0,0,0,a" for i in range(6)]
    raises("'r0' is empty or repeated", ts, write_table(tmp_path / "dup.csv", rows))
    rows = [f"r{i},0,north,0,a" for i in range(6)]
    raises("non-numeric x, y or z", ts, write_table(tmp_path / "str.csv", rows))
    # Python's float() reads 1_0 as 10 and a full-width digit as its digit; a number of a table is a flag's
    for odd in ("1_0", "\uff11"):
        rows = [f"r{i},{odd if i == 3 else i},0,0,a" for i in range(6)]
        raises("'r3' has a non-numeric x, y or z", ts, write_table(tmp_path / "odd.csv", rows))
    rows = [f"r{i},0,0,0,{'' if i == 2 else 'a'}" for i in range(6)]
    raises("'r2' has no network", ts, write_table(tmp_path / "nonet.csv", rows))


def test_cifti_problems(tmp_path):
    x = RNG.normal(size=(10, 12))
    dt = save_dtseries(tmp_path / "a.dtseries.nii", x)
    parc = save_dlabel(tmp_path / "p.dlabel.nii")
    raises("needs a parcellation", dt)
    vol = tmp_path / "vol.dtseries.nii"
    nib.save(nib.Nifti1Image(np.zeros((2, 2, 2, 3), np.float32), np.eye(4)), vol)
    raises("not a CIFTI-2 file", vol, parcellation=parc)
    scalar = tmp_path / "s.dscalar.nii"
    hdr = cifti2.Cifti2Header.from_axes((cifti2.ScalarAxis(["thickness"]), brain_models()))
    img = cifti2.Cifti2Image(np.zeros((1, 12), np.float32), hdr)
    img.nifti_header.set_intent("ConnDenseScalar")
    nib.save(img, scalar)
    raises("ScalarAxis x BrainModelAxis, not a dtseries", scalar, parcellation=parc)
    raises("not a dlabel", dt, parcellation=scalar)
    other = cifti2.BrainModelAxis.from_surface(np.arange(12), nvertex=12, name="CortexLeft")
    raises(r"grayordinates \(cortex_left 8, cortex_right 4\) differ .*\(cortex_left 12\)", dt, parcellation=save_dlabel(tmp_path / "o.dlabel.nii", models=other))
    np.save(tmp_path / "ts.npy", SERIES)
    raises("parcellation applies to CIFTI", tmp_path / "ts.npy", parcellation=parc)
    raises("lacks parcel", dt, write_table(tmp_path / "t.csv", ["A", "B", "C", "E"], "label"), parcellation=parc)


def test_npz_and_h5_selection_problems(tmp_path):
    np.savez(tmp_path / "m.npz", a=SERIES[0], b=SERIES[0, :, :4])
    raises("subject 'b' has 4 regions, others 6", tmp_path / "m.npz")
    raises(r"no array named 'c'", tmp_path / "m.npz", dataset="c")
    with h5py.File(tmp_path / "two.h5", "w") as f:
        f["x"] = SERIES[0]
        f["y"] = SERIES[1]
    raises("cannot tell which of its datasets", tmp_path / "two.h5")
    raises("no dataset 'z'", tmp_path / "two.h5", dataset="z")


@pytest.mark.parametrize("link", ["soft", "hard"])
def test_an_h5_timeseries_that_is_a_link_to_the_data_is_read(link, tmp_path):
    """visititems passes a soft link by and visits an object once, under one of its names: a 'timeseries' link to
    the data was missed, and a decoy dataset trained on in its place."""
    with h5py.File(tmp_path / "linked.h5", "w") as f:
        f["aaa_decoy"] = RNG.normal(size=(3, 50, 7))
        f["real"] = SERIES
        f["timeseries"] = h5py.SoftLink("/real") if link == "soft" else f["real"]
    d = load_user_data(tmp_path / "linked.h5")
    assert len(d.runs) == len(SERIES) and np.array_equal(np.asarray(d.runs[0]), SERIES[0])


def test_integers_float64_rounds_are_refused(tmp_path):
    """int64 data with an offset of 2**60 passed, rounded to steps of 256 in float64: the FC came out 0.05 off."""
    np.save(tmp_path / "offset.npy", np.round(SERIES * 1000).astype(np.int64) + 2**60)
    raises("integers beyond 2\\*\\*53 round in float64", tmp_path / "offset.npy")
    np.save(tmp_path / "exact.npy", np.round(SERIES * 1000).astype(np.int64) + 2**52)  # exact: read as given
    assert np.array_equal(np.asarray(load_user_data(tmp_path / "exact.npy").runs[0]),
                          np.round(SERIES[0] * 1000).astype(np.int64) + 2**52)


def test_a_cifti_run_named_twice_is_refused(tmp_path):
    """Read as two runs of one subject, and with --split run the test run was the training run."""
    run = save_dtseries(tmp_path / "sub1.dtseries.nii", RNG.normal(size=(30, 12)))
    parc = save_dlabel(tmp_path / "atlas.dlabel.nii")
    raises("sub1.dtseries.nii: named twice among the CIFTI runs", [run, tmp_path / "." / "sub1.dtseries.nii"],
           parcellation=parc)


@pytest.mark.parametrize("twice", ["A", "\u00e9"], ids=["one name", "one name in NFC"])
def test_a_parcellation_naming_two_parcels_alike_is_refused(twice, tmp_path):
    """Two parcels of one name were two tokens of one label: a regions table matched both to one row and
    dropped another row without a word, and no table could satisfy the advice."""
    names = dict(NAMES)
    first, second = [key for key in sorted(names) if key][:2]
    names[first] = (twice if twice == "A" else "\u00e9", names[first][1])
    names[second] = (twice if twice == "A" else "e\u0301", names[second][1])
    runs = [save_dtseries(tmp_path / f"sub{i}.dtseries.nii", RNG.normal(size=(30, 12))) for i in range(2)]
    parc = save_dlabel(tmp_path / "dup.dlabel.nii", names=names)
    raises("dup.dlabel.nii: two of its parcels are named", runs, parcellation=parc)


def test_an_h5_whose_links_loop_is_refused(tmp_path):
    """A soft link to itself: h5py's "too many links" RuntimeError, a traceback."""
    with h5py.File(tmp_path / "loop.h5", "w") as f:
        f["raw"] = SERIES
        f["timeseries"] = h5py.SoftLink("/timeseries")
    raises("loop.h5: its links cannot be followed", tmp_path / "loop.h5")


def test_an_h5_with_two_timeseries_is_refused(tmp_path):
    with h5py.File(tmp_path / "two_series.h5", "w") as f:
        f.create_group("g1")["timeseries"] = RNG.normal(size=(3, 50, 7))
        f.create_group("g2")["timeseries"] = SERIES
    raises(r"2 datasets are named 'timeseries' \(g1/timeseries, g2/timeseries\)", tmp_path / "two_series.h5")


def test_correlation_fc_in_small_chunks_equals_numpy_and_zeroes_a_constant_region():
    runs = [RNG.normal(size=(23, 5)) * 50 + 1e4, RNG.normal(size=(41, 5))]
    np.testing.assert_allclose(correlation_fc(runs, chunk_rows=7), pearson_mean(runs), atol=1e-9)
    flat = runs[1].copy()
    flat[:, 2] = 3.0
    fc = correlation_fc([flat], chunk_rows=4)
    assert fc[2, 2] == 1.0 and not fc[2, [0, 1, 3, 4]].any()
