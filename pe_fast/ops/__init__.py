"""Fused operators. `pe_attention` is the one most users want."""
from pe_fast.ops.pe_attention import BACKENDS, pe_attention
from pe_fast.ops.reference import STAT_NAMES

__all__ = ["BACKENDS", "STAT_NAMES", "pe_attention"]
