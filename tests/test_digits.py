"""--task digits: masked pixels of real handwritten digits, with the exact pixel grid as the ground truth. The data
against scikit-learn's own arrays and numpy's correlation, the grid measures against hand-made PEs (the grid itself
scores perfectly, a random table near chance), and a short sweep through every 2D PE."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn", reason="--task digits reads scikit-learn's digits")

import pe_fast  # noqa: E402
import pe_fast.sweep  # noqa: E402
from pe_fast.data.digits import grid_coordinates, load_digit_regions  # noqa: E402
from pe_fast.tasks.digits import DigitsTask  # noqa: E402


@pytest.fixture(scope="module")
def task():
    return DigitsTask(load_digit_regions(), "digits")


def test_the_images_are_scikit_learns_split_by_image(task):
    from sklearn.datasets import load_digits
    images = load_digits().data
    data = task.data
    np.testing.assert_array_equal(np.concatenate(data.runs), images)  # every image once, in order
    assert task.num_tokens == 64 and task.token_dim == 2
    # the first six groups of images train, the last two test
    assert len(task.splits["train"]) == sum(len(run) for run in data.runs[:6])
    assert len(task.splits["test"]) == len(images) - len(task.splits["train"])
    train = np.concatenate(data.runs[:6])
    varying = train.std(0) > 0
    np.testing.assert_allclose(data.fc[np.ix_(varying, varying)], np.corrcoef(train[:, varying], rowvar=False),
                               atol=1e-9)
    assert np.allclose(data.fc[~varying][:, varying], 0) and np.allclose(np.diag(data.fc), 1)
    rows, columns = task.coordinates[:, 0], task.coordinates[:, 1]
    assert task.coordinates.shape == (64, 2) and rows[9] == 1 and columns[9] == 1  # pixel 9: row 1, column 1


def test_the_grid_probes_by_brute_force(task):
    names = task.probe_names
    for name, rule in (("same_row", lambda a, b: a // 8 == b // 8), ("same_column", lambda a, b: a % 8 == b % 8),
                       ("neighbours", lambda a, b: abs(a // 8 - b // 8) + abs(a % 8 - b % 8) == 1)):
        probe = task.probes[names.index(name)]
        for a in range(64):
            for b in range(64):
                assert probe[a, b] == float(a != b and rule(a, b)), (name, a, b)
    assert task.probes.shape == (len(names), 64, 64) and names[:3] == ["same_network", "near_3d", "fc"]


def test_the_grid_as_a_pe_recovers_the_grid_and_a_random_one_does_not(task):
    grid = np.zeros((64, 16))
    grid[:, :2] = grid_coordinates()
    exact = task.pe_metrics(grid)
    assert exact["pe_dist_spearman"] > 0.999 and exact["pe_procrustes"] < 1e-9
    rng = np.random.default_rng(0)
    chance = [task.pe_metrics(rng.normal(size=(64, 16))) for _ in range(5)]
    assert abs(np.mean([m["pe_dist_spearman"] for m in chance])) < 0.1
    assert min(m["pe_procrustes"] for m in chance) > 0.5


def test_a_short_sweep_through_every_2d_pe(tmp_path):
    run = pe_fast.sweep.run(task="digits", pe=["learned", "sin2d", "rope2d", "none"], sigmas=[0.1], seeds=1, steps=4,
                            eval_every=2, threads=1, no_report=True, out=str(tmp_path / "digits"))
    results = run.results.set_index("pe")
    assert {"learned", "sin2d", "rope2d", "none", "baseline:mean", "baseline:linear"} <= set(results.index)
    assert np.isfinite(results.loc["learned", "test_r2"])
    # the fixed 2D sinusoids of the grid already mirror it (0.57 at width 32); a learned PE after four steps does not
    assert results.loc["sin2d", "pe_dist_spearman"] > 0.5 and abs(results.loc["learned", "pe_dist_spearman"]) < 0.3
    with torch.no_grad():  # its trained models open like every task's
        assert run.model(0)(run.task_inputs("test")[:4]).shape == (4, 64, 1)


def test_the_classification_task_reads_the_digit_at_a_blank_pixel(tmp_path):
    """--task digits_class: the images and digits as scikit-learn has them, split like the masked task's; the
    read-out pixel blank in all; the logistic regression reference scored on the same split by scikit-learn."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from pe_fast.tasks.digits import DigitClassTask
    task = DigitClassTask()
    digits = load_digits()
    train, test = task.splits["train"], task.splits["test"]
    np.testing.assert_array_equal(torch.cat([train.x, test.x]).squeeze(-1).numpy() * 16, digits.data)
    np.testing.assert_array_equal(torch.cat([train.y, test.y]).numpy(), digits.target)
    assert len(test) == len(DigitsTask(load_digit_regions(), "digits").splits["test"])
    assert (digits.data[:, task.readout_token] == 0).all()
    pixels = (digits.data / 16).astype(np.float32)  # the models' inputs
    logistic = LogisticRegression(max_iter=2000).fit(pixels[:len(train)], digits.target[:len(train)])
    row = next(r for r in task.baselines() if r["pe"] == "baseline:logistic")
    assert row["test_acc"] == pytest.approx(logistic.score(pixels[len(train):], digits.target[len(train):]))
    # a perfect model's logits score 1; the loss is the cross-entropy of each model
    logits = torch.nn.functional.one_hot(test.y, 10).float()[None] * 10
    assert task.score(logits, "test", torch.arange(len(test)))[0]["test_acc"] == 1.0
    loss = task.loss(logits.expand(2, -1, -1), test.y.expand(2, -1))
    np.testing.assert_allclose(loss, torch.nn.functional.cross_entropy(logits[0], test.y).expand(2), rtol=1e-6)
    run = pe_fast.sweep.run(task="digits_class", pe=["learned", "sin2d"], sigmas=[0.1], seeds=1, steps=4,
                            eval_every=2, threads=1, no_report=True, out=str(tmp_path / "class"))
    assert {"learned", "sin2d", "baseline:logistic", "baseline:majority"} <= set(run.results["pe"])
    assert run.model(0)(run.task_inputs("test")[:3]).shape == (3, 10)


