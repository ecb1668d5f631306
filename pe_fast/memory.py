"""How many models fit in one pack: an estimate of the bytes one model needs while it trains, and the memory
free on the device.

The estimate counts, per model (float32):
  * the weights, their gradients and the optimizer's state (Adam: 2 tensors per weight; SGD with momentum: 1);
  * the activations saved for the backward pass, per block: about 14 tensors of [B, N, width] (embedding
    input, PE sum, q/k/v, attention output, projections, the LayerNorms' inputs and outputs) and 2 of
    [B, N, mlp_width] (the MLP's hidden layer before and after GELU), plus the log-sum-exp [B, H, N];
  * the attention map of one block while it is computed: the reference backend materialises [B, H, N, N] about
    five times (logits, log-probabilities, probabilities; in the backward the probabilities, their gradient and
    the logits' gradient); the fused backends keep it on chip.
Measured against real forward/backward passes in tests/test_sweep_scale.py.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from pe_fast.available_memory import available_bytes
from pe_fast.stacked_optim import STATES

BYTES = 4  # float32
ACTIVATIONS_PER_BLOCK = 14  # [B, N, width] tensors saved per block
MLP_ACTIVATIONS_PER_BLOCK = 2  # [B, N, mlp_width]
ATTENTION_MAP_COPIES = 5  # [B, H, N, N] tensors alive at once in the reference backend's forward or backward
DEFAULT_FRACTION = 0.5  # a pack may use this fraction of the free memory


def parameter_count(model_config, coordinates=None) -> int:
    """Parameters of one model of this architecture (counted on a real 1-model instance; cheap)."""
    from pe_fast.models import StackedTransformer
    model = StackedTransformer(model_config, [0], [1.0], coordinates)
    return sum(p.numel() for p in model.parameters())


def matrix_parameter_count(model_config) -> int:
    """The parameters of one model's weight matrices (embedding, QKV, attention output, MLP, readout), counted
    without building the model: all but the biases, norms and PE, so at most parameter_count."""
    c, W = model_config, model_config.width
    return c.token_dim * W + c.depth * (4 * W * W + 2 * W * c.mlp_width) + W * c.out_dim


def bytes_per_model(model_config, batch_size: int, optimizer: str = "adam", backend: str = "reference",
                    coordinates=None, params: int | None = None) -> int:
    """Estimated peak bytes one model of the pack adds during a training step; params: its parameters (default:
    counted on a real instance, parameter_count)."""
    c = model_config
    params = parameter_count(c, coordinates) if params is None else params
    weights = params * BYTES * (2 + STATES[optimizer])  # weight + gradient + optimizer state
    B, N, D = batch_size, c.num_tokens, c.width
    per_block = (ACTIVATIONS_PER_BLOCK * B * N * D + MLP_ACTIVATIONS_PER_BLOCK * B * N * c.mlp_width
                 + B * c.heads * N) * BYTES
    if c.pe_dropout:  # the block's keep mask and its masked input (h + pe) · mask
        per_block += 2 * B * N * D * BYTES
    inputs = B * N * c.token_dim * BYTES
    attention_map = ATTENTION_MAP_COPIES * B * c.heads * N * N * BYTES if backend == "reference" else 0
    return weights + c.depth * per_block + inputs + attention_map


def free_bytes(device: torch.device) -> int:
    """Free GPU memory (torch.cuda.mem_get_info), or on the CPU available_bytes (MemAvailable within the
    address-space limit)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return available_bytes()


def pack_size(per_model: int, free: int, fraction: float = DEFAULT_FRACTION) -> int:
    """The most models whose estimated memory fits in `fraction` of the free memory (at least 1)."""
    return max(1, int(fraction * free) // max(1, per_model))


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


@functools.cache
def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory in the process instead of returning it to the kernel.

    By default every CPU tensor above 32 MiB (and smaller ones early on) is a fresh mmap, freed with munmap:
    each training step then page-faults its activations in again, 4 KiB at a time. On a 16-model pack at
    d = 160, batch 128 that is 100,000-300,000 faults and up to 2 s of kernel time per step (README, benchmarks).
    With mmap off and trimming off, freed blocks are reused from the heap: after the first steps a step
    faults nothing. The cost: the process keeps its peak heap until it exits, and the heap fragments a little
    (peak RSS 2.82 GB instead of 2.68 GB on that step). Returns False where the C library is not glibc
    (nothing changes there).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 2 ** 31 - 1))
    except (OSError, AttributeError):
        return False
