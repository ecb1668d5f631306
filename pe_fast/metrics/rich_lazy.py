"""Rich versus lazy training, measured per model (issue 14): how far each model's weights, features and attention
moved from where they started (Chizat et al. 2019: lazy = the network stays near its initial linearisation).

RichLazyProbe keeps a pack's step-0 state on one fixed batch and compares each evaluation with it:
* weight_drift_b{b}: ‖W_t − W_0‖ / ‖W_0‖ over block b's attention and MLP weight matrices;
* repr_change: 1 − linear CKA (Kornblith et al. 2019) between the last block's token representations at step 0
  and now (0 = the features did not move: lazy);
* attn_change: the first block's attention rows' total-variation distance from step 0, ½ Σ_j |p_t − p_0|, mean
  over items, heads and query tokens (0 = the same maps; 1 = disjoint).
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


class RichLazyProbe:
    """The step-0 weights, last-block representations and first-block attention maps of a pack on `tokens`
    [B, N, token_dim] (the same items for every model), and each evaluation's distance from them. Build it on the
    freshly initialised pack: a model's initial weights follow from its seed, so a resumed pack rebuilds the
    same step-0 state and no checkpoint needs to hold it."""

    def __init__(self, model, tokens: Tensor, probes: Tensor | None):
        self.tokens, self.probes = tokens, probes
        self.initial = {"weights": self._weights(model), **self._features(model)}

    @staticmethod
    def _weights(model) -> list[Tensor]:
        """Per block, its weight matrices flattened per model and joined: [M, P_b]."""
        return [torch.cat([block.get_parameter(name).detach().flatten(1) for name in BLOCK_WEIGHTS], dim=1)
                for block in model.blocks]

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
        for b, (w_now, w_start) in enumerate(zip(self._weights(model), self.initial["weights"])):
            moved[names.weight_drift(b)] = (w_now - w_start).norm(dim=1) / w_start.norm(dim=1)
        moved[names.REPR_CHANGE] = 1 - linear_cka(self.initial["features"], now["features"])
        moved[names.ATTN_CHANGE] = 0.5 * (now["attention"] - self.initial["attention"]).abs().sum(-1).mean((1, 2, 3))
        return [{name: float(values[m]) for name, values in moved.items()} for m in range(model.num_models)]