def test_a_small_training_set_keeps_the_first_images_and_the_whole_test_set(tmp_path):
    from pe_fast.tasks.digits import DigitClassTask
    full, small = DigitsTask(load_digit_regions(), "digits"), DigitsTask(load_digit_regions(), "digits",
                                                                          train_images=300)
    assert len(small.splits["train"]) == 300 and torch.equal(small.splits["train"].values,
                                                             full.splits["train"].values[:300])
    assert torch.equal(small.splits["test"].values, full.splits["test"].values)
    values = full.splits["train"].values[:300, :, 0].double().numpy()
    np.testing.assert_allclose(small.train_covariance, np.cov(values, rowvar=False), atol=1e-10)
    assert len(DigitClassTask(300).splits["train"]) == 300
    with pytest.raises(ValueError, match="--train-images 5000"):
        DigitClassTask(5000)
    from sweep_harness import refuse_sweep
    refused = refuse_sweep("--task", "fmri", "--train-images", "300", "--out", str(tmp_path / "x"))
    assert refused.returncode == 2 and "--train-images applies to --task digits and digits_class only" in refused.stderr
    # the first image alone is one class: the logistic baseline failed after training, leaving a folder no --resume
    # could finish (the dataset's first image is a 0, its second a 1)
    refused = refuse_sweep("--task", "digits_class", "--train-images", "1", "--out", str(tmp_path / "x"))
    assert refused.returncode == 2 and "--train-images 1: the first 1 training image(s) show the digit 0 only" in \
        refused.stderr and not (tmp_path / "x").exists()
    assert len(DigitClassTask(2).splits["train"]) == 2
    # with --window W an item spans W images: 1,349 items were refused as more than the split's images, 2 items
    # trained on 225 images at --window 224
    with pytest.raises(ValueError, match="--train-images 2 with --window 224: each item then spans 224 images"):
        DigitsTask(load_digit_regions(), "digits", train_images=2, window=224)


def test_the_report_lays_a_pe_out_on_its_square_grid(tmp_path):
    """The learned-PE figure on any square grid: 64 pixels draw, 10 tokens are said not to lie on one."""
    import pandas as pd
    from pe_fast.report.figures import grid_pe_figure
    results = pd.DataFrame({"pe": ["learned", "learned"], "sigma": [0.1, 2.0], "seed": [1, 1], "model_id": [0, 1]})
    rng = np.random.default_rng(0)
    tables = {f"model_{i}": rng.normal(size=(1, 64, 16)) for i in (0, 1)}
    assert grid_pe_figure(results, tables, tmp_path / "grid.png") is None
    assert (tmp_path / "grid.png").stat().st_size > 10_000
    # with the similarity maps below: a second row of panels, so a taller image
    assert grid_pe_figure(results, tables, tmp_path / "maps.png", similarity_maps=True) is None
    from PIL import Image
    assert Image.open(tmp_path / "maps.png").height > 1.5 * Image.open(tmp_path / "grid.png").height
    odd = {f"model_{i}": rng.normal(size=(1, 10, 16)) for i in (0, 1)}
    assert "square grid" in grid_pe_figure(results, odd, tmp_path / "odd.png")


