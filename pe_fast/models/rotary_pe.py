"""Rotary PE (RoPE): q and k rotated pairwise by angles that grow with the position (1D) or grid axes (2D)."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from pe_fast.nn import CheckedModule


def rotary_angles(coordinates: np.ndarray, head_dim: int, base: float = 10000.0) -> np.ndarray:
    """Angles [N, head_dim/2]. For k coordinate axes the pairs are split into k equal groups (axial RoPE)."""
    coordinates = np.asarray(coordinates, dtype=np.float64)
    if coordinates.ndim == 1:
        coordinates = coordinates[:, None]
    axes = coordinates.shape[1]
    pairs = head_dim // 2
    if head_dim % 2 or pairs % axes:
        raise ValueError(f"RoPE over {axes} axes needs a head dim divisible by {2 * axes}, got {head_dim}")
    per_axis = pairs // axes
    frequency = base ** (-np.arange(per_axis) / per_axis)
    return np.concatenate([coordinates[:, a:a + 1] * frequency[None, :] for a in range(axes)], axis=1)


class RotaryPE(CheckedModule):
    """kind "rope": positions = token index; "rope2d": axial over the task's 2D coordinates."""

    DERIVED = ("cos", "sin")  # computed from the configuration and the tokens' positions (pe_fast.nn.CheckedModule)

    def __init__(self, kind: str, num_tokens: int, head_dim: int, coordinates: np.ndarray | None):
        super().__init__()
        if kind == "rope":
            positions = np.arange(num_tokens)
        elif coordinates is None or np.asarray(coordinates).shape[1] != 2:
            raise ValueError("PE 'rope2d' needs 2D token coordinates")
        else:
            positions = coordinates
        angles = torch.tensor(rotary_angles(positions, head_dim), dtype=torch.float32)
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())

    def tables(self) -> tuple[Tensor, Tensor]:
        return self.cos, self.sin
