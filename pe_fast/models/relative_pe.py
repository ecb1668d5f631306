"""Relative PE: a learned bias on the attention logits for every offset between two tokens (bidirectional)."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from pe_fast.nn import CheckedModule


def offset_index(coordinates: np.ndarray) -> tuple[np.ndarray, int]:
    """[N,N] index of the offset coordinates[j] - coordinates[i] among all distinct offsets, and their count.

    Offsets are signed, so i→j and j→i get separate biases; there is no causal mask.
    """
    coordinates = np.asarray(coordinates)
    if coordinates.ndim == 1:
        coordinates = coordinates[:, None]
    offsets = coordinates[None, :, :] - coordinates[:, None, :]
    distinct, index = np.unique(offsets.reshape(-1, coordinates.shape[1]), axis=0, return_inverse=True)
    n = len(coordinates)
    return index.reshape(n, n), len(distinct)


class RelativePE(CheckedModule):
    """One bias per (block, head, offset), initialised to zero; offsets on the task's integer grid if it has
    one (the LST's rows and columns), else on the token index."""

    DERIVED = ("index",)  # computed from the configuration and the tokens' positions (pe_fast.nn.CheckedModule)

    def __init__(self, num_models: int, num_blocks: int, num_heads: int, num_tokens: int,
                 coordinates: np.ndarray | None):
        super().__init__()
        # integers exactly: within allclose's 1e-8, coordinates 1e-9 apart all rounded to one position
        integer_grid = coordinates is not None and np.array_equal(coordinates, np.round(coordinates))
        index, count = offset_index(np.round(coordinates).astype(int) if integer_grid else np.arange(num_tokens))
        self.register_buffer("index", torch.tensor(index, dtype=torch.long))
        self.tables = nn.ParameterList(
            nn.Parameter(torch.zeros(num_models, num_heads, count)) for _ in range(num_blocks))

    def bias(self, block: int) -> Tensor:
        """[M, H, N, N] logit bias of one block."""
        return self.tables[block][:, :, self.index]