def test_patches_are_the_images_two_by_two_on_a_four_by_four_grid(tmp_path):
    from sklearn.datasets import load_digits
    from pe_fast.tasks.digits import DigitClassTask
    task = DigitClassTask(tokens="patches")
    images = load_digits().data.reshape(-1, 8, 8) / 16
    x = torch.cat([task.splits["train"].x, task.splits["test"].x]).numpy()
    assert x.shape == (len(images), 16, 4) and task.num_tokens == 16 and task.token_dim == 4
    for patch in range(16):  # by hand: patch (r, c) holds pixels (2r + i, 2c + j), i and j in 0, 1, row-major
        r, c = divmod(patch, 4)
        np.testing.assert_allclose(x[:, patch], images[:, 2 * r:2 * r + 2, 2 * c:2 * c + 2].reshape(-1, 4), atol=1e-7)
    assert task.coordinates[5].tolist() == [1.0, 1.0] and task.probes.shape == (3, 16, 16)
    grid = np.zeros((16, 8))
    grid[:, :2] = task.coordinates
    exact = task.pe_metrics(grid)
    assert exact["pe_dist_spearman"] > 0.999 and exact["pe_procrustes"] < 1e-9
    run = pe_fast.sweep.run(task="digits_class", tokens="patches", pe=["learned", "rope2d"], sigmas=[0.1], seeds=1,
                            steps=4, eval_every=2, threads=1, no_report=True, out=str(tmp_path / "patches"))
    assert {"learned", "rope2d", "baseline:logistic"} <= set(run.results["pe"])
    assert run.task_inputs("test").shape[1:] == (16, 4)



@pytest.fixture(scope="module")
def patches():
    return DigitsTask(load_digit_regions(), "digits", tokens="patches")


def test_masked_patches_are_the_z_scored_pixels_two_by_two(task, patches):
    """--task digits --tokens patches: each token a 2 x 2 patch whose 4 pixels (z-scored as the pixel task's) are its
    values; 3 of the 16 patches masked whole; the ground truth the patches' 4 x 4 grid, quadrants and correlation."""
    from sklearn.datasets import load_digits
    assert (patches.num_tokens, patches.token_dim, patches.num_classes, patches.num_masked) == (16, 5, 4, 3)
    for name in ("train", "test"):
        pixels = task.splits[name].values[:, :, 0].reshape(-1, 8, 8).numpy()
        part = patches.splits[name]
        for patch in range(16):  # by hand: patch (r, c) holds pixels (2r + i, 2c + j), i and j in 0, 1, row-major
            r, c = divmod(patch, 4)
            np.testing.assert_array_equal(part.values[:, patch].numpy(),
                                          pixels[:, 2 * r:2 * r + 2, 2 * c:2 * c + 2].reshape(-1, 4))
        assert (part.mask.sum(1) == 3).all()
        np.testing.assert_array_equal(part.x[..., :4].numpy(), part.values.numpy() * ~part.mask[..., None].numpy())
        np.testing.assert_array_equal(part.x[..., 4].numpy(), part.mask.numpy())
    images = load_digits().data.reshape(-1, 8, 8)[:len(task.splits["train"])]
    means = images.reshape(-1, 4, 2, 4, 2).mean((2, 4)).reshape(-1, 16)  # each patch's mean grey level
    varying = means.std(0) > 0
    np.testing.assert_allclose(patches.data.fc[np.ix_(varying, varying)], np.corrcoef(means[:, varying], rowvar=False),
                               atol=1e-9)
    rows, cols = np.divmod(np.arange(16), 4)
    np.testing.assert_array_equal(patches.coordinates, np.stack([rows, cols], 1))
    np.testing.assert_array_equal(patches.data.networks, (rows >= 2) * 2 + (cols >= 2))
    neighbours = patches.probes[patches.probe_names.index("neighbours")].numpy()
    np.testing.assert_array_equal(neighbours, np.abs(rows[:, None] - rows) + np.abs(cols[:, None] - cols) == 1)


