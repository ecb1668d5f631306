"""Metrics of learned PEs and attention maps against the task's ground truth."""
