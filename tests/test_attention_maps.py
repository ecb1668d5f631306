"""The paper's attention-map alignment (pe_fast.metrics.attention_maps): the mean maps against the fused op's own
probe statistics (a linear functional of the map, computed by the backend's kernel, not by the reference path the
maps take), and the alignment against correlations written out with numpy."""
import numpy as np
import pytest
import torch

from pe_fast.metrics.attention_maps import map_alignment, mean_attention_maps
from pe_fast.models import ModelConfig, StackedTransformer
from pe_fast.ops import STAT_NAMES
from pe_fast.train import predict

CONFIG = ModelConfig(num_tokens=6, token_dim=3, out_dim=2, width=8, depth=2, heads=2, mlp_width=16, pe="learned")


def test_mean_maps_give_the_op_s_probe_masses():
    torch.manual_seed(0)
    model = StackedTransformer(CONFIG, [1, 2, 3], [0.5, 0.5, 2.0])
    tokens = torch.randn(7, CONFIG.num_tokens, CONFIG.token_dim)
    probes = (torch.rand(2, 6, 6, generator=torch.Generator().manual_seed(1)) > 0.5).float()
    maps = mean_attention_maps(model, tokens, probes, max_scores=3 * 2 * 36 * 3)  # chunks of 3, 3, 1 items
    assert maps.shape == (3, 2, 6, 6)
    assert np.allclose(maps.sum(-1), 1, atol=1e-6)
    _, stats = predict(model, tokens, probes)  # [L, M, H, S], means over items and query rows
    for k in range(2):
        from_op = stats[:, :, :, len(STAT_NAMES) + k].mean(-1).T.numpy()  # heads averaged: [M, L]
        from_maps = (maps * probes[k].numpy()).sum((-1, -2)) / 6  # Σ_ij A_ij T_ij, mean over the 6 query rows
        assert from_maps == pytest.approx(from_op, abs=1e-5)


def layer_mean_r(a, b):
    return np.mean([np.corrcoef(a[layer].ravel(), b[layer].ravel())[0, 1] for layer in range(len(a))])


def test_alignment_is_the_layer_mean_pearson_r_with_the_reference_mean_leaving_each_reference_out():
    g = np.random.default_rng(0)
    ref = {10: g.random((2, 4, 4)), 11: g.random((2, 4, 4)), 12: g.random((2, 4, 4))}
    mean = sum(ref.values()) / 3
    maps = {**ref, 0: 2 * mean + 1, 1: -mean, 2: g.random((2, 4, 4))}
    got = map_alignment(maps, [10, 11, 12, 99])  # 99: not trained, ignored
    assert got[0] == pytest.approx(1.0) and got[1] == pytest.approx(-1.0)
    assert got[2] == pytest.approx(layer_mean_r(maps[2], mean))
    assert got[10] == pytest.approx(layer_mean_r(ref[10], (ref[11] + ref[12]) / 2))
    assert map_alignment(maps, []) == {}
    alone = map_alignment({0: ref[10], 1: ref[11]}, [0])
    assert np.isnan(alone[0]) and alone[1] == pytest.approx(layer_mean_r(ref[11], ref[10]))


def test_the_final_evaluation_gathers_the_maps_a_separate_pass_gives():
    """PackTrainer takes the mean attention maps from its final evaluation's pass over the attention split (fp32):
    the same maps as mean_attention_maps' own pass, in its own chunks; under autocast it computes them apart."""
    from pe_fast.tasks.lst import LSTTask
    from pe_fast.train import PackTrainer, TrainConfig

    task = LSTTask()
    config = ModelConfig(num_tokens=16, token_dim=5, out_dim=4, width=8, depth=2, heads=1, mlp_width=16,
                         readout_token=task.readout_token)
    trainer = PackTrainer(task, config, TrainConfig(steps=2, batch_size=8, eval_every=2), [1, 2], [0.2, 2.0],
                          torch.device("cpu"))
    maps = trainer.run().attention_maps
    assert trainer.evaluation.final_maps is not None
    apart = mean_attention_maps(trainer.model, trainer.evaluation.tokens[task.attention_split], trainer.probes,
                                max_scores=2 * 256 * 16 * 16)
    assert maps.shape == (2, 2, 16, 16)
    np.testing.assert_allclose(maps, apart, rtol=0, atol=1e-7)
    low = PackTrainer(task, config, TrainConfig(steps=2, batch_size=8, eval_every=2, precision="bf16"), [1], [0.2],
                      torch.device("cpu"))
    assert low.run().attention_maps.shape == (1, 2, 16, 16) and low.evaluation.final_maps is None
