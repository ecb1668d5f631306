"""Results files of earlier pe_fast versions read as today's, through pe_fast.results.migrate alone: config.json by
the report (reading.recorded_settings) and by --resume alike, checkpoints by run_folder.load_checkpoint."""
import json
import shutil

import numpy as np
import pandas as pd
import torch

from pe_fast.models import ModelConfig, StackedTransformer
from pe_fast.results import migrate, run_folder
from pe_fast.results.settings import LIST_SETTINGS, Settings
from pe_fast.sweep.cli import main as sweep_main
from sweep_harness import TINY_NETSIM, settings_of

FLAGS = [*TINY_NETSIM, "--pe", "learned", "--sigmas", "0.5", "--seeds", "1", "--steps", "4", "--eval-every", "2",
         "--lr", "0.003", "--optimizer", "adam", "--threads", "1"]
TODAY = settings_of(*FLAGS).to_json()


def older(settings: dict) -> dict:
    """The same settings as a config.json from before the optimizer axes (one lr, one optimizer, ... as a plain
    value), before --precision was resolved, and with a setting since removed."""
    old = {**settings, "precision": None, "logs": "logs"}
    for name in ("lr", "optimizer", "weight_decay", "momentum"):
        old[name] = settings[name][0]
    return old


def test_migrate_turns_an_older_config_into_todays():
    migrated = migrate.settings(older(TODAY))
    assert migrated == {**TODAY, "precision": "fp32"}
    assert all(isinstance(migrated[name], list) for name in LIST_SETTINGS if migrated.get(name) is not None)


def test_migrate_leaves_todays_config_as_it_is():
    assert migrate.settings(TODAY) == TODAY


def test_the_report_reads_an_older_config_as_todays():
    assert Settings.from_json(migrate.settings(older(TODAY)), packs=[[0]]) == Settings.from_json(TODAY, packs=[[0]])


def test_resume_continues_a_sweep_recorded_by_an_older_pe_fast(tmp_path):
    """A sweep interrupted under an older pe_fast (its config.json rewritten in the older form) continues: the
    pack trained again gives the results it gave before."""
    out = tmp_path / "run"
    assert sweep_main([*FLAGS, "--no-report", "--out", str(out)]) == 0
    first = pd.read_parquet(out / "results.parquet").drop(columns="train_seconds")
    config = json.loads((out / "config.json").read_text())
    config["settings"] = older(config["settings"])
    (out / "config.json").write_text(json.dumps(config))
    for name in ("results.parquet", "curves.parquet", "pe_tables.npz", "summary.txt"):
        (out / name).unlink()
    shutil.rmtree(out / "packs" / "0")
    assert sweep_main(["--resume", "--out", str(out), "--no-report"]) == 0
    again = pd.read_parquet(out / "results.parquet").drop(columns="train_seconds")
    pd.testing.assert_frame_equal(first, again)


# ---- checkpoints ----


def test_checkpoints_from_before_blocks_held_a_pe_attention_still_load():
    """A sweep killed before the upgrade resumes: the old parameter names map onto the new ones."""
    config = ModelConfig(num_tokens=5, token_dim=3, out_dim=2, width=8, depth=2, heads=2, mlp_width=16)
    trained = StackedTransformer(config, [1, 2], [0.5, 1.0])
    old_names = {new: old for old, new in migrate.OLD_BLOCK_NAMES.items()}
    old_state = {}
    for key, value in trained.state_dict().items():
        prefix, _, rest = key.partition(".attention.") if ".attention." in key else (key, "", "")
        old_state[f"{prefix}.{old_names['attention.' + rest]}" if rest else key] = value
    assert any(".attn_out.weight" in k for k in old_state) and not any(".attention." in k for k in old_state)
    fresh = StackedTransformer(config, [3, 4], [0.5, 1.0])
    fresh.load_state_dict(migrate.checkpoint({"model": old_state})["model"])
    for (name, a), b in zip(trained.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name


def test_checkpoints_with_numpy_tables_load_as_tensors(tmp_path):
    """Checkpoints written before 2026-11-26 hold the initial PE tables as numpy arrays."""
    table = np.arange(6, dtype=np.float32).reshape(2, 3)
    run_folder.save_checkpoint(tmp_path, 0, {"step": 1, "initial_pe": [table]})
    loaded = run_folder.load_checkpoint(tmp_path, 0)
    assert isinstance(loaded["initial_pe"][0], torch.Tensor) and np.array_equal(loaded["initial_pe"][0].numpy(), table)
