"""The rich/lazy metrics (pe_fast.metrics.rich_lazy) against closed forms and brute force: linear CKA against its
HSIC form on Gram matrices, weight drift against a known rescaling, attention change against a softmax written
out by hand."""
import math

import numpy as np
import pytest
import torch

from pe_fast.metrics.rich_lazy import RichLazyProbe, linear_cka
from pe_fast.models import ModelConfig, StackedTransformer

CONFIG = ModelConfig(num_tokens=6, token_dim=3, out_dim=2, width=8, depth=2, heads=2, mlp_width=16, pe="learned")


def cka_from_gram(x: np.ndarray, y: np.ndarray) -> float:
    """Kornblith et al. 2019, eq. 2-3: HSIC of the centred Gram matrices."""
    n = len(x)
    centre = np.eye(n) - np.ones((n, n)) / n
    k, l = centre @ x @ x.T @ centre, centre @ y @ y.T @ centre
    return float(np.sum(k * l) / math.sqrt(np.sum(k * k) * np.sum(l * l)))


def test_linear_cka_matches_the_gram_form_and_its_invariances():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 40, 5, generator=g, dtype=torch.float64)
    y = torch.randn(3, 40, 7, generator=g, dtype=torch.float64) + x.sum(-1, keepdim=True)
    got = linear_cka(x, y)
    for m in range(3):
        assert got[m].item() == pytest.approx(cka_from_gram(x[m].numpy(), y[m].numpy()), rel=1e-10)
    rotation = torch.linalg.qr(torch.randn(5, 5, generator=g, dtype=torch.float64))[0]
    # invariant to rotations, isotropic scaling and shifts; 1 against itself
    assert torch.allclose(linear_cka(x, 3.0 * x @ rotation + 2.0), torch.ones(3, dtype=torch.float64))


def probe_and_model(seeds=(1, 2)):
    torch.manual_seed(0)
    model = StackedTransformer(CONFIG, list(seeds), [0.1] * len(seeds)).double()
    tokens = torch.randn(4, CONFIG.num_tokens, CONFIG.token_dim, dtype=torch.float64)
    return RichLazyProbe(model, tokens, None), model, tokens


def test_nothing_moved_at_the_start():
    probe, model, _ = probe_and_model()
    for row in probe.measure(model):
        assert all(value == pytest.approx(0, abs=1e-12) for value in row.values()), row


def test_a_change_of_the_last_block_moves_its_drift_and_the_features_but_not_the_first_attention():
    probe, model, _ = probe_and_model()
    with torch.no_grad():
        for name in ("mlp_in.weight", "mlp_out.weight"):
            model.blocks[1].get_parameter(name)[1] *= 1.5  # model 1 only
    rows = probe.measure(model)
    assert rows[0] == pytest.approx({k: 0.0 for k in rows[0]}, abs=1e-12)
    block = model.blocks[1]
    mlp = torch.cat([block.get_parameter(n)[1].flatten() for n in ("mlp_in.weight", "mlp_out.weight")])
    every = torch.cat([block.get_parameter(n)[1].flatten() for n in
                       ("attention.w_qkv", "attention.out.weight", "mlp_in.weight", "mlp_out.weight")])
    # ‖1.5 W − W‖ = ⅓ ‖1.5 W‖ over the scaled matrices; relative to all of the block's initial weights
    initial_norm = torch.sqrt(every.square().sum() - mlp.square().sum() + (mlp / 1.5).square().sum())
    assert rows[1]["weight_drift_b1"] == pytest.approx((mlp / 3).norm().item() / initial_norm.item(), rel=1e-10)
    assert rows[1]["weight_drift_b0"] == 0 and rows[1]["attn_change"] == pytest.approx(0, abs=1e-12)
    assert rows[1]["repr_change"] > 1e-4


