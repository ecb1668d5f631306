"""Under pytest-xdist (the README's test command runs one worker per core) each worker's torch, and each sweep
a test starts as a process of its own, uses one thread: workers of several threads each would fight for the cores."""
import os

import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the sweeps the tests start as processes of their own
