"""A task is one module: a toy task defined here alone (its Task, settings, flag, range, defaults, preset and the
report figures it asks for) runs through the sweep's command line, the report and --resume, with no edit anywhere
else in pe_fast: it only joins the registry, pe_fast.tasks.KINDS."""
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from sweep_harness import TINY_NETSIM, narrowed, settings_of

from pe_fast.report.cli import main as report_main
from pe_fast.sweep.program import main as sweep_main
from pe_fast.tasks import KINDS
from pe_fast.tasks.base import TaskKind, TaskSetting, TaskView

TOKENS, FEATURES = 6, 3


class Split:
    def __init__(self, items: int, generator: torch.Generator):
        self.x = torch.randn(items, TOKENS, FEATURES, generator=generator)
        self.y = (self.x[:, 0, 0] > 0).long()  # is the first token's first feature positive?

    def __len__(self):
        return len(self.y)


class Batches:
    def __init__(self, split: Split, device):
        self.x, self.y = split.x.to(device), split.y.to(device)

    def __call__(self, index):
        return self.x[index], self.y[index]

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class ToyTask:
    name = "toy"
    num_tokens, token_dim, num_classes, readout_token = TOKENS, FEATURES, 2, TOKENS - 1
    probe_names = ["neighbour"]
    coordinates = None
    attention_split = "test"
    data_kind = data_line = None

    def __init__(self, items: int):
        generator = torch.Generator().manual_seed(0)
        self.splits = {"train": Split(items, generator), "test": Split(32, generator)}
        ring = np.roll(np.eye(TOKENS), 1, axis=1)
        self.probes = torch.tensor(ring + ring.T, dtype=torch.float32)[None]
        self.description = {"task": "toy", "items": items}

    def training_batches(self, seeds, device):
        return Batches(self.splits["train"], device)

    def loss(self, outputs, targets):
        M, B, C = outputs.shape
        return torch.nn.functional.cross_entropy(outputs.reshape(M * B, C), targets.reshape(M * B),
                                                 reduction="none").view(M, B).mean(1)

    def targets(self, split, items, num_models):
        return self.splits[split].y[items].expand(num_models, -1)

    def score(self, outputs, split, items):
        correct = (outputs.argmax(-1) == self.splits[split].y[items]).float()
        return [{f"{split}_acc": float(row.mean())} for row in correct]

    def pe_metrics(self, table):
        return {"pe_norm": float(np.linalg.norm(table))}

    def baselines(self):
        return []

    def ground_truth(self):
        return {}


TOY = TaskKind(
    name="toy",
    defaults=dict(pe="learned,none", sigmas="0.1,1", seeds=1, steps=6, width=8, depth=1, heads=1, batch_size=8,
                  lr=1e-2, optimizer="adam", schedule="constant", warmup=0, eval_every=3, eval_items=32),
    presets={"tiny": dict(steps=4, eval_every=2)},
    pe_kinds=("learned", "none", "sin1d"),
    settings=(TaskSetting("toy_items", int, "training items", default=64, range=(8, None, "[)")),),
    summary=("train_acc", "test_acc", "pe_norm"),
    view=TaskView(score="test_acc", generalisation=("test_acc",), similarity=("pe_norm",),
                  summary=("test_acc", "pe_norm"), probe="neighbour", fit=None, figures=("learned_pe_fc",)),
    load=lambda s: ToyTask(s.toy_items),
    readout_token=ToyTask.readout_token,
    baselines=(),
    model_dims=lambda s: (FEATURES, 2),
)
FLAGS = ["--task", "toy", "--preset", "tiny", "--toy-items", "32", "--threads", "1"]


@pytest.fixture(scope="module")
def toy_registered():
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(KINDS, "toy", TOY)
        yield


@pytest.fixture(scope="module")
def finished_toy_run(toy_registered, tmp_path_factory):
    """One sweep of the toy task, for every test (each takes a copy: toy_run)."""
    out = tmp_path_factory.mktemp("toy") / "run"
    assert sweep_main([*FLAGS, "--out", str(out)]) == 0
    return out


