"""pe_fast: train and analyse packs of small transformers with learnable positional encodings."""
import torch  # noqa: F401  first: the C++ extension pe_fast._C links against torch's libraries

__version__ = "0.1.0"
