"""What every benchmark here shares: the machine it ran on, timing with a device sync, and writing its result.

The scripts run as `python bench/KIND/NAME.py` with pe_fast installed (or with PYTHONPATH=. from the repository, as
bench/gpu/gpu_check.sh does). Each puts bench/ on the import path first, so that `import measure` and another
script's `from op.bench_ops import ...` resolve from any working folder; the kinds' folders are packages for that.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def device_name(device: torch.device | str) -> str:
    """The GPU's name, or the CPU model."""
    return torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else cpu_name()


def instruction_sets() -> dict:
    """The CPU's vector instructions and those each library was held to (bench/cpu/isa.sh): a figure is the machine's
    only when every library ran the widest the machine has."""
    from pe_fast.ops import extension
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    machine = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "unknown"
    return {"machine": machine, "torch_kernels": torch.backends.cpu.get_cpu_capability().lower(),
            "pe_fast_kernels": extension.ISA, "mkl_enable_instructions": os.environ.get("MKL_ENABLE_INSTRUCTIONS"),
            "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA")}


def instruction_set_line() -> str:
    """One line naming the instruction sets the figures are on, and whether they are the machine's."""
    isa = instruction_sets()
    name = {"avx512": "AVX-512", "avx2": "AVX2"}
    held = isa["torch_kernels"] != isa["machine"] and isa["machine"] != "unknown"
    return (f"instruction sets: machine {name.get(isa['machine'], isa['machine'])}, torch's kernels "
            f"{name.get(isa['torch_kernels'], isa['torch_kernels'])}, pe_fast's C++ kernels "
            f"{name.get(isa['pe_fast_kernels'], isa['pe_fast_kernels'])}" +
            (" (held to AVX2 by bench/cpu/isa.sh: an AVX2 machine emulated)" if held else ""))


def environment(device: torch.device | str) -> dict:
    """The machine and software a result was measured with (GPU clocks and driver through NVML where present)."""
    info = {"device": device_name(device), "cpu": cpu_name(), "logical_cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "load_average_1_5_15": list(os.getloadavg()), "instruction_sets": instruction_sets()}
    if torch.device(device).type != "cuda":
        return info
    info["cuda"] = torch.version.cuda
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        info["nvml"] = {
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "memory_total_bytes": pynvml.nvmlDeviceGetMemoryInfo(h).total,
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "sm_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "mem_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "power_limit_w": pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000,
        }
    except Exception as e:  # nvidia-ml-py missing or no NVML: the timings stand without it
        info["nvml"] = f"unavailable: {e!r}"
    return info


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def seconds(fn, inner: int = 1, device: torch.device | str = "cpu") -> float:
    """Mean seconds of one call over `inner` calls, the device's queued work included (and nothing queued before)."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / inner


def in_turn(functions: dict[str, Callable[[], object]], rounds: int, device: torch.device | str = "cpu",
            inner: dict[str, int] | None = None) -> dict[str, list[float]]:
    """Seconds per call of each function, name -> one time per round. Every function runs once to warm up (first
    calls allocate, a GPU compiles), then each round times them one after the other, so that a slow spell of a
    shared machine hits all of them alike: compare them round by round (per_round), then take the median.
    inner: calls averaged per timing, for a function too quick to time once (default 1)."""
    for fn in functions.values():
        fn()
    times = {name: [] for name in functions}
    for _ in range(rounds):
        for name, fn in functions.items():
            times[name].append(seconds(fn, (inner or {}).get(name, 1), device))
    return times


def per_round(ratio: Callable[..., float], *series: list[float]) -> float:
    """The median over rounds of ratio(a, b, ...) taken within each round, e.g. per_round(operator.truediv,
    slow, fast): a comparison of two timings of one round, unlike a ratio of the two medians."""
    return statistics.median(ratio(*values) for values in zip(*series, strict=True))


def write_result(path: str | os.PathLike, result: dict) -> None:
    """The result as JSON, with the command that produced it and when."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    result = {**result, "command": " ".join(sys.argv), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    path.write_text(json.dumps(result, indent=1, default=str))
