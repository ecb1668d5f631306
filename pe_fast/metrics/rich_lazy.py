"""Rich versus lazy training, measured per model (issue 14): how far each model's weights, features and attention
moved from where they started (Chizat et al. 2019: lazy = the network stays near its initial linearisation).

RichLazyProbe keeps a pack's step-0 state on one fixed batch and compares each evaluation with it:
* weight_drift_b{b}: ‖W_t − W_0‖ / ‖W_0‖ over block b's attention and MLP weight matrices;
* repr_change: 1 − linear CKA (Kornblith et al. 2019) between the last block's token representations at step 0
  and now (0 = the features did not move: lazy);
* attn_change: the first block's attention rows' total-variation distance from step 0, ½ Σ_j |p_t − p_0|, mean
  over items, heads and query tokens (0 = the same maps; 1 = disjoint);
* dw_rank_b{b}: the effective rank of what block b learned, W_t − W_0, averaged over those of its four weight matrices
  that changed (0 where none did), so that a rank-one update reads 1 (under small initialisation the rank of the
  change grows step by step: Boix-Adsera et al., arXiv 2306.07042).
"""
from __future__ import annotations

import torch
from torch import Tensor

from pe_fast import columns as names
from pe_fast.metrics.attention_maps import attention_input_hook

# The attention and MLP weight matrices of a block (biases and layer norms left out: they scale, not map)
BLOCK_WEIGHTS = ("attention.w_qkv", "attention.out.weight", "mlp_in.weight", "mlp_out.weight")


def linear_cka(x: Tensor, y: Tensor) -> Tensor:
    """Linear CKA of representations x [M, S, D1] and y [M, S, D2] (S samples each), per model: [M]."""
    x = x - x.mean(1, keepdim=True)
    y = y - y.mean(1, keepdim=True)
    cross = torch.linalg.matrix_norm(x.transpose(1, 2) @ y) ** 2
    return cross / (torch.linalg.matrix_norm(x.transpose(1, 2) @ x) * torch.linalg.matrix_norm(y.transpose(1, 2) @ y))


def effective_rank(changes: Tensor) -> Tensor:
    """Effective rank (Roy & Vetterli 2007) of each matrix of changes [M, a, b]: exp of the entropy of its singular
    values normalised to sum 1, [M]; 1 for a rank-one matrix, k for k equal singular values. A matrix that did not
    change at all has rank 0 (nothing was learned); a diverged (non-finite) one has rank NaN."""
    finite = torch.isfinite(changes).flatten(1).all(1)
    singular = torch.linalg.svdvals(torch.where(finite[:, None, None], changes, 0).double())
    total = singular.sum(-1, keepdim=True)
    share = singular / total.clamp_min(torch.finfo(torch.float64).tiny)
    entropy = -(share * torch.log(share.clamp_min(1e-300))).sum(-1)
    rank = torch.where(total[..., 0] > 0, torch.exp(entropy), torch.zeros_like(entropy))
    return torch.where(finite, rank, torch.nan)


class RichLazyProbe:
    """The step-0 weights, last-block representations and first-block attention maps of a pack on `tokens`
    [B, N, token_dim] (the same items for every model), and each evaluation's distance from them. Build it on the
    freshly initialised pack: a model's initial weights follow from its seed, so a resumed pack rebuilds the
    same step-0 state and no checkpoint needs to hold it."""

    def __init__(self, model, tokens: Tensor, probes: Tensor | None):
        self.tokens, self.probes = tokens, probes
        self.initial = {"matrices": self._matrices(model), **self._features(model)}

    @staticmethod
    def _matrices(model) -> list[list[Tensor]]:
        """Per block, copies of its weight matrices [M, a, b]."""
        return [[block.get_parameter(name).detach().clone() for name in BLOCK_WEIGHTS] for block in model.blocks]

    @torch.no_grad()
    def _features(self, model) -> dict[str, Tensor]:
        """The last block's output [M, B·N', D] and the first block's attention probabilities [M,B,H,N,N]."""
        captured = {}

        def last_block_output(block, args, output):
            h = output[0]
            captured["features"] = h.reshape(h.shape[0], -1, h.shape[-1])

        hooks = [model.blocks[0].register_forward_pre_hook(attention_input_hook(captured, "attention")),
                 model.blocks[-1].register_forward_hook(last_block_output)]
        was_training = model.training
        try:
            model.eval()
            batch = self.tokens.expand(model.num_models, *self.tokens.shape)
            model(batch, self.probes)
        finally:
            model.train(was_training)
            for hook in hooks:
                hook.remove()
        return captured

    def measure(self, model) -> list[dict[str, float]]:
        """One row of metrics per model."""
        now = self._features(model)
        moved = {}
        for b, (now_b, start_b) in enumerate(zip(self._matrices(model), self.initial["matrices"], strict=True)):
            w_now, w_start = (torch.cat([w.flatten(1) for w in ws], dim=1) for ws in (now_b, start_b))
            moved[names.weight_drift(b)] = (w_now - w_start).norm(dim=1) / w_start.norm(dim=1)
            ranks = torch.stack([effective_rank(w - w0) for w, w0 in zip(now_b, start_b, strict=True)])
            changed = (ranks != 0).sum(0)  # a NaN rank (diverged) counts, and keeps the mean NaN
            moved[names.weight_change_rank(b)] = torch.where(changed > 0, ranks.sum(0) / changed.clamp_min(1), 0.0)
        moved[names.REPR_CHANGE] = 1 - linear_cka(self.initial["features"], now["features"])
        moved[names.ATTN_CHANGE] = 0.5 * (now["attention"] - self.initial["attention"]).abs().sum(-1).mean((1, 2, 3))
        return [{name: float(values[m]) for name, values in moved.items()} for m in range(model.num_models)]
