"""pe_fast.columns: every generated column name is built and read back by the same module; what the trainer writes
the report and the live curves read, part for part."""
import numpy as np
import pandas as pd
import pytest

from pe_fast import columns
from pe_fast.ops import STAT_NAMES
from pe_fast.report.numbers import layer_head_mean, probe_names
from pe_fast.sweep.live_curves import tag
from pe_fast.train import stat_columns


def test_attention_columns_read_back_into_their_parts():
    for prefix in (columns.attention_prefix(), columns.attention_prefix("test"), columns.attention_prefix("ood")):
        for stat in (*STAT_NAMES, columns.probe_stat("same_network")):
            parsed = columns.parse_attention_column(columns.attention_column(prefix, 3, 12, stat))
            assert parsed == columns.AttentionColumn(prefix, 3, 12, stat)
    assert columns.parse_attention_column(columns.attention_column("attn", 0, 0, "probe_fc")).probe == "fc"
    for other in ("attn_map_alignment", "test_r2", columns.ATTN_CHANGE, columns.weight_drift(1)):
        assert columns.parse_attention_column(other) is None


def test_what_the_trainer_writes_the_report_and_live_curves_read():
    L, M, H = 2, 3, 2
    names = [*STAT_NAMES, "probe_same_row", "probe_near"]
    # each value encodes its own (layer, model, head, stat): a mix-up of any index shows
    stats = np.array([[[[1000 * l + 100 * m + 10 * h + s for s in range(len(names))] for h in range(H)]
                       for m in range(M)] for l in range(L)], dtype=float)
    rows = stat_columns(stats, ["same_row", "near"], columns.attention_prefix("ood"))
    frame = pd.DataFrame(rows)
    assert probe_names(frame) == ["same_row", "near"]
    for s, stat in enumerate(names):
        mean = layer_head_mean(frame, "ood_attn", stat)
        expected = [np.mean([1000 * l + 100 * m + 10 * h + s for l in range(L) for h in range(H)]) for m in range(M)]
        np.testing.assert_allclose(mean.to_numpy(), expected)
    assert tag(columns.attention_column("ood_attn", 1, 0, "entropy")) == "ood_attn/l1_h0_entropy"
    assert tag("test_r2") == "test_r2"


def test_score_columns_say_their_split_direction_and_scale():
    assert columns.score("test", columns.R2) == "test_r2"
    assert columns.score("ood", columns.ACCURACY, "binary") == "ood_acc_binary"
    assert [columns.score_split(c) for c in ("test_r2", "ood_acc", "ood_acc_binary", "train_mse")] == \
        ["test", "ood", "ood", "train"]
    assert [columns.lower_is_better(c) for c in ("train_mse", "test_r2", "ood_acc", "pe_fc_corr")] == \
        [True, False, False, False]
    assert [columns.in_percent(c) for c in ("ood_acc", "ood_acc_binary", "test_r2", "pe_rsa", "test_mse")] == \
        [True, True, False, False, False]
    for bad in (("test", "auc"), ("my_split", columns.R2)):
        with pytest.raises(ValueError):
            columns.score(*bad)
    with pytest.raises(ValueError):
        columns.score_split("pe_fc_corr")


def test_every_task_view_names_score_columns():
    """The report and the stopping rule read each registered task's score, fit and generalisation columns through
    columns.score_split / lower_is_better: each must parse as a score of one of the splits."""
    from pe_fast.tasks import KINDS
    for name, kind in KINDS.items():
        for column in filter(None, (kind.view.score, kind.view.fit, *kind.view.generalisation)):
            assert columns.score_split(column) in ("train", "test", "ood"), (name, column)
