"""Stacked transformers and their positional encodings."""
from pe_fast.models.transformer import PE_KINDS, ModelConfig, StackedTransformer

__all__ = ["PE_KINDS", "ModelConfig", "StackedTransformer"]