def test_attention_change_against_a_softmax_written_out():
    probe, model, tokens = probe_and_model()
    attention = model.blocks[0].attention

    def maps(m):
        h = tokens @ model.embed.weight[m] + model.embed.bias[m] + model.absolute.at_block(0)[m]
        q, k, _ = (h @ attention.w_qkv[m] + attention.b_qkv[m]).split(CONFIG.width, dim=-1)
        heads, dh = CONFIG.heads, CONFIG.width // CONFIG.heads
        q, k = (t.reshape(len(tokens), CONFIG.num_tokens, heads, dh).transpose(1, 2) for t in (q, k))
        return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), dim=-1)

    before = [maps(m).detach() for m in range(2)]
    with torch.no_grad():
        attention.w_qkv.add_(0.3 * torch.randn_like(attention.w_qkv))
    rows = probe.measure(model)
    for m in range(2):
        want = 0.5 * (maps(m).detach() - before[m]).abs().sum(-1).mean()
        assert rows[m]["attn_change"] == pytest.approx(want.item(), rel=1e-10)
        assert 0 < rows[m]["attn_change"] < 1


def test_effective_rank_of_k_equal_singular_values_is_k_and_of_no_change_zero():
    from pe_fast.metrics.rich_lazy import effective_rank
    g = torch.Generator().manual_seed(3)
    u = torch.linalg.qr(torch.randn(9, 9, generator=g, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(7, 7, generator=g, dtype=torch.float64))[0]
    matrices = [2.5 * u[:, :k] @ v[:, :k].T for k in (1, 3, 7)] + [torch.zeros(9, 7, dtype=torch.float64)]
    assert effective_rank(torch.stack(matrices)).tolist() == pytest.approx([1.0, 3.0, 7.0, 0.0], rel=1e-10)
    # two unequal singular values s1, s2: exp of the entropy of (s1, s2) / (s1 + s2), written out
    two = torch.diag(torch.tensor([3.0, 1.0], dtype=torch.float64))
    p = np.array([0.75, 0.25])
    assert effective_rank(two[None]).item() == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-12)


def test_a_rank_one_update_of_a_block_has_change_rank_one_and_the_others_zero():
    probe, model, _ = probe_and_model()
    assert all(row["dw_rank_b0"] == 0 and row["dw_rank_b1"] == 0 for row in probe.measure(model))
    with torch.no_grad():
        w = model.blocks[1].get_parameter("mlp_in.weight")
        g = torch.Generator().manual_seed(5)
        a = torch.randn(w.shape[1], 1, generator=g, dtype=w.dtype)
        b = torch.randn(1, w.shape[2], generator=g, dtype=w.dtype)
        w[1] += a @ b  # model 1 only, one of the block's four matrices
    rows = probe.measure(model)
    assert rows[0]["dw_rank_b1"] == 0 and rows[1]["dw_rank_b0"] == 0
    # the mean over the block's matrices that changed: the one of rank one
    assert rows[1]["dw_rank_b1"] == pytest.approx(1.0, rel=1e-10)
    with torch.no_grad():  # a second matrix of the block changed by a rank-three update: the mean of 1 and 3
        w = model.blocks[1].get_parameter("attention.out.weight")
        w[1] += torch.diag(torch.tensor([2.0, 2.0, 2.0] + [0.0] * (w.shape[1] - 3), dtype=w.dtype))
    assert probe.measure(model)[1]["dw_rank_b1"] == pytest.approx(2.0, rel=1e-10)


def test_effective_rank_of_a_diverged_matrix_is_nan_and_leaves_the_others_scored():
    from pe_fast.metrics.rich_lazy import effective_rank
    diverged = torch.eye(3)
    diverged[0, 1] = float("nan")
    ranks = effective_rank(torch.stack([torch.eye(3), diverged, torch.diag(torch.tensor([1.0, 1.0, 0.0]))]))
    assert ranks[0].item() == pytest.approx(3.0) and math.isnan(ranks[1].item())
    assert ranks[2].item() == pytest.approx(2.0)
