"""Benchmarks of the fused op (pe_attention). A package: other scripts import these as op.NAME (measure.py)."""
