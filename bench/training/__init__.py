"""Benchmarks of training and the sweep's step. A package: scripts import these as training.NAME (measure.py)."""
