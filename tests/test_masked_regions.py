"""The masked-region task (fMRI / netsim) and the module metrics, against brute force and closed forms."""
import numpy as np
import pytest
import torch

from pe_fast.data import RegionData
from pe_fast.metrics.modules import newman_modularity, segregation
from pe_fast.tasks.masked_regions import MaskedRegionTask, masked_input, random_masks, split_runs


def gaussian_regions(N=12, T=300, subjects=("a", "b"), runs_per_subject=2, seed=0) -> RegionData:
    """Correlated Gaussian series with a known covariance, two modules, and 3D centroids."""
    rng = np.random.default_rng(seed)
    factor = rng.normal(size=(N, N)) / np.sqrt(N) + np.eye(N)
    runs, subject_ids, names = [], [], []
    for s in subjects:
        for r in range(runs_per_subject):
            runs.append((rng.normal(size=(T, N)) @ factor.T).astype(np.float32))
            subject_ids.append(s)
            names.append(f"run{r}")
    cov = factor @ factor.T
    fc = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    return RegionData(runs=runs, subjects=subject_ids, run_names=names,
                      labels=np.array([f"r{i}" for i in range(N)]), centroids=rng.normal(size=(N, 3)) * 20,
                      networks=np.arange(N) % 2, network_names=["A", "B"], fc=fc, coupling=None, kind="fmri",
                      source="test", tr_seconds=1.0)


def test_random_masks_mask_exactly_k_tokens_per_row():
    mask = random_masks((50, 10), 3, torch.Generator().manual_seed(0))
    assert mask.shape == (50, 10) and (mask.sum(1) == 3).all()
    assert mask.float().mean(0).min() > 0  # every position gets masked somewhere


def test_masked_input_hides_the_masked_values_and_flags_them():
    values = torch.arange(12.0).view(1, 4, 3)
    mask = torch.tensor([[True, False, False, True]])
    x = masked_input(values, mask)
    assert x.shape == (1, 4, 4)
    assert (x[0, 0, :3] == 0).all() and x[0, 0, 3] == 1 and x[0, 3, 3] == 1
    assert torch.equal(x[0, 1, :3], values[0, 1]) and x[0, 1, 3] == 0


def test_split_by_subject_and_by_run():
    subjects, runs = ["a", "a", "b", "b"], ["r1", "r2", "r1", "r2"]
    assert split_runs(subjects, runs, "subject") == ([0, 1], [2, 3])
    assert split_runs(subjects, runs, "run") == ([0, 2], [1, 3])
    with pytest.raises(ValueError, match="at least 2 subjects"):
        split_runs(["a", "a"], runs[:2], "subject")


def test_samples_are_zscored_windows_of_the_runs():
    data = gaussian_regions()
    task = MaskedRegionTask(data, "fmri", window=3)
    run = np.asarray(data.runs[0], dtype=np.float64)
    z = (run - run.mean(0)) / run.std(0)
    values = task.splits["train"].values
    assert values.shape == (2 * (300 - 2), 12, 3)
    np.testing.assert_allclose(values[5].numpy(), z[5:8].T, atol=1e-5)
    assert task.token_dim == 4 and task.num_classes == 3


def test_loss_is_the_mse_over_masked_tokens_only():
    task = MaskedRegionTask(gaussian_regions(), "fmri")
    values = torch.randn(2, 5, 12, 1)
    mask = torch.rand(2, 5, 12) < 0.3
    mask[:, :, 0] = True
    outputs = torch.randn(2, 5, 12, 1)
    loss = task.loss(outputs, (values, mask))
    for m in range(2):
        expected = ((outputs[m] - values[m])[mask[m]] ** 2).mean()
        torch.testing.assert_close(loss[m], expected)


def test_each_model_draws_its_own_masks_independent_of_its_pack():
    task = MaskedRegionTask(gaussian_regions(), "fmri")
    index = torch.tensor([[0, 1, 2], [3, 4, 5]])
    _, (_, mask_pack) = task.training_batches([7, 9], torch.device("cpu"))(index)
    _, (_, mask_alone) = task.training_batches([9], torch.device("cpu"))(index[1:])
    assert torch.equal(mask_pack[1], mask_alone[0])
    assert not torch.equal(mask_pack[0], mask_pack[1])


