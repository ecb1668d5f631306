"""Whether a faster configuration keeps the science. A package, as every kind of bench/ is (measure.py)."""
