"""The user's own parcellated time series: .npy, .npz, .h5 / .hdf5, or HCP CIFTI plus a parcellation.

`load_user_data(path, regions=None, ...)` reads one of:

* ``.npy``: [subjects, time, regions], or [time, regions] for one subject. Memory-mapped (read-only).
* ``.npz``: one array (read as a .npy), or several arrays, one per subject (named by its key), each
  [time, regions] or [runs, time, regions]. Members stored without compression are memory-mapped;
  compressed members (``np.savez_compressed``) cannot be, and are read into memory.
* ``.h5`` / ``.hdf5``: one dataset laid out as a .npy: the only dataset in the file, else the one
  named ``timeseries``, else the first 3D one (or name it: ``dataset="group/name"``). A contiguous,
  uncompressed dataset is memory-mapped; a chunked or compressed one is read one subject at a time.
* HCP CIFTI-2: ``path="run.dtseries.nii"`` (or a list of them, one run each) with
  ``parcellation="atlas.dlabel.nii"`` on the same grayordinates. Each parcel's series is the mean over
  its grayordinates; parcels and their names come from the dlabel's (first) label map and its label table
  (key 0 = unlabelled; labels without grayordinates are dropped).
  The subject id of each file is its name without ``.dtseries.nii`` (its path when names repeat).

The optional regions table is a CSV with a header and one row per region, in the data's region order:
``label`` (required, unique), ``x,y,z`` (optional, all three or none: centroids in MNI mm) and
``network`` (optional: a name or an integer per region). Other columns are ignored. For CIFTI the
rows are matched to parcels by label, so their order is free. Without a table: the labels are
``region_0``.. (CIFTI: the parcel names), and there are no centroids and no networks.

The ground-truth FC of user data is the correlation of the data themselves (`correlation_fc`: each
run's Pearson correlation, averaged with weights = run lengths).

Every problem the user can fix raises `DataError` with one line naming the file and the fix: a folder or
nothing where a file is expected, an unknown extension, an unreadable file, no subjects, wrong
dimensions, NaN or Inf (found in chunks, so a large memory map is never loaded whole; the message names
the subject, time and region), a region that is constant, a table that misses a column or does not match
the data, centroids that coincide for more than half the pairs of regions
(pe_fast.data.regions.median_centroid_distance), a file that is not CIFTI or not a dense time series, a
parcellation on other grayordinates.
"""

from __future__ import annotations

import csv
import os
import struct
import unicodedata
import zipfile
import zlib
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

import numpy as np

from pe_fast.available_memory import available_bytes
from pe_fast.data.declared_size import elements_read_bytes, inflation, npz_member_read_bytes, stored_bytes
from pe_fast.data.regions import (MAX_ABS_VALUE, MIN_SPREAD, DataError, RegionData, centroids_problem, correlation_fc,
                                  median_centroid_distance)
from pe_fast.number_text import check_ascii_number
from pe_fast.program_exit import control_character, escaped

PathLike = str | os.PathLike

_CHUNK_ELEMENTS = 1 << 22  # values per slice when scanning a run (32 MB of float64)
# What each file the user names must be, for the message that refuses a folder or a missing file
DATA_FILE = "a .npy, .npz, .h5/.hdf5 or .dtseries.nii file"
REGIONS_FILE = "a regions table, a CSV file with the header line label[,x,y,z][,network]"
PARCELLATION_FILE = "a .dlabel.nii parcellation file"