def test_linear_baseline_is_the_gaussian_conditional_expectation():
    data = gaussian_regions()
    task = MaskedRegionTask(data, "fmri", mask_fraction=0.25)
    predictions = task.baseline_predictions("baseline:linear", "test").double().numpy()
    test = task.splits["test"]
    cov = task.train_covariance
    for i in (0, 17, 123):
        m = test.mask[i].numpy()
        v = ~m
        x = test.values[i, :, 0].double().numpy()
        expected = cov[np.ix_(m, v)] @ np.linalg.solve(cov[np.ix_(v, v)], x[v])
        np.testing.assert_allclose(predictions[i, m, 0], expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(predictions[i, v, 0], x[v])  # visible tokens are left as they are
    rows = {r["pe"]: r for r in task.baselines()}
    # Correlated Gaussian data: the conditional expectation beats the visible mean.
    assert rows["baseline:linear"]["test_mse"] < rows["baseline:mean"]["test_mse"]
    mean_prediction = task.baseline_predictions("baseline:mean", "test")[0, :, 0]
    visible = ~test.mask[0]
    torch.testing.assert_close(mean_prediction[test.mask[0]],
                               test.values[0, visible, 0].mean().expand(int(test.mask[0].sum())))


def test_true_covariance_baseline_only_for_data_that_carry_it():
    """Simulated data that know their covariance get baseline:linear-true: the conditional expectation under that
    covariance (brute-force solves below). With few training TRs per region it beats the fitted one, which
    estimates it; data without it get no such row, and asking for it is an error."""
    data = gaussian_regions(N=30, T=60)
    assert [r["pe"] for r in MaskedRegionTask(data, "fmri", mask_fraction=0.25).baselines()] == [
        "baseline:mean", "baseline:linear"]
    factor = np.random.default_rng(0).normal(size=(30, 30)) / np.sqrt(30) + np.eye(30)  # gaussian_regions' own
    cov = factor @ factor.T
    data.covariance = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))  # the runs are z-scored: a correlation
    task = MaskedRegionTask(data, "fmri", mask_fraction=0.25)
    predictions = task.baseline_predictions("baseline:linear-true", "test").double().numpy()
    test = task.splits["test"]
    for i in (0, 17):
        m = test.mask[i].numpy()
        v = ~m
        x = test.values[i, :, 0].double().numpy()
        expected = data.covariance[np.ix_(m, v)] @ np.linalg.solve(data.covariance[np.ix_(v, v)], x[v])
        np.testing.assert_allclose(predictions[i, m, 0], expected, rtol=1e-4, atol=1e-5)
    rows = {r["pe"]: r for r in task.baselines()}
    assert rows["baseline:linear-true"]["test_mse"] < rows["baseline:linear"]["test_mse"]
    with pytest.raises(ValueError, match="linear-true"):
        MaskedRegionTask(gaussian_regions(), "fmri").baseline_predictions("baseline:linear-true", "test")


def test_score_r2_is_one_minus_mse_over_target_power():
    task = MaskedRegionTask(gaussian_regions(), "fmri")
    items = torch.arange(40)
    test = task.splits["test"]
    outputs = torch.zeros(1, 40, 12, 1)
    row = task.score(outputs, "test", items)[0]
    target = test.values[:40][test.mask[:40]].double()
    assert row["test_mse"] == pytest.approx(float((target ** 2).mean()))
    assert row["test_r2"] == pytest.approx(0.0, abs=1e-12)
    perfect = task.score(test.values[:40].unsqueeze(0), "test", items)[0]
    assert perfect["test_mse"] == pytest.approx(0.0, abs=1e-12) and perfect["test_r2"] == pytest.approx(1.0)


def test_modularity_and_segregation_closed_forms():
    modules = np.repeat([0, 1], 5)
    blocks = (modules[:, None] == modules[None, :]).astype(float)
    # Two disconnected equal cliques: Q = Σ_c [l_c/m − (d_c/2m)²] = 2·(1/2 − 1/4) = 1/2.
    assert newman_modularity(blocks, modules) == pytest.approx(0.5)
    assert segregation(blocks, modules) == pytest.approx(1.0)
    uniform = np.ones((10, 10))
    # The complete graph: 2m = 90, each module holds 20 of the 90 ordered edges and half the degree,
    # so Q = 2·(20/90 − 1/4) = −1/18.
    assert newman_modularity(uniform, modules) == pytest.approx(-1 / 18)
    assert segregation(uniform, modules) == pytest.approx(0.0)


def test_pe_metrics_of_a_pe_that_is_the_geometry():
    data = gaussian_regions()
    task = MaskedRegionTask(data, "fmri")
    table = np.concatenate([data.centroids, np.zeros((12, 5))], axis=1)
    metrics = task.pe_metrics(table)
    assert metrics["pe_dist_spearman"] == pytest.approx(1.0)
    assert metrics["pe_procrustes"] == pytest.approx(0.0, abs=1e-9)
    modular = np.eye(2)[data.networks] + 1e-3 * np.random.default_rng(0).normal(size=(12, 2))
    assert task.pe_metrics(modular)["pe_segregation"] > 0.9


def test_training_masks_are_each_model_s_own_random_masks():
    """MaskedBatches orders every model's draws in one call: the masks random_masks gives from each model's own
    generator, step after step (a model's batches do not depend on its pack)."""
    from pe_fast.seeds import MASK_SEED_OFFSET
    from pe_fast.tasks.masked_regions import MaskedBatches

    values, seeds, count = torch.randn(40, 30, 2), [3, 11, 7], 6
    batches = MaskedBatches(values, count, seeds, torch.device("cpu"))
    own = [torch.Generator().manual_seed(s + MASK_SEED_OFFSET) for s in seeds]
    for _ in range(50):
        index = torch.randint(0, 40, (3, 8))
        _, (_, mask) = batches(index)
        assert torch.equal(mask, torch.stack([random_masks((8, 30), count, g) for g in own]))


