"""What the machine offers, probed: CUDA, the packages and tools the executors and --tensorboard need (Ray,
submitit, sbatch, TensorBoard), a Ray cluster's address. The one module of the sweep's settings with side effects
(a socket, a PATH search, package look-ups); validation.validate calls resolve() once, after the rules that need
none of them."""
from __future__ import annotations

import importlib.util
import shutil
import socket

import torch

from pe_fast import precision
from pe_fast.sweep import UsageError
from pe_fast.train import compile_problem

RAY_CONNECT_TIMEOUT_S = 10


def check_ray_address(address: str | None):
    """A host:port that does not answer is one line within seconds (ray.init would retry it for ever)."""
    if not address or address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--ray-address {address!r}: expected auto or HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as error:
        raise UsageError(f"--ray-address {address}: no Ray cluster answers there ({error.strerror or error}); "
                         f"start one with ray start --head, or use --ray-address auto")


def resolve(s: dict):
    """The settings that depend on the machine (the device, compilation, the precision) resolved, and every
    setting checked against what the machine offers: CUDA, the packages and tools an executor needs, a Ray
    cluster's address. validate() calls it once, after every rule that needs no probing."""
    if s["device"] == "auto":
        s["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    elsewhere = s["executor"] in ("ray", "slurm")
    if s["device"] == "cuda" and not torch.cuda.is_available() and not elsewhere:  # a cluster may have GPUs
        raise UsageError(f"--device {s['device']!r} is not available here "
                         f"(cpu{', cuda' if torch.cuda.is_available() else ''})")
    if s["compile"] == "auto":  # measured: bench/results/h100-20261126-sweep (1.1-1.3× on an H100)
        s["compile"] = "on" if s["device"] == "cuda" else "off"
    if (why := compile_problem(s["compile"], torch.device(s["device"]))) is not None:
        raise UsageError(f"--compile {s['compile']}: {why}")
    if s.get("precision") is None:
        s["precision"] = precision.default(torch.device(s["device"]))
    if (why := precision.problem(s["precision"], torch.device(s["device"]))) is not None:
        raise UsageError(f"--precision {s['precision']}: {why}")
    check_ray_address(s["ray_address"])
    check_slurm_tools(s)
    on_ray = s["executor"] == "ray"
    if s.get("tensorboard") and importlib.util.find_spec("tensorboard") is None:
        raise UsageError("--tensorboard needs TensorBoard, which is not installed: pip install 'pe_fast[tensorboard]' "
                         "(or pip install tensorboard)")
    if s["executor"] == "slurm" and s["device"] == "cuda" and s.get("slurm_gpus") == 0:
        raise UsageError("--slurm-gpus 0 with --device cuda: the jobs would have no GPU")
    if on_ray and importlib.util.find_spec("ray") is None:
        raise UsageError("--executor ray needs Ray, which is not installed: pip install 'pe_fast[ray]' "
                         "(or pip install 'ray>=2.9')")


def check_slurm_tools(s: dict):
    """--executor slurm needs submitit and, unless --slurm-local, sbatch and srun on the PATH."""
    if s["executor"] != "slurm":
        return
    if importlib.util.find_spec("submitit") is None:
        raise UsageError("--executor slurm needs submitit, which is not installed: pip install 'pe_fast[slurm]' "
                         "(or pip install submitit)")
    missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]
    if not s.get("slurm_local") and missing:
        raise UsageError(f"--executor slurm: no SLURM here ({' and '.join(missing)} not on the PATH); run it on the "
                         f"cluster's login node, or add --slurm-local to try the jobs with submitit's local executor")