def test_the_linear_reference_of_patches_predicts_pixels_from_pixels(task, patches):
    """The masked patches' pixels as E[masked | visible] under the training pixels' covariance, by numpy's
    pseudo-inverse item by item (blank pixels make the covariance singular)."""
    covariance = np.cov(task.splits["train"].values[:, :, 0].numpy().astype(np.float64), rowvar=False)
    predicted = patches.baseline_predictions("baseline:linear", "test").numpy()
    part = patches.splits["test"]
    for item in range(0, len(part), 97):
        pixels = np.empty(64)
        masked_pixels = []
        for patch in range(16):
            r, c = divmod(patch, 4)
            indices = [(2 * r + i) * 8 + 2 * c + j for i in (0, 1) for j in (0, 1)]
            pixels[indices] = part.values[item, patch].numpy()
            if part.mask[item, patch]:
                masked_pixels += indices
        visible = [p for p in range(64) if p not in masked_pixels]
        expected = covariance[np.ix_(masked_pixels, visible)] @ np.linalg.pinv(
            covariance[np.ix_(visible, visible)]) @ pixels[visible]
        got = predicted[item][part.mask[item].numpy()].reshape(-1)
        np.testing.assert_allclose(got, expected, atol=2e-3)
        np.testing.assert_array_equal(predicted[item][~part.mask[item].numpy()], part.values[item][~part.mask[item]])


def test_the_grid_as_a_pe_scores_perfect_rsa_on_both_digit_tasks_and_a_random_one_chance(task, patches):
    """pe_rsa: the Pearson r of the PE's cosine similarities with minus the grid distances. A hand-made PE whose
    cosine similarities are exp(−distance / 100) (the Laplace kernel is positive definite: its square root's rows
    are the PE), nearly linear in the distance, scores ≈ 1; random PEs ≈ 0. The same for the classification task,
    pixels and patches."""
    from pe_fast.tasks.digits import DigitClassTask

    def laplace_pe(side):
        rows, cols = np.divmod(np.arange(side * side), side)
        distance = np.hypot(rows[:, None] - rows, cols[:, None] - cols)
        values, vectors = np.linalg.eigh(np.exp(-distance / 100))
        return vectors * np.sqrt(np.clip(values, 0, None))

    rng = np.random.default_rng(1)
    for measured, side in ((task, 8), (patches, 4), (DigitClassTask(), 8), (DigitClassTask(tokens="patches"), 4)):
        assert measured.pe_metrics(laplace_pe(side))["pe_rsa"] > 0.999
        chance = [measured.pe_metrics(rng.normal(size=(side * side, 16)))["pe_rsa"] for _ in range(5)]
        assert abs(np.mean(chance)) < 0.1


def test_a_short_sweep_of_masked_patches_its_report_and_patches_refuse_a_window(tmp_path):
    """The sweep and its report: the learned PE laid out on the grid (figures/learned_pe_on_grid.png) beside its
    similarity with the tokens' correlation (figures/learned_pe.png)."""
    out = tmp_path / "patches"
    run = pe_fast.sweep.run(task="digits", tokens="patches", pe=["learned", "sin2d"], sigmas=[0.1, 2.0], seeds=1,
                            steps=4, eval_every=2, threads=1, out=str(out))
    report = (out / "report.md").read_text()
    for figure in ("learned_pe_on_grid", "learned_pe"):
        assert (out / "figures" / f"{figure}.png").stat().st_size > 10_000 and f"figures/{figure}.png" in report
    results = run.results.set_index("pe")
    assert {"learned", "sin2d", "baseline:mean", "baseline:linear"} <= set(results.index)
    assert np.isfinite(results.loc["learned", ["test_r2", "pe_rsa", "pe_fc_corr"]].to_numpy(float)).all()
    assert run.task_inputs("test").shape[1:] == (16, 5)
    with torch.no_grad():
        assert run.model(0)(run.task_inputs("test")[:4]).shape == (4, 16, 4)
    from sweep_harness import refuse_sweep
    refused = refuse_sweep("--task", "digits", "--tokens", "patches", "--window", "2", "--out", str(tmp_path / "x"))
    assert refused.returncode == 2 and "--tokens patches takes --window 1" in refused.stderr


@pytest.mark.parametrize("task_name,steps", [("digits", 20_000), ("digits_class", 3000)])
def test_the_ten_seed_preset_of_both_digit_tasks_resolves_to_valid_settings(task_name, steps):
    """--preset gpu (not "gpu" in this test's name: that marks a CUDA-only test) through the sweep's parser and
    checks: six σ × ten seeds of the learned PE, ten each of sin2d and none (80 models by hand); the masked task
    allowed 20,000 steps, still stopping when converged."""
    from pe_fast.sweep.grid import expand_grid
    from pe_fast.sweep.settings import build_parser, from_flags
    s = from_flags(build_parser().parse_args(["--task", task_name, "--preset", "gpu", "--tokens", "patches"]))
    assert s.sigmas == (0.01, 0.1, 0.2, 0.5, 1.0, 2.0) and s.seeds == 10 and set(s.pe) == {"learned", "sin2d", "none"}
    assert s.steps == steps and s.until == "converged" and s.tokens == "patches"
    assert len(expand_grid(s)) == 6 * 10 + 10 + 10
