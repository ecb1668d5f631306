"""Attention maps as the paper compares them: each model's attention probabilities, averaged
over heads and over the items of one split, per layer — an [L, N, N] map per model — and the alignment of a
model's maps with those of the ground-truth PE's models (the 2D sinusoidal PE on the LST): the Pearson r of the
flattened maps, per layer, averaged over layers. The paper reports a Spearman ρ of 0.96 between that alignment
and generalisation across models.

The fused op never materialises the map; these go through `reference.attention_map`, one block at a time, on the
input that block's attention receives (a forward pre-hook), so the maps are those of the model as it runs.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from pe_fast.ops import reference


def attention_input_hook(captured: dict, key):
    """A forward pre-hook for a transformer block that stores its attention probabilities [M,B,H,N,N] under
    captured[key], computed by the reference from the block's own input, PE, weights, RoPE and bias."""
    def hook(block, args):
        h, pe, _, rope, bias = args[:5]
        cos, sin = rope if rope is not None else (None, None)
        attention = block.attention
        log_p = reference.attention_map(h, pe, attention.w_qkv, attention.b_qkv, attention.num_heads, cos, sin,
                                        bias)[0]
        captured[key] = log_p.exp()
    return hook


class AttentionMapSums:
    """While active (a context manager), every forward of `model` adds its attention probabilities, averaged over
    heads and summed over items, to a [M, L, N, N] float64 total; mean() is the mean over the items seen. The
    training loop's final evaluation gathers the maps this way on its own pass over the split."""

    def __init__(self, model):
        self.model, self.total, self.items, self.hooks = model, None, 0, []

    def __enter__(self):
        captured = {}
        blocks = self.model.blocks

        def add(block_index):
            hook = attention_input_hook(captured, block_index)

            def add_block(block, args):
                hook(block, args)
                p = captured.pop(block_index)  # [M, B, H, N, N]
                if self.total is None:
                    M, _, _, N, _ = p.shape
                    self.total = torch.zeros(M, len(blocks), N, N, dtype=torch.float64, device=p.device)
                self.total[:, block_index] += p.double().sum(1).mean(1)  # items summed, heads averaged
                if block_index == 0:
                    self.items += p.shape[1]
            return add_block

        self.hooks = [block.register_forward_pre_hook(add(b)) for b, block in enumerate(blocks)]
        return self

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()
        self.hooks = []

    def mean(self) -> np.ndarray:
        return (self.total / self.items).float().cpu().numpy()


@torch.no_grad()
def mean_attention_maps(model, tokens: Tensor, probes: Tensor | None, max_scores: int = 2 ** 24) -> np.ndarray:
    """[M, L, N, N]: every model's attention probabilities on the items tokens [P, N, token_dim], averaged over
    heads and items, per block. Items go through in chunks of at most max_scores map entries (M·chunk·H·N²)."""
    M, (P, N) = model.num_models, tokens.shape[:2]
    heads = model.blocks[0].attention.num_heads
    chunk = max(1, max_scores // (M * heads * N * N))
    was_training = model.training
    try:
        model.eval()
        with AttentionMapSums(model) as sums:
            for start in range(0, P, chunk):
                part = tokens[start:start + chunk]
                model(part.unsqueeze(0).expand(M, *part.shape), probes)
    finally:
        model.train(was_training)
    return sums.mean()


def map_alignment(maps: dict, reference_ids: list) -> dict:
    """Each model's alignment with the reference models' mean maps: the Pearson r of the flattened [N, N] maps,
    per layer, averaged over layers. maps: model id -> [L, N, N]. A reference model is compared with the mean of
    the other reference models (leave one out), so its own seed does not inflate its score; with a single
    reference model, that model gets NaN. Returns model id -> alignment (empty without reference models)."""
    reference_ids = [i for i in reference_ids if i in maps]
    if not reference_ids:
        return {}
    stacked = np.stack([maps[i] for i in reference_ids]).astype(np.float64)
    total = stacked.sum(0)

    def layer_r(a, b):
        with np.errstate(invalid="ignore", divide="ignore"):  # a constant map has no r: NaN
            return np.mean([np.corrcoef(a[layer].ravel(), b[layer].ravel())[0, 1] for layer in range(len(a))])

    scores = {}
    for model_id, m in maps.items():
        if model_id in reference_ids:
            others = len(reference_ids) - 1
            scores[model_id] = layer_r(m, (total - m) / others) if others else float("nan")
        else:
            scores[model_id] = layer_r(m, total / len(reference_ids))
    return {k: float(v) for k, v in scores.items()}
