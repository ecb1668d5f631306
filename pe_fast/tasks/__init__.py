"""Tasks: puzzle data sets, their encodings and the probes used to read positional structure."""