@pytest.fixture
def toy_run(finished_toy_run, tmp_path):
    return Path(shutil.copytree(finished_toy_run, tmp_path / "run"))


def test_the_toy_task_sweeps_with_its_own_setting_and_preset(toy_run):
    settings = json.loads((toy_run / "config.json").read_text())["settings"]
    assert settings["task"] == "toy" and settings["toy_items"] == 32 and settings["steps"] == 4
    assert "atlas" not in settings and "lst_train" not in settings  # the other tasks' settings are theirs
    results = pd.read_parquet(toy_run / "results.parquet")
    assert sorted(results["pe"]) == ["learned", "learned", "none"] and results["test_acc"].between(0, 1).all()
    assert (results["steps"] == 4).all() and results.loc[results["pe"] == "learned", "pe_norm"].gt(0).all()


def test_the_report_reads_the_toy_task_from_its_view(toy_run):
    assert report_main([str(toy_run)]) == 0
    report = (toy_run / "report.md").read_text()
    assert "Task **toy**, 3 trained models." in report
    assert "| PE | σ | models | test_acc | pe_norm |" in report  # the view's summary columns
    assert "* learned PE: no ground_truth.npz (fc, networks) in the folder." in report  # the figure it asks for
    assert "### generalisation vs sigma" in report and (toy_run / "figures" / "generalisation_vs_sigma.png").is_file()


def test_resume_continues_the_toy_sweep_to_the_same_results(toy_run):
    first = pd.read_parquet(toy_run / "results.parquet").drop(columns="train_seconds")
    for name in ("results.parquet", "curves.parquet", "pe_tables.npz", "summary.txt"):
        (toy_run / name).unlink()
    for pack in (toy_run / "packs").iterdir():
        if pack.name == "1":  # one pack to train again
            for file in pack.iterdir():
                file.unlink()
            pack.rmdir()
    assert sweep_main(["--resume", "--out", str(toy_run), "--toy-items", "32"]) == 0  # repeated: allowed
    again = pd.read_parquet(toy_run / "results.parquet").drop(columns="train_seconds")
    pd.testing.assert_frame_equal(first, again)


@pytest.mark.parametrize("flags, message", [
    ([*FLAGS, "--toy-items", "4"], "--toy-items must be finite and ≥ 8, got 4"),
    (["--task", "lst", "--toy-items", "32"], "--toy-items applies to --task toy only"),
    (["--task", "toy", "--preset", "cpu"], "--preset cpu is not defined for --task toy; choose from tiny"),
    (["--task", "toy", "--pe", "sin2d"], "--pe 'sin2d' is not a PE of --task toy"),
])
def test_the_toy_task_refuses_bad_flags_in_one_line(toy_registered, tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    assert sweep_main(narrowed(*flags, "--out", str(out))) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_resume_refuses_a_changed_toy_setting(toy_run, capsys):
    (toy_run / "results.parquet").unlink()
    assert sweep_main(["--resume", "--out", str(toy_run), "--toy-items", "16"]) == 2
    assert "--toy-items 16 differs from its 32" in capsys.readouterr().err


# every registered task at its defaults (netsim's small), and the settings that change its tokens
@pytest.mark.parametrize("flags", [["--task", name] for name in KINDS if name != "netsim"] + [
    TINY_NETSIM, ["--task", "fmri", "--window", "3"], ["--task", "digits", "--tokens", "patches"],
    ["--task", "digits_class", "--tokens", "patches"]])
def test_each_task_s_model_dims_are_those_its_task_builds(flags):
    """TaskKind.model_dims, which a weights file's embedding and head are checked against without loading the
    task, is what the loaded task gives its models."""
    from pe_fast.sweep.task_loading import load_task
    s = settings_of(*flags)
    task = load_task(s)
    assert KINDS[s.task].model_dims(s.to_json()) == (task.token_dim, task.num_classes)
