"""The compiled C++ kernels, pe_fast._C, loaded once: the build `pip install` put beside this package or, where
$PE_FAST_KERNELS names one, that file (a _C built for another instruction set: bench/cpu/isa.sh measures an AVX2 machine
on an AVX-512 one with it). Loading it registers torch.ops.pe_fast_cpp.*.

MODULE is the loaded extension or None; ISA the widest vector instructions it was compiled for ("avx512", "avx2",
"baseline") or None; ERROR why it did not load. build_id() names this build of the kernels and ops for torch's compile caches.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import mmap
import os
import pathlib
import sys

NAME = "pe_fast._C"
OP_NAMESPACE = b"pe_fast_cpp"  # the name every build registers its ops under (torch.ops.pe_fast_cpp)
# the build $PE_FAST_KERNELS names, or None for the installed one
REQUESTED = os.environ.get("PE_FAST_KERNELS") or None


def _load():
    path = REQUESTED
    if path is None:
        return importlib.import_module(NAME)
    # only a shared library, through the extension loader: a .py file (or any source) named here is never run
    if not (os.path.isfile(path) and path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))):
        raise ImportError(f"PE_FAST_KERNELS={path!r} is not a compiled pe_fast._C (a file ending in "
                          f"{' or '.join(importlib.machinery.EXTENSION_SUFFIXES)})")
    # loading runs the library's init: another extension named _C (torch's own) would run its init as ours
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            ours = data.find(OP_NAMESPACE) >= 0
    except (OSError, ValueError):  # unreadable, or empty (mmap takes no empty file)
        ours = False
    if not ours:
        raise ImportError(f"PE_FAST_KERNELS={path!r} is not a compiled pe_fast._C (it registers no "
                          f"{OP_NAMESPACE.decode()} ops)")
    loader = importlib.machinery.ExtensionFileLoader(NAME, path)
    spec = importlib.util.spec_from_file_location(NAME, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # a later `import pe_fast._C` finds it instead of loading the installed one too
    sys.modules[NAME] = module
    setattr(sys.modules["pe_fast"], "_C", module)
    return module


try:
    MODULE, ERROR = _load(), None
except ImportError as error:
    MODULE, ERROR = None, error
ISA = getattr(MODULE, "isa", None)


@functools.cache
def build_id() -> str:
    """A digest of the loaded kernels and of the ops' Python (their fake implementations): what torch's on-disk
    compile caches do not key on. A graph compiled against another build of pe_fast's ops, reused, would read
    their outputs with that build's shapes and strides."""
    digest = hashlib.sha256()
    sources = sorted(pathlib.Path(__file__).parent.glob("*.py"))
    for path in sources + ([pathlib.Path(MODULE.__file__)] if MODULE is not None else []):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
