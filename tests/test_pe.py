"""Each PE variant's defining property, checked against a closed form or a brute-force construction."""
import math

import numpy as np
import pytest
import torch

from pe_fast.models import ModelConfig, StackedTransformer
from pe_fast.models.absolute_pe import sinusoidal_1d, sinusoidal_nd
from pe_fast.models.relative_pe import offset_index
from pe_fast.models.rotary_pe import rotary_angles
from pe_fast.ops import pe_attention

GRID = np.stack(np.divmod(np.arange(16), 4), axis=1).astype(float)  # (row, col)


def make(pe, seeds=(1,), sigmas=(1.0,), width=16, heads=1, depth=2, coords=GRID):
    config = ModelConfig(num_tokens=16, token_dim=5, out_dim=4, width=width, depth=depth, heads=heads,
                         mlp_width=32, pe=pe, readout_token=15)
    return StackedTransformer(config, list(seeds), list(sigmas), coords)


def test_learned_pe_is_normal_with_sigma_and_trainable():
    model = make("learned", seeds=(1, 2), sigmas=(0.1, 2.0), width=160, depth=4)
    tables = torch.stack(model.pe_tables())  # [blocks, M, N, D]
    assert abs(tables[:, 0].std().item() - 0.1) < 0.005 and abs(tables[:, 1].std().item() - 2.0) < 0.1
    assert all(t.requires_grad for t in model.pe_tables())


def test_random_pe_is_fixed_normal():
    model = make("random", sigmas=(0.5,), width=160, depth=4)
    tables = torch.stack(model.pe_tables())
    assert abs(tables.std().item() - 0.5) < 0.03
    assert not any(t.requires_grad for t in model.pe_tables())
    assert all(not n.startswith("absolute") for n, _ in model.named_parameters())


def test_random_pe_is_the_same_seeds_learned_pe_at_initialisation():
    """The random PE is the control for learning the PE: same seed and σ, the same tables and the same weights
    everywhere else, so learned − random after training is what training the PE did."""
    learned = make("learned", seeds=(3, 4), sigmas=(0.1, 2.0), width=32, depth=3)
    random = make("random", seeds=(3, 4), sigmas=(0.1, 2.0), width=32, depth=3)
    for a, b in zip(learned.pe_tables(), random.pe_tables(), strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=0, atol=0)
    assert not torch.equal(learned.pe_tables()[0][0], learned.pe_tables()[1][0])  # one table per block
    others = {n: t for n, t in random.state_dict().items() if not n.startswith("absolute")}
    for name, tensor in learned.state_dict().items():
        if not name.startswith("absolute"):
            torch.testing.assert_close(tensor, others[name], rtol=0, atol=0)


def test_sinusoidal_1d_closed_form():
    pe = sinusoidal_1d(np.arange(16), 8)
    for p in range(16):
        for i in range(4):
            assert math.isclose(pe[p, 2 * i], math.sin(p / 10000 ** (2 * i / 8)), abs_tol=1e-12)
            assert math.isclose(pe[p, 2 * i + 1], math.cos(p / 10000 ** (2 * i / 8)), abs_tol=1e-12)


def test_sinusoidal_2d_is_the_authors_formula_and_depends_only_on_row_and_col():
    pe = sinusoidal_nd(GRID, 160)
    div = np.exp(-(2 * np.arange(40)) * math.log(10000) / 80)
    for cell, (row, col) in enumerate(GRID):
        np.testing.assert_allclose(pe[cell, 0:80:2], np.sin(row * div))
        np.testing.assert_allclose(pe[cell, 1:80:2], np.cos(row * div))
        np.testing.assert_allclose(pe[cell, 80::2], np.sin(col * div))
        np.testing.assert_allclose(pe[cell, 81::2], np.cos(col * div))
    # Cells in the same row share the first half exactly: the encoding is separable by axis.
    np.testing.assert_allclose(pe[0, :80], pe[3, :80])
    np.testing.assert_allclose(pe[0, 80:], pe[12, 80:])


def test_sinusoidal_nd_dot_product_depends_only_on_the_offset():
    coords = np.random.default_rng(0).uniform(-50, 50, size=(30, 3))
    pe = sinusoidal_nd(coords, 60)
    shifted = sinusoidal_nd(coords + np.array([7.0, -3.0, 11.0]), 60)
    np.testing.assert_allclose(pe @ pe.T, shifted @ shifted.T, atol=1e-9)  # translation invariant


def test_none_pe_model_is_permutation_equivariant():
    model = make("none")
    x = torch.randn(1, 2, 16, 5)
    perm = torch.randperm(16)
    h = model.embed(x)
    h_perm = model.embed(x[:, :, perm])
    for block in model.blocks:
        h, _ = block(h, None, None, None, None)
        h_perm, _ = block(h_perm, None, None, None, None)
    torch.testing.assert_close(h[:, :, perm], h_perm, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["rope", "rope2d"])
def test_rope_logits_depend_only_on_relative_position(kind):
    """q·k after rotation equals q·R(θ_j − θ_i)·k: shifting every position leaves the logits unchanged."""
    coords = np.arange(16)[:, None].astype(float) if kind == "rope" else GRID
    angles = torch.tensor(rotary_angles(coords, 8))
    shifted = torch.tensor(rotary_angles(coords + 5, 8))
    x, w = torch.randn(1, 1, 16, 8, dtype=torch.float64), torch.randn(1, 8, 24, dtype=torch.float64)
    a, _ = pe_attention(x, None, w, None, 1, rope=(angles.cos(), angles.sin()))
    b, _ = pe_attention(x, None, w, None, 1, rope=(shifted.cos(), shifted.sin()))
    torch.testing.assert_close(a, b)
    if kind == "rope2d":  # half of the pairs follow the row, half the column
        np.testing.assert_allclose(rotary_angles(GRID, 8)[:, :2], GRID[:, :1] * np.array([1, 100 ** -1]))


def test_relative_bias_is_shared_by_equal_offsets_and_bidirectional():
    index, count = offset_index(GRID.astype(int))
    assert count == 49  # (2·3 + 1)² grid offsets
    for i in range(16):
        for j in range(16):
            for k in range(16):
                for l in range(16):
                    same = np.array_equal(GRID[j] - GRID[i], GRID[l] - GRID[k])
                    assert (index[i, j] == index[k, l]) == same
    model = make("relative", heads=2)
    with torch.no_grad():
        model.relative.tables[0].copy_(torch.randn_like(model.relative.tables[0]))
    bias = model.relative.bias(0)
    assert bias.shape == (1, 2, 16, 16)
    assert not torch.allclose(bias, bias.transpose(-1, -2))  # i→j and j→i differ: no symmetry, no mask