def load_user_data(path: PathLike | Sequence[PathLike], regions: PathLike | None = None, *,
                   parcellation: PathLike | None = None, dataset: str | None = None,
                   tr_seconds: float | None = None) -> RegionData:
    """Read the user's time series (see the module docstring for the formats) and their regions table.

    regions:      CSV regions table (label[, x, y, z][, network]), or None.
    parcellation: the .dlabel.nii for CIFTI input; required for CIFTI, refused otherwise.
    dataset:      which array of an .h5 file (or key of an .npz) to read, when the default is wrong.
    tr_seconds:   the sampling interval; CIFTI files carry their own (this argument overrides it).
    Returns a RegionData of kind "fmri" whose runs may be read-only memory maps in the file's dtype.
    """
    paths = [Path(p) for p in path] if isinstance(path, (list, tuple)) else [Path(path)]
    if not paths:
        raise DataError("no data file given: pass a .npy, .npz, .h5 or .dtseries.nii path")
    for p in paths:
        _check_file(p, DATA_FILE)
    if regions is not None:
        _check_file(Path(regions), REGIONS_FILE)
    cifti = [_is_nifti_name(p) for p in paths]
    if any(cifti):
        if not all(cifti):
            raise DataError(f"{paths[0]}: several files are only read as CIFTI runs: pass .dtseries.nii files only")
        if parcellation is None:
            raise DataError(f"{paths[0]}: CIFTI input needs a parcellation: pass parcellation='atlas.dlabel.nii'")
        _check_file(Path(parcellation), PARCELLATION_FILE)
        resolved = [p.resolve() for p in paths]
        if len(set(resolved)) < len(resolved):  # one run as two: in both the training and the test split
            twice = next(p for p, r in zip(paths, resolved) if resolved.count(r) > 1)
            raise DataError(f"{twice}: named twice among the CIFTI runs: name each run once")
        runs, subjects, run_names, parcel_names, tr = _read_cifti(paths, Path(parcellation))
        fmt = "CIFTI dtseries parcellated by " + Path(parcellation).name
        tr_seconds = tr if tr_seconds is None else tr_seconds
    else:
        if len(paths) > 1:
            raise DataError(f"{paths[0]}: only CIFTI runs come as several files: put all subjects in one file")
        if parcellation is not None:
            raise DataError(f"{paths[0]}: a parcellation applies to CIFTI (.dtseries.nii) input only: drop it")
        runs, subjects, run_names, fmt = _read_array_file(paths[0], dataset)
        parcel_names = None
    where = paths[0] if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} files)"
    _check_runs(runs, subjects, run_names, where)
    n = runs[0].shape[1]
    if regions is None:
        labels = np.array(parcel_names if parcel_names is not None else [f"region_{i}" for i in range(n)])
        centroids, networks, network_names = None, None, None
        table_note = "no regions table"
    else:
        labels, centroids, networks, network_names = _read_regions_table(Path(regions), n, where, parcel_names)
        table_note = f"regions table {Path(regions).name}"
    return RegionData(
        runs=runs, subjects=subjects, run_names=run_names, labels=labels, centroids=centroids,
        networks=networks, network_names=network_names, fc=correlation_fc(runs), coupling=None, kind="fmri",
        source=(f"user data {where} ({fmt}; {len(set(subjects))} subjects, {len(runs)} runs); {table_note}; "
                f"FC = correlation of the data (mean over runs)"),
        tr_seconds=tr_seconds,
    )


# ------------------------------------------------------------------ arrays: .npy / .npz / .h5

def _check_file(p: Path, expected: str):
    """A path the user gave as a file: a folder or nothing there is refused, saying what was expected."""
    if p.is_dir():
        raise DataError(f"{p}: a folder, not a file: give {expected}")
    if not p.is_file():
        what = "not a regular file (a pipe, device or socket)" if p.exists() else "no such file"
        raise DataError(f"{p}: {what}: check the path (expected {expected})")


def _is_nifti_name(p: Path) -> bool:
    return p.name.lower().endswith((".nii", ".nii.gz"))


def _read_array_file(p: Path, dataset: str | None):
    ext = p.suffix.lower()
    if ext == ".npy":
        with open(p, "rb") as f:
            if f.read(6) != b"\x93NUMPY":
                raise DataError(f"{p}: not a .npy file (no NumPy header): save it with numpy.save")
        try:
            arr = np.load(p, mmap_mode="r")
        except Exception as e:
            raise DataError(f"{p}: not a readable .npy file ({_why(e)}): save it with numpy.save") from None
        # a sparse file's holes: GBs of zeros scanned from a few kB
        _check_declared(p, elements_read_bytes(arr.shape, arr.dtype))
        return (*_split_subjects(arr, p), "npy, memory-mapped")
    if ext == ".npz":
        return _read_npz(p, dataset)
    if ext in (".h5", ".hdf5"):
        return _read_h5(p, dataset)
    raise DataError(f"{p}: unknown file type {p.suffix!r}: use .npy, .npz, .h5/.hdf5, or .dtseries.nii "
                    f"with a .dlabel.nii parcellation")


def _check_declared(p: Path, declared: int):
    problem = inflation(p, declared, stored_bytes(p), "a time series file (measured values compress little)")
    if problem is not None:
        raise DataError(problem)


def _why(e: Exception) -> str:
    return str(e).splitlines()[0][:120] if str(e) else type(e).__name__


def _split_subjects(arr, p: Path, what: str = "array"):
    """[subjects, time, regions] or [time, regions] → runs, subject ids, run names."""
    _check_dtype(arr, p)
    if arr.ndim == 3:
        return [arr[i] for i in range(arr.shape[0])], [f"subject{i}" for i in range(arr.shape[0])], \
            ["run0"] * arr.shape[0]
    if arr.ndim == 2:
        return [arr], ["subject0"], ["run0"]
    raise DataError(f"{p}: the {what} has shape {tuple(arr.shape)}, {arr.ndim} dimensions: "
                    f"need [subjects, time, regions] or [time, regions]")


