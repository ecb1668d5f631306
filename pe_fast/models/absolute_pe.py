"""Absolute positional encodings: vectors added to the tokens (learned, fixed sinusoidal, fixed random, none)."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from pe_fast.nn import CheckedModule, normal_per_model
from pe_fast.seeds import PE_DROPOUT_SEED_OFFSET


def sinusoidal_1d(positions: np.ndarray, width: int, base: float = 10000.0) -> np.ndarray:
    """Vaswani et al.: channel 2i = sin(pos / base^(2i/width)), channel 2i+1 = cos(...). positions [N]."""
    if width % 2:
        raise ValueError(f"a sinusoidal PE needs an even width, got {width}")
    frequency = np.exp(-np.arange(0, width, 2) * math.log(base) / width)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * frequency[None, :]
    pe = np.zeros((len(angles), width))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angles), np.cos(angles)
    return pe


def sinusoidal_nd(coordinates: np.ndarray, width: int, base: float = 10000.0) -> np.ndarray:
    """One 1D sinusoidal block per coordinate axis, concatenated: coordinates [N, k] -> [N, width].

    With k = 2 grid coordinates this is the authors' 2D PE (width/2 channels per axis). Each axis gets the
    largest even share of the width; channels left over (width not divisible by 2k) stay zero.
    """
    coordinates = np.asarray(coordinates, dtype=np.float64)
    if coordinates.ndim == 1:
        coordinates = coordinates[:, None]
    axes = coordinates.shape[1]
    share = (width // axes) // 2 * 2
    if share == 0:
        raise ValueError(f"width {width} is too small for a sinusoidal PE over {axes} coordinates")
    pe = np.zeros((coordinates.shape[0], width))
    for axis in range(axes):
        pe[:, axis * share:(axis + 1) * share] = sinusoidal_1d(coordinates[:, axis], share, base)
    return pe


SIGMA_PES = ("learned", "random")  # the kinds drawn from N(0, σ²): the only ones a σ applies to
SINUSOIDAL_PES = ("sin1d", "sin2d", "sinnd")
ADDITIVE_PES = SIGMA_PES + SINUSOIDAL_PES  # the kinds that add a vector to x: those a PE dropout can apply to


class AbsolutePE(CheckedModule):
    """The PE vector added to the tokens at the input of each block (or of the first block only).

    kind: "learned" (N(0, σ_m²) per model, trained), "random" (N(0, σ_m²), fixed), "sin1d" (token index),
    "sin2d" / "sinnd" (the task's coordinates), "none".
    """

    # computed from the configuration and the tokens' positions: a sin1d model's table loaded into a sinnd model
    # made it another model without a word
    DERIVED = ("fixed",)

    def __init__(self, kind: str, generators: Sequence[torch.Generator], sigmas: Sequence[float | None],
                 num_tokens: int, width: int, num_blocks: int, coordinates: np.ndarray | None):
        super().__init__()
        self.kind = kind
        self.num_blocks = num_blocks
        M = len(generators)
        if kind in SIGMA_PES:
            if any(sigma is None for sigma in sigmas):
                raise ValueError(f"PE {kind!r} is drawn from N(0, σ²): every model needs a σ, got {list(sigmas)}")
            # One independent PE per block, each N(0, σ²) (the authors' design).
            tables = [normal_per_model(generators, (num_tokens, width), sigmas) for _ in range(num_blocks)]
            if kind == "learned":
                self.tables = nn.ParameterList(nn.Parameter(t) for t in tables)
            else:
                # Registered buffers only: a plain list of them would keep the old tensors after .to()
                for i, t in enumerate(tables):
                    self.register_buffer(f"table{i}", t)
        elif kind in SINUSOIDAL_PES:
            if kind == "sin1d":
                fixed = sinusoidal_1d(np.arange(num_tokens), width)
            else:
                if coordinates is None:
                    raise ValueError(f"PE {kind!r} needs token coordinates, and this task has none")
                if kind == "sin2d" and np.asarray(coordinates).shape[1] != 2:
                    raise ValueError(f"PE 'sin2d' needs 2D coordinates; this task's are "
                                     f"{np.asarray(coordinates).shape[1]}D (use 'sinnd')")
                fixed = sinusoidal_nd(coordinates, width)
            self.register_buffer("fixed", torch.tensor(fixed, dtype=torch.float32).expand(M, -1, -1).contiguous())
        elif kind != "none":
            raise ValueError(f"unknown absolute PE kind {kind!r}")

    def at_block(self, block: int) -> Tensor | None:
        """The PE added at the input of block `block`, [M, N, D], or None."""
        if self.kind == "none" or block >= self.num_blocks:
            return None
        if self.kind == "learned":
            return self.tables[block]
        if self.kind == "random":
            return getattr(self, f"table{block}")
        return self.fixed

    def values(self) -> list[Tensor]:
        """Every PE table this module adds (one per block for learned/random), for metrics."""
        return [t for t in (self.at_block(b) for b in range(self.num_blocks)) if t is not None]


class PEDropout:
    """The authors' sinusoidal PE modules apply Dropout(p) to x + PE at the input of each block while training
    (p = 0.1 in their code; their learned PE has none, pe_fast can give it the same). This draws those keep masks,
    scaled by 1 / (1 - p).

    Each model's masks come from a generator seeded with its seed and the step alone, so they do not depend on
    which models share its pack, and a resumed run draws the same ones without any state to checkpoint."""

    def __init__(self, p: float, seeds: Sequence[int], num_blocks: int, device: torch.device):
        if not 0 < p < 1:
            raise ValueError(f"a PE dropout probability must lie in (0, 1), got {p}")
        self.keep, self.seeds, self.num_blocks = 1.0 - p, [int(s) for s in seeds], num_blocks
        self.generator = torch.Generator(device)

    def masks(self, step: int, hidden_shape: Sequence[int], dtype: torch.dtype = torch.float32) -> Tensor:
        """Keep masks [blocks, M, *hidden_shape] for training step `step` (hidden_shape: one model's [B, N, D])."""
        per_model = []
        for seed in self.seeds:
            # mixed by SeedSequence: the CPU generator keeps only a seed's low 32 bits
            mixed = np.random.SeedSequence([PE_DROPOUT_SEED_OFFSET, seed, step]).generate_state(1, np.uint64)[0]
            self.generator.manual_seed(int(mixed))
            mask = torch.empty(self.num_blocks, *hidden_shape, dtype=dtype, device=self.generator.device)
            per_model.append(mask.bernoulli_(self.keep, generator=self.generator))
        return torch.stack(per_model, dim=1).div_(self.keep)