def test_loss_tokens_are_the_masked_ones_in_order_with_their_targets():
    task = MaskedRegionTask(gaussian_regions(), "fmri")
    index = torch.randint(0, 50, (2, 6))
    _, (values, mask) = task.training_batches([1, 2], torch.device("cpu"))(index)
    tokens, (at_values, at_mask) = task.loss_tokens((values, mask))
    assert tokens.shape == (2, 6, task.num_masked) and at_mask.all()
    for m in range(2):
        for b in range(6):
            expected = mask[m, b].nonzero().flatten()  # brute force: the masked positions, ascending
            assert torch.equal(tokens[m, b], expected)
            assert torch.equal(at_values[m, b], values[m, b, expected])


@pytest.mark.parametrize("pe", ["learned", "none", "rope", "relative"])
@pytest.mark.parametrize("ends", ["C++ sublayer ends", "torch's ops"])
def test_a_step_on_the_masked_tokens_alone_equals_the_step_on_every_token(pe, ends, monkeypatch):
    """A training step computes the last block's output projection, layer norms, MLP and the head at the masked
    tokens only (StackedTransformer's output_tokens): its loss, statistics and gradients are those of the whole
    outputs' loss, to float64 rounding; through the C++ sublayer ends and through torch's ops (CUDA's path)."""
    from pe_fast.models.transformer import ModelConfig, StackedTransformer
    from pe_fast.ops import sublayer_ends
    if ends == "torch's ops":
        monkeypatch.setattr(sublayer_ends, "BUILT", False)
    task = MaskedRegionTask(gaussian_regions(), "fmri")
    config = ModelConfig(num_tokens=task.num_tokens, token_dim=task.token_dim, out_dim=task.num_classes, width=16,
                         depth=2, heads=2, mlp_width=24, pe=pe)
    model = StackedTransformer(config, seeds=[1, 2, 3], sigmas=[0.1, 0.5, 2.0]).double()
    inputs, targets = task.training_batches([1, 2, 3], torch.device("cpu"))(torch.randint(0, 50, (3, 5)))
    inputs, targets = inputs.double(), (targets[0].double(), targets[1])
    every, every_stats = model(inputs, task.probes.double())
    full_loss = task.loss(every, targets)
    tokens, at_tokens = task.loss_tokens(targets)
    some, some_stats = model(inputs, task.probes.double(), output_tokens=tokens)
    assert some.shape == (3, 5, task.num_masked, task.num_classes)
    some_loss = task.loss(some, at_tokens)
    torch.testing.assert_close(some_loss, full_loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(some_stats, every_stats, rtol=0, atol=0)
    parameters = list(model.parameters())
    for full, alone in zip(torch.autograd.grad(full_loss.sum(), parameters),
                           torch.autograd.grad(some_loss.sum(), parameters)):
        torch.testing.assert_close(alone, full, rtol=1e-10, atol=1e-14)


def test_output_tokens_are_refused_for_a_read_out_model():
    from pe_fast.models.transformer import ModelConfig, StackedTransformer
    model = StackedTransformer(ModelConfig(num_tokens=4, token_dim=2, out_dim=3, width=8, depth=1, mlp_width=8,
                                           readout_token=0), seeds=[1], sigmas=[0.5])
    with pytest.raises(ValueError, match="output_tokens"):
        model(torch.zeros(1, 2, 4, 2), output_tokens=torch.zeros(1, 2, 1, dtype=torch.long))


@pytest.mark.parametrize("pe", ["learned", "relative"])
def test_evaluation_at_the_masked_tokens_alone_scores_as_the_whole_outputs(pe):
    """An evaluation computes the outputs at each item's masked tokens only (train.scored_outputs); its MSE and R²
    and its statistics are those of the outputs at every token scored by task.score, to float64 rounding, over
    several of predict's chunks."""
    from pe_fast.models.transformer import ModelConfig, StackedTransformer
    from pe_fast.train import predict, scored_outputs
    task = MaskedRegionTask(gaussian_regions(), "fmri")
    config = ModelConfig(num_tokens=task.num_tokens, token_dim=task.token_dim, out_dim=task.num_classes, width=16,
                         depth=2, heads=2, mlp_width=24, pe=pe)
    model = StackedTransformer(config, seeds=[1, 2, 3], sigmas=[0.1, 0.5, 2.0]).double()
    items = torch.arange(0, len(task.splits["test"]), 3)
    tokens = task.splits["test"].x[items].double()
    probes = task.probes.double()
    chunk_scores = 3 * 7 * task.num_tokens ** 2  # predict's max_scores of 7 items a chunk
    every, every_stats = predict(model, tokens, probes, max_scores=chunk_scores)
    some, some_stats = scored_outputs(task, model, "test", tokens, items, probes)
    assert len(items) > 7
    # the op returns its statistics in float32; chunked otherwise, their weighted means round otherwise
    torch.testing.assert_close(some_stats, every_stats, rtol=1e-6, atol=1e-9)
    for alone, full in zip(task.score(some, "test", items), task.score(every, "test", items)):
        assert alone.keys() == full.keys()
        for key in full:
            assert alone[key] == pytest.approx(full[key], rel=1e-12)
