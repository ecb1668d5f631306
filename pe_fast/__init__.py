"""pe_fast: train and analyse packs of small transformers with learnable positional encodings."""
import torch  # noqa: F401  first: the C++ extension pe_fast._C links against torch's libraries

__version__ = "0.1.0"


def __getattr__(name: str):
    """pe_fast.load_run(DIR): a results folder as Python objects; imported when first used, so that code using
    the op alone does not load the report."""
    if name == "load_run":
        from pe_fast.results.reading import load_run
        return load_run
    raise AttributeError(f"module 'pe_fast' has no attribute {name!r}")
