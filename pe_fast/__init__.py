"""pe_fast: train and analyse packs of small transformers with learnable positional encodings."""
__version__ = "0.1.0"
