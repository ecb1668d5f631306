"""The registry of pe_attention backends and the choice among them.

A backend is a pair of functions with the signatures of `reference.forward` and `reference.backward`, the
devices it runs on, and the inputs it hands to the reference instead (one logged warning per reason). The
plain-PyTorch reference runs everywhere and is the oracle. The fused backends register themselves when their
module is imported (pe_fast.ops does); which one is the default on a device is PREFERENCE's order, not the order
of the imports.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable

import torch
from torch import Tensor

from pe_fast.ops import reference

log = logging.getLogger("pe_fast")

# BACKENDS keeps this order: the default is the first that runs there
PREFERENCE = ("triton", "cpp", "reference")


def tf32_dots() -> bool:
    """Whether $PE_FAST_TF32 asks the Triton backend for TF32 dots: 1 yes, 0 or unset no; anything else (yes, true)
    a ValueError, not a silent no."""
    value = os.environ.get("PE_FAST_TF32")
    if value not in (None, "0", "1"):
        raise ValueError(f"$PE_FAST_TF32 {value!r}: set it to 1 (TF32 dots in the Triton kernels) or 0, or unset it")
    return value == "1"


@dataclasses.dataclass(frozen=True)
class Backend:
    forward: Callable
    backward: Callable
    devices: tuple[str, ...]  # torch device types it runs on
    # (x, num_heads, bias) -> why these inputs go to the reference instead (a feature or dtype the kernels
    # lack), or None
    reference_reason: Callable | None = None


BACKENDS: dict[str, Backend] = {
    "reference": Backend(reference.forward, reference.backward, ("cpu", "cuda", "meta")),
}


# backends whose kernels did not load (pe_fast._C not built, or $PE_FAST_KERNELS naming no build): name -> the
# devices they would run on and why they are missing, said once where one of them would have been the default
UNAVAILABLE: dict[str, tuple[tuple[str, ...], str]] = {}


def register_unavailable(name: str, devices: tuple[str, ...], why: str) -> None:
    UNAVAILABLE[name] = (devices, why)


@functools.cache
def _warn_unavailable(name: str) -> None:
    log.warning(UNAVAILABLE[name][1])


def register_backend(name: str, backend: Backend) -> None:
    if name not in PREFERENCE:
        raise ValueError(f"backend {name!r} has no place in PREFERENCE {PREFERENCE}")
    BACKENDS[name] = backend
    ordered = {n: BACKENDS[n] for n in PREFERENCE if n in BACKENDS}  # listed in the order of preference
    BACKENDS.clear()
    BACKENDS.update(ordered)


@functools.cache
def _warn_fallback(backend: str, reason: str) -> None:
    log.warning("pe_attention backend '%s' runs the reference instead: %s", backend, reason)


def implementation(backend: str, x: Tensor, num_heads: int, bias: Tensor | None) -> Backend:
    """The backend's functions, or the reference's where the backend cannot take these inputs (one logged
    warning per backend and reason)."""
    chosen = BACKENDS[backend]
    reason = chosen.reference_reason(x, num_heads, bias) if chosen.reference_reason else None
    if reason is None:
        return chosen
    _warn_fallback(backend, reason)
    return BACKENDS["reference"]


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """backend= argument, else the preferred registered backend for the device."""
    if backend is None:
        chosen = next(name for name, b in BACKENDS.items() if device.type in b.devices)
        for name in PREFERENCE[:PREFERENCE.index(chosen)]:  # a faster one would have run here: said on first use
            if name in UNAVAILABLE and device.type in UNAVAILABLE[name][0]:
                _warn_unavailable(name)
        return chosen
    if backend in UNAVAILABLE:
        raise ValueError(f"pe_attention backend {backend!r} is not available: {UNAVAILABLE[backend][1]}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown pe_attention backend {backend!r}; available: {', '.join(BACKENDS)}")
    if device.type not in BACKENDS[backend].devices:
        raise ValueError(f"pe_attention backend {backend!r} does not run on {device.type} tensors")
    return backend
