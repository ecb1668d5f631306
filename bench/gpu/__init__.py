"""The scripts of a GPU machine and its preparation. A package, as every kind of bench/ is (measure.py)."""