def _check_dtype(arr, p: Path):
    if np.dtype(arr.dtype).kind not in "fiu":
        raise DataError(f"{p}: values of type {arr.dtype} are not real numbers: save float32 or float64 values")
    if np.dtype(arr.dtype).itemsize > 8:  # long double: its checks would see variation float64 then flattens
        raise DataError(f"{p}: values of type {arr.dtype}, wider than float64, in which the task computes: save "
                        f"float32 or float64 values")


def _check_crc(p: Path, f, info: zipfile.ZipInfo, start: int):
    """A stored member's bytes against its CRC-32, which a memory map skips (numpy.load refuses a damaged one)."""
    f.seek(start)
    crc, left = 0, info.file_size
    while left > 0:
        chunk = f.read(min(left, 1 << 24))
        if not chunk:
            break
        crc, left = zlib.crc32(chunk, crc), left - len(chunk)
    if left or crc != info.CRC:
        raise DataError(f"{p}: member {info.filename} does not match its checksum (CRC-32): the file is damaged; "
                        f"save it again with numpy.savez")


def _npz_member(p: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo):
    """A memory map of an uncompressed .npz member, or the array read into memory."""
    if info.compress_type != zipfile.ZIP_STORED:
        with zf.open(info) as f:
            array = np.lib.format.read_array(f, allow_pickle=False)
            f.read()  # to the end, where zipfile checks the member's CRC: a damaged member raises
            return array
    with open(p, "rb") as f:
        # The member's bytes start after its local header: 30 fixed bytes, the name and an extra field. Checked
        # as zipfile.open checks them: a second directory entry pointing at another member's bytes read that
        # member twice, as two subjects
        f.seek(info.header_offset)
        header = f.read(30)
        name_len, extra_len = struct.unpack("<HH", header[26:30])
        if header[:4] != b"PK\x03\x04" or f.read(name_len) != info.orig_filename.encode("utf-8" if info.flag_bits
                                                                                        & 0x800 else "cp437"):
            raise DataError(f"{p}: member {info.filename}'s directory entry points at other bytes than its own: the "
                            f"file is damaged; save it again with numpy.savez")
        _check_crc(p, f, info, info.header_offset + 30 + name_len + extra_len)
        f.seek(info.header_offset + 30 + name_len + extra_len)
        major, _ = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        offset = f.tell()
        data_end = info.header_offset + 30 + name_len + extra_len + info.file_size
    if dtype.hasobject:
        raise DataError(f"{p}: member {info.filename} holds Python objects: save numeric arrays")
    if offset + int(np.prod(shape)) * dtype.itemsize > data_end:  # a memory map would read the next member's bytes
        raise DataError(f"{p}: member {info.filename} declares shape {tuple(shape)}, more than the member holds: "
                        f"the file is damaged; save it again with numpy.savez")
    if int(np.prod(shape)) == 0:
        return np.zeros(shape, dtype)
    return np.memmap(p, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")


def _read_npz(p: Path, key: str | None):
    try:
        zf = zipfile.ZipFile(p)
        infos = zf.infolist()
    except Exception as e:
        raise DataError(f"{p}: not a readable .npz file ({_why(e)}): save it with numpy.savez") from None
    with zf:
        # every member one array of its own name, as numpy.savez writes them: a name twice (the zip keeps both,
        # a dict the last) or a member without .npy (numpy reads it too) dropped a subject without a word
        names = [i.filename for i in infos]
        if odd := [name for name in names if not name.endswith(".npy")]:
            raise DataError(f"{p}: its member {odd[0]!r} is not a .npy array; save the time series with numpy.savez")
        # an encrypted member's stored bytes are its cipher text, which the memory map below would read as values
        if encrypted := [i.filename for i in infos if i.flag_bits & 0x1]:
            raise DataError(f"{p}: its member {encrypted[0]!r} is encrypted; save the time series with numpy.savez, "
                            f"without a password")
        names = [unicodedata.normalize("NFC", name) for name in names]  # 'sé' however it was typed: one subject
        if len(set(names)) < len(names):
            twice = next(name for name in names if names.count(name) > 1)
            raise DataError(f"{p}: it holds two arrays named {twice[:-4]!r}; save the time series with numpy.savez")
        # each member's bytes its own: a directory entry whose span covers the next member's header and data read
        # that member's bytes as this one's values
        spans = sorted((i.header_offset, i.header_offset + 30 + len(i.orig_filename.encode("utf-8")) + i.compress_size,
                        i.filename) for i in infos)
        for (_, end, name), (start, _, following) in zip(spans, spans[1:]):
            if start < end:
                raise DataError(f"{p}: members {name} and {following} overlap in the file: the file is damaged; "
                                f"save it again with numpy.savez")
        members = {i.filename[:-4]: i for i in infos}
        if key is not None:
            if key not in members:
                raise DataError(f"{p}: no array named {key!r} (it has {sorted(members)}): pass one of those names")
            members = {key: members[key]}
        if not members:
            raise DataError(f"{p}: the .npz file holds no arrays: save the time series with numpy.savez")
        # a compressed member is read whole into memory: a few MB may inflate to GBs
        _check_declared(p, sum(npz_member_read_bytes(zf, i) for i in members.values()))
        try:
            arrays = {k: _npz_member(p, zf, i) for k, i in members.items()}
        except DataError:
            raise
        except Exception as e:
            raise DataError(f"{p}: cannot read its arrays ({_why(e)}): save them with numpy.savez") from None
    compressed = any(i.compress_type != zipfile.ZIP_STORED for i in members.values())
    fmt = "npz, " + ("compressed, read into memory" if compressed else "memory-mapped")
    if len(arrays) == 1:
        (name, arr), = arrays.items()
        return (*_split_subjects(arr, p, f"array {name!r}"), fmt)
    runs, subjects, run_names = [], [], []
    for name, arr in arrays.items():
        _check_dtype(arr, p)
        if arr.ndim == 2:
            subject_runs = [arr]
        elif arr.ndim == 3:
            subject_runs = [arr[i] for i in range(arr.shape[0])]
        else:
            raise DataError(f"{p}: subject array {name!r} has shape {arr.shape}: "
                            f"each subject needs [time, regions] or [runs, time, regions]")
        runs += subject_runs
        subjects += [name] * len(subject_runs)
        run_names += [f"run{i}" for i in range(len(subject_runs))]
    return runs, subjects, run_names, fmt + f", {len(arrays)} subject arrays"


def _read_h5(p: Path, name: str | None):
    import h5py

    try:
        f = h5py.File(p, "r")
    except Exception as e:
        raise DataError(f"{p}: not a readable HDF5 file ({_why(e)}): check the file or save it with h5py") from None
    with f:
        # an external link names another file: its data are not this file's (and visititems passes it by)
        links = []
        f.visititems_links(lambda key, link: links.append((key, link))
                           if isinstance(link, h5py.ExternalLink) else None)
        if links:
            key, link = links[0]
            raise DataError(f"{p}: {key!r} is an external link to {link.filename}:{link.path}, data of another file: "
                            f"save the time series in the file itself")
        # every name a dataset is reached by, soft and hard links within the file included: visititems passes a
        # soft link by and an object once under one of its names, so a 'timeseries' link to the data was missed
        # and another dataset read in its place
        names = []
        f.visititems_links(lambda key, link: names.append(key))
        try:
            reached = {key: f.get(key) for key in names}
        except (RuntimeError, KeyError) as e:  # a soft link that leads to itself: "too many links"
            raise DataError(f"{p}: its links cannot be followed ({_why(e)}): save the time series without "
                            f"looping links") from None
        # a soft link that leads nowhere: the dataset it names is not there, and another was read in its place
        for key in (key for key, obj in reached.items() if obj is None):
            if key == name or (name is None and key.split("/")[-1] == "timeseries"):
                raise DataError(f"{p}: {key!r} is a link that leads to nothing in the file (it names "
                                f"{f.get(key, getlink=True).path!r}): save the time series under that name")
        found = {key: obj for key, obj in reached.items() if isinstance(obj, h5py.Dataset)}
        distinct = {obj.id: key for key, obj in reversed(found.items())}  # each dataset by its first name
        series = {found[key].id: key for key in reversed(found) if key.split("/")[-1] == "timeseries"}
        if name is not None:
            if name not in found:
                raise DataError(f"{p}: no dataset {name!r} (it has {list(found)[:10]}): pass one of those names")
        elif len(distinct) == 1:
            name = next(iter(distinct.values()))
        elif len(series) > 1:
            raise DataError(f"{p}: {len(series)} datasets are named 'timeseries' ({', '.join(sorted(series.values()))}"
                            f"): cannot tell which holds the time series; keep one of them")
        elif series:
            name = next(iter(series.values()))
        else:
            name = min((key for key in distinct.values() if found[key].ndim == 3), default=None)
            if name is None:
                raise DataError(f"{p}: cannot tell which of its datasets {list(found)[:10]} holds the time series: "
                                f"name it 'timeseries'")
        ds = f[name]
        # data from outside the file named would be read: an external raw file, or a virtual dataset's sources
        if ds.is_virtual:
            raise DataError(f"{p}: dataset {name!r} is a virtual dataset, mapping data of other files: save its data "
                            f"in the file itself")
        if ds.external:
            raise DataError(f"{p}: dataset {name!r} keeps its data in an external file ({ds.external[0][0]}): save "
                            f"its data in the file itself")
        if ds.shape is None:  # a null dataspace (h5py.Empty): no array at all
            raise DataError(f"{p}: dataset {name!r} is empty (a null dataspace): save the time series in it")
        if (categories := h5py.check_enum_dtype(ds.dtype)) is not None:  # integers naming categories, not values
            raise DataError(f"{p}: dataset {name!r} holds an HDF5 enum (categories {sorted(categories)[:4]}), not "
                            f"numbers: save float32 or float64 values")
        stored_as = ds.id.get_type().get_class()
        if stored_as not in (h5py.h5t.INTEGER, h5py.h5t.FLOAT):  # a bitfield, say, reads as numpy's unsigned ints
            kind = {h5py.h5t.BITFIELD: "bitfield", h5py.h5t.OPAQUE: "opaque bytes"}.get(stored_as, "non-number")
            raise DataError(f"{p}: dataset {name!r} holds HDF5 {kind} values, not numbers: save float32 or float64 "
                            f"values")
        _check_dtype(ds, p)
        declared = elements_read_bytes(ds.shape, ds.dtype)
        if declared > (free := available_bytes()):
            raise DataError(f"{p}: dataset {name!r} declares shape {ds.shape} ({declared / 2**30:.0f} GiB once "
                            f"read), more than the memory free now ({free / 2**30:.0f} GiB)")
        _check_declared(p, declared)  # chunks never written read as the fill value: GBs from a few kB
        offset = ds.id.get_offset()
        # its bytes are numpy's dtype only where the file's type is that dtype's own: an integer of 12 bits at
        # an offset of 4 (HDF5 allows it) read raw came out 16 times its value, with the padding's bits in it
        if ds.chunks is None and ds.compression is None and offset is not None and ds.size > 0 \
                and ds.id.get_type().equal(h5py.h5t.py_create(ds.dtype)):
            arr = np.memmap(p, dtype=ds.dtype, mode="r", offset=offset, shape=ds.shape)
            fmt = f"HDF5 dataset {name!r}, memory-mapped"
        else:
            if ds.ndim not in (2, 3):
                _split_subjects(ds, p, f"dataset {name!r}")  # raises the dimension error
            # Chunked or compressed: read whole in its own dtype, so that its values are checked as a contiguous
            # dataset's are (no subjects: an empty array, which _check_runs refuses, naming the file).
            try:
                arr = ds[()]
            except Exception as e:  # a damaged chunk, a filter whose plugin is not installed
                raise DataError(f"{p}: cannot read dataset {name!r} ({_why(e)}): check the file, or save it again "
                                f"without compression or with gzip") from None
            fmt = f"HDF5 dataset {name!r}, chunked, read into memory"
        return (*_split_subjects(arr, p, f"dataset {name!r}"), fmt)


# ------------------------------------------------------------------ CIFTI

def _load_cifti(p: Path, want: str):
    import nibabel as nib
    from nibabel import cifti2

    try:
        img = nib.load(p)
    except Exception as e:
        raise DataError(f"{p}: not a readable NIfTI/CIFTI file ({_why(e)}): check the file") from None
    if not isinstance(img, cifti2.Cifti2Image):
        raise DataError(f"{p}: not a CIFTI-2 file (a plain NIfTI volume?): pass an HCP .{want}.nii file")
    axes = [img.header.get_axis(i) for i in range(img.ndim)]
    first = cifti2.SeriesAxis if want == "dtseries" else cifti2.LabelAxis
    if img.ndim != 2 or not isinstance(axes[0], first) or not isinstance(axes[1], cifti2.BrainModelAxis):
        kinds = " x ".join(type(a).__name__ for a in axes)
        raise DataError(f"{p}: a CIFTI file of axes {kinds}, not a {want} (time/labels x grayordinates): "
                        f"pass a .{want}.nii file")
    return img, axes


def _read_parcels(parcellation: Path):
    """(codes [grayordinates], keys, names, brain models): the dlabel's first label map; the parcels are its keys
    that label at least one grayordinate, in key order (token k is keys[k])."""
    lab_img, (label_axis, lab_models) = _load_cifti(parcellation, "dlabel")
    codes = np.asarray(lab_img.dataobj[0]).astype(np.int64)
    table = label_axis.label[0]
    keys = [k for k in sorted(table) if k != 0 and (codes == k).any()]
    if not keys:
        raise DataError(f"{parcellation}: the parcellation labels no grayordinate: pass a .dlabel.nii with parcels")
    names = [str(table[k][0]) for k in keys]
    # the tokens' labels, and the names a regions table is matched by: one "é" however it was typed
    normal = [unicodedata.normalize("NFC", name) for name in names]
    if len(set(normal)) < len(normal):
        twice = next(name for name in normal if normal.count(name) > 1)
        raise DataError(f"{parcellation}: two of its parcels are named {twice!r}: give every parcel its own name")
    return codes, keys, names, lab_models


CORTEX_STRUCTURES = ("CIFTI_STRUCTURE_CORTEX_LEFT", "CIFTI_STRUCTURE_CORTEX_RIGHT")


def cifti_surface_regions(parcellation: PathLike, vertices_per_hemisphere: int) -> np.ndarray:
    """[2 × vertices]: each cortical mesh vertex's parcel as a token number (k + 1 for token k, as load_user_data
    orders them; left hemisphere first), 0 where no parcel (the medial wall, or vertices the file omits)."""
    parcellation = Path(parcellation)
    codes, keys, _, models = _read_parcels(parcellation)
    token = np.zeros(max(int(codes.max()), max(keys)) + 1, np.int64)  # codes outside the label table: 0
    token[keys] = np.arange(1, len(keys) + 1)
    regions = np.zeros(2 * vertices_per_hemisphere, np.int64)
    painted = False
    for name, part, model in models.iter_structures():
        if name not in CORTEX_STRUCTURES:
            continue
        if model.nvertices[name] != vertices_per_hemisphere:
            raise DataError(f"{parcellation}: its {name[len('CIFTI_STRUCTURE_'):].lower()} is a mesh of "
                            f"{model.nvertices[name]:,} vertices, not fsLR-32k's {vertices_per_hemisphere:,}: "
                            f"no surface here to draw it on")
        offset = CORTEX_STRUCTURES.index(name) * vertices_per_hemisphere
        regions[offset + model.vertex] = token[np.clip(codes[part], 0, None)]
        painted = True
    if not painted:
        raise DataError(f"{parcellation}: no cortical surface grayordinates (CortexLeft/CortexRight): "
                        f"nothing to draw on a surface")
    return regions


def _read_cifti(paths: list[Path], parcellation: Path):
    from scipy import sparse

    codes, keys, names, lab_models = _read_parcels(parcellation)
    column = {k: j for j, k in enumerate(keys)}
    rows = np.flatnonzero(np.isin(codes, keys))
    cols = np.array([column[c] for c in codes[rows]])
    counts = np.bincount(cols, minlength=len(keys))
    # Parcel means as one sparse product: W[g, p] = 1/|p| for each grayordinate g in parcel p.
    weights = sparse.csr_matrix((1.0 / counts[cols], (rows, cols)), shape=(len(codes), len(keys)))
    stems = [p.name[: -len(".dtseries.nii")] if p.name.lower().endswith(".dtseries.nii") else p.stem for p in paths]
    subjects = stems if len(set(stems)) == len(stems) else [str(p) for p in paths]
    runs, tr = [], None
    for p in paths:
        img, (series, models) = _load_cifti(p, "dtseries")
        if models != lab_models:
            raise DataError(f"{p}: its grayordinates ({_describe(models)}) differ from those of {parcellation} "
                            f"({_describe(lab_models)}): use a parcellation on the same grayordinates")
        t = img.shape[0]
        out = np.empty((t, len(keys)), np.float32)
        step = max(1, _CHUNK_ELEMENTS // img.shape[1])
        for a in range(0, t, step):
            out[a:a + step] = (weights.T @ np.asarray(img.dataobj[a:a + step], np.float64).T).T
        runs.append(out)
        if series.unit == "SECOND":
            tr = float(series.step)
    return runs, subjects, ["run0"] * len(paths), names, tr


def _describe(models) -> str:
    parts = [f"{name.replace('CIFTI_STRUCTURE_', '').lower()} {len(part)}" for name, _, part in models.iter_structures()]
    return ", ".join(parts[:4]) + (f", +{len(parts) - 4} structures" if len(parts) > 4 else "")


# ------------------------------------------------------------------ checks and the regions table

EXACT_INTEGER = 2**53  # the largest integers float64 holds exactly


def _check_runs(runs: list, subjects: list[str], run_names: list[str], where):
    if not runs:
        raise DataError(f"{where}: the file holds no subjects (a first axis of length 0): save the time series")
    n = runs[0].shape[1]
    for r, s, name in zip(runs, subjects, run_names):
        if r.shape[1] != n:
            raise DataError(f"{where}: subject {s!r} has {r.shape[1]} regions, others {n}: "
                            f"give every subject the same regions")
        if r.shape[0] < 2 or n < 2:
            raise DataError(f"{where}: subject {s!r} has shape {r.shape} (time x regions): "
                            f"need at least 2 time points and 2 regions; check the axis order")
    for r, s, name in zip(runs, subjects, run_names):
        lo, hi = np.full(n, np.inf), np.full(n, -np.inf)
        step = max(1, _CHUNK_ELEMENTS // n)
        for a in range(0, r.shape[0], step):
            x = np.asarray(r[a:a + step])
            bad = ~np.isfinite(x)
            if bad.any():
                t, k = np.argwhere(bad)[0]
                raise DataError(f"{where}: {x[t, k]} at subject {s!r} {name}, time {a + t}, region {k}: "
                                f"remove or interpolate the non-finite values")
            if x.dtype.kind in "iu" and ((x > EXACT_INTEGER) | (x < -EXACT_INTEGER)).any():
                t, k = np.argwhere((x > EXACT_INTEGER) | (x < -EXACT_INTEGER))[0]
                raise DataError(f"{where}: {x[t, k]} at subject {s!r} {name}, time {a + t}, region {k}: integers "
                                f"beyond 2**53 round in float64, in which the task computes (there to steps of "
                                f"{np.spacing(abs(float(x[t, k]))):g}); subtract the offset or save float64 values")
            huge = np.abs(x) > np.float64(MAX_ABS_VALUE)  # a Python float would be cast to float32's inf, warning
            if huge.any():
                t, k = np.argwhere(huge)[0]
                raise DataError(f"{where}: {x[t, k]:g} at subject {s!r} {name}, time {a + t}, region {k}: "
                                f"values beyond ±{MAX_ABS_VALUE:g} overflow the correlations; rescale the series")
            lo, hi = np.minimum(lo, x.min(0)), np.maximum(hi, x.max(0))
        faint = np.flatnonzero((hi > lo) & (hi - lo < MIN_SPREAD))
        if faint.size:
            k = faint[0]
            raise DataError(f"{where}: region {k} of subject {s!r} {name} varies by only {hi[k] - lo[k]:.3g}, below "
                            f"{MIN_SPREAD:g}, where its squares underflow the correlations; rescale the series")
        flat = np.flatnonzero(lo == hi)
        if flat.size:
            raise DataError(f"{where}: region {flat[0]} is constant in subject {s!r} {name} "
                            f"({flat.size} constant regions): drop those regions or that run")


def _read_regions_table(p: Path, n: int, where, parcel_names: list[str] | None):
    try:
        # utf-8-sig: Excel's "CSV UTF-8" starts with a byte-order mark, which would hide the first column's name
        with open(p, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            columns = [c.strip().lower() for c in (reader.fieldnames or [])]
            rows = []
            for row in reader:
                if None in row:  # fields beyond the header's, which DictReader files under None: which were meant?
                    fields = len(columns) + len(row[None])
                    raise DataError(f"{p}:{reader.line_num}: the regions table's row holds {fields} fields, its "
                                    f"header {len(columns)}: give one field per column")
                rows.append({k.strip().lower(): (v or "").strip() for k, v in row.items()})
    except UnicodeDecodeError as e:  # UTF-16 (Excel's "Unicode text"), Latin-1: the advice is the encoding
        raise DataError(f"{p}: the regions table is not UTF-8 text ({_why(e)}): save it as CSV UTF-8") from None
    except (OSError, csv.Error) as e:
        raise DataError(f"{p}: cannot read the regions table ({_why(e)}): give a CSV with a header line") from None
    repeated = next((c for c in columns if columns.count(c) > 1), None)
    if repeated is not None:  # a second column of the name would silently replace the first
        raise DataError(f"{p}: the regions table's header names column {repeated!r} twice (letter case aside): "
                        f"give each column once")
    if "label" not in columns:
        # its header unquoted: a file a results folder names may be anyone's (a secret's first line)
        if any("\x00" in column for column in columns):  # UTF-16 without its byte-order mark reads as UTF-8
            raise DataError(f"{p}: the regions table is not UTF-8 text (its header holds NUL bytes: UTF-16?): save "
                            f"it as CSV UTF-8")
        if len(columns) == 1 and any(mark in columns[0] for mark in ";\t|"):  # one column: not comma-separated
            raise DataError(f"{p}: the regions table's header line is one column holding semicolons, tabs or bars: "
                            f"separate its columns with commas")
        raise DataError(f"{p}: the regions table has no 'label' column in its header line ({len(columns)} "
                        f"columns): add a header line label[,x,y,z][,network]")
    xyz = [c for c in "xyz" if c in columns]
    if xyz and len(xyz) != 3:
        raise DataError(f"{p}: the regions table has column(s) {xyz} but not all of x, y, z: give all three or none")
    if len(rows) != n:
        raise DataError(f"{p}: the regions table has {len(rows)} rows but {where} has {n} regions: "
                        f"give one row per region")
    labels = [unicodedata.normalize("NFC", r["label"]) for r in rows]  # one "é", however it was typed
    # a zero-width space made "2" and "2\u200b" two networks that print alike; a line break split a label's line
    for column in ("label", "network") if "network" in columns else ("label",):
        if odd := next((r[column] for r in rows if control_character(r[column])), None):
            raise DataError(f"{p}: {column} {escaped(odd)!r} holds a control or invisible character "
                            f"({escaped(control_character(odd))}): write it without")
    if len(set(labels)) != n or "" in labels:
        dup = next(l for l in labels if labels.count(l) > 1 or l == "")
        raise DataError(f"{p}: region label {dup!r} is empty or repeated: give every region its own label")
    if parcel_names is not None:
        # CIFTI: match the table to the dlabel's parcels by name.
        parcel_names = [unicodedata.normalize("NFC", name) for name in parcel_names]
        missing = [name for name in parcel_names if name not in set(labels)]
        if missing:
            raise DataError(f"{p}: the regions table lacks parcel(s) {missing[:3]} of the parcellation: "
                            f"use the dlabel's parcel names as labels")
        position = {l: i for i, l in enumerate(labels)}
        rows = [rows[position[name]] for name in parcel_names]
        labels = list(parcel_names)
    centroids = None
    if xyz:
        bad = next((r["label"] for r in rows if not all(_is_float(r[c]) for c in "xyz")), None)
        if bad is not None:
            raise DataError(f"{p}: region {bad!r} has a non-numeric x, y or z: give coordinates in mm")
        centroids = np.array([[float(r[c]) for c in "xyz"] for r in rows])
        if (problem := centroids_problem(centroids, coinciding=False)) is not None:  # coinciding: named below
            raise DataError(f"{p}: the x, y, z columns {problem}: give coordinates in mm")
    networks, network_names = None, None
    if "network" in columns:
        values = [unicodedata.normalize("NFC", r["network"]) for r in rows]  # one "é", however it was typed
        missing = next((i for i, v in enumerate(values) if _names_no_network(v)), None)
        if missing is not None:
            raise DataError(f"{p}: region {labels[missing]!r} has no network (its cell {values[missing]!r}): fill in "
                            f"every network cell")
        spelled: dict[Decimal, str] = {}
        # "1" and "1.0" (or "+1", "01"): one network or two? Compared as the numbers written, not as floats, in
        # which 2**53 and 2**53 + 1 are one
        for value in dict.fromkeys(values):
            if _is_float(value) and (first := spelled.setdefault(Decimal(value.strip()), value)) != value:
                raise DataError(f"{p}: network cells {first!r} and {value!r} write one number two ways: write each "
                                f"network one way")
        if all(_is_int(v) for v in values):
            ids = sorted({int(v) for v in values})
            network_names = [str(i) for i in ids]
            networks = np.array([ids.index(int(v)) for v in values])
        else:
            network_names = list(dict.fromkeys(values))  # in order of first appearance
            networks = np.array([network_names.index(v) for v in values])
    if centroids is not None and median_centroid_distance(centroids) == 0:
        _refuse_coinciding(p, labels, centroids)
    # the network measures compare regions within a network with regions across networks: with one network, or
    # one region each, there is nothing to compare (segregation NaN, the same-network probe all or none)
    if network_names is not None and (len(network_names) < 2 or len(network_names) == len(labels)):
        what = "every region in one network" if len(network_names) < 2 else "each region in a network of its own"
        raise DataError(f"{p}: its network column puts {what}: the network measures need two or more networks of "
                        f"two or more regions; fill in the networks, or leave the column out")
    return np.array(labels), centroids, networks, network_names


def _refuse_coinciding(p: Path, labels: list[str], centroids: np.ndarray):
    """More than half the region pairs on one point each: name the largest group of regions that share one."""
    points, group, counts = np.unique(centroids, axis=0, return_inverse=True, return_counts=True)
    largest = int(counts.argmax())
    shared = [labels[i] for i in np.flatnonzero(group.ravel() == largest)]
    names = ", ".join(map(repr, shared[:3])) + (f" and {len(shared) - 3} more" if len(shared) > 3 else "")
    x, y, z = points[largest]
    raise DataError(f"{p}: regions {names} share the centroid ({x:g}, {y:g}, {z:g}), so over half the region pairs "
                    f"are 0 mm apart and the median distance, the scale of the 3D measures, is 0: give the regions "
                    f"distinct x, y, z")


def _names_no_network(cell: str) -> bool:
    """A blank network cell, or NaN however spelled ("nan", "NaN": how numpy and some exporters write a missing
    value): no network, not one (or, spelled two ways, two) named NaN."""
    return cell.strip() == "" or (_is_float(cell) and bool(np.isnan(float(cell))))


def _is_float(s: str) -> bool:
    try:
        check_ascii_number(s)  # a table's number as a flag's: "1_0" is no 10
        float(s)
        return True
    except ValueError:
        return False


def _is_int(s: str) -> bool:
    try:
        check_ascii_number(s)
        int(s)
        return True
    except ValueError:
        return False
