"""Fused operators. `pe_attention` is the one most users want."""
import importlib.util

import pe_fast.ops.cpp_attention  # noqa: F401  registers the "cpp" backend (CPU) when pe_fast._C is built
from pe_fast.ops.backends import BACKENDS
from pe_fast.ops.pe_attention import pe_attention
from pe_fast.ops.reference import STAT_NAMES

if importlib.util.find_spec("triton") is not None:  # registers the "triton" backend (CUDA); optional
    import pe_fast.ops.triton_attention  # noqa: F401
    import pe_fast.ops.fused_attention_sublayer  # noqa: F401  the fused blocks' ops (compute path "fused")
    import pe_fast.ops.fused_mlp_sublayer  # noqa: F401

__all__ = ["BACKENDS", "STAT_NAMES", "pe_attention"]
