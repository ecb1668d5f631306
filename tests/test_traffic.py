"""bench/training/traffic.py's byte ledger of the training step against counts made by hand, from closed-form shapes,
for a tiny step of the sweep's own configuration (netsim: 2 models, batch 2, N 12 nodes, d 8, one block, MLP 32,
float32), and its counting rules on single ops."""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # as the script puts it: its kinds are packages
traffic = importlib.import_module("training.traffic")

M, B, N, D, MLP = 2, 2, 12, 8, 32
TOKEN_DIM, OUT = 2, 1  # netsim: each token is a region's value and its mask flag; one value predicted per token
K = 3  # netsim's probes
FLOAT = 4
SWEEP_FLAGS = ["--task", "netsim", "--nodes", str(N), "--modules", "3", "--timepoints", "200", "--runs", "4",
               "--width", str(D), "--depth", "1", "--heads", "1", "--mlp-width", str(MLP), "--batch-size", str(B),
               "--pe", "learned", "--sigmas", "1", "--seeds", str(M), "--optimizer", "adamw", "--lr", "1e-3"]
ROWS = B * N  # rows of one model's activations
MASKED = round(0.2 * N)  # netsim's masked tokens per item (--mask-fraction 0.2)
# rows after the last block's attention: a training step computes the outputs at the masked tokens alone
OUT_ROWS = B * MASKED
# (fan in, fan out, rows) of every StackedLinear of the model, in order: embedding, attention output, MLP in and out,
# head (the one block is the last)
LINEARS = [(TOKEN_DIM, D, ROWS), (D, D, OUT_ROWS), (D, MLP, OUT_ROWS), (MLP, D, OUT_ROWS), (D, OUT, OUT_ROWS)]


@pytest.fixture(scope="module")
def ledger() -> traffic.Ledger:
    _, task, model_config, train_config, seeds, sigmas = traffic.sweep_pack(SWEEP_FLAGS, None, None)
    assert (model_config.num_tokens, model_config.token_dim, model_config.out_dim, len(seeds)) == (N, TOKEN_DIM, OUT, M)
    return traffic.step_ledger(task, model_config, train_config, seeds, sigmas)


def entry(ledger, phase: str, op: str) -> traffic.Entry:
    return next(e for e in ledger.entries.values() if (e.phase, e.op) == (phase, op))


def test_the_qkv_projection_moves_its_input_and_weights_in_and_q_k_v_out(ledger):
    projection = entry(ledger, "forward", "pe_fast::pe_attention projection")
    assert projection.calls == 1 and projection.kind == "fused op"
    assert projection.read == (M * ROWS * D + M * D * 3 * D) * FLOAT  # x, w_qkv
    assert projection.written == M * ROWS * 3 * D * FLOAT  # q, k, v
    assert projection.flops == 2 * M * ROWS * D * 3 * D


def test_each_layer_norm_reads_its_input_and_writes_output_mean_and_inverse_deviation(ledger):
    norm = entry(ledger, "forward", "aten.native_layer_norm.default")
    assert norm.calls == 2  # after the attention and after the MLP, at the masked tokens
    assert norm.read == 2 * M * OUT_ROWS * D * FLOAT
    assert norm.written == 2 * (M * OUT_ROWS * D + 2 * M * OUT_ROWS) * FLOAT


def test_fused_adamw_reads_four_and_writes_three_floats_per_parameter(ledger):
    per_model = (sum(fan_in * fan_out + fan_out for fan_in, fan_out, _ in LINEARS)
                 + D * 3 * D + 3 * D  # the QKV projection
                 + 2 * 2 * D  # two layer norms' scale and shift
                 + N * D)  # the learned PE
    tensors = 2 * len(LINEARS) + 2 + 4 + 1  # each with its step count, one float32 scalar
    adamw = entry(ledger, "update", "aten._fused_adamw_.default")
    assert adamw.read == 4 * M * per_model * FLOAT + tensors * FLOAT  # parameters, gradients, both moments
    assert adamw.written == 3 * M * per_model * FLOAT  # not the gradients


def test_the_linear_layers_do_three_times_their_forward_flops_but_the_embedding_two(ledger):
    forward = [2 * M * rows * fan_in * fan_out for fan_in, fan_out, rows in LINEARS]
    expected = 3 * sum(forward) - forward[0]  # the tokens need no gradient
    gemms = sum(e.flops for e in ledger.entries.values() if e.op in ("aten.baddbmm.default", "aten.bmm.default"))
    assert gemms == expected


def test_the_bias_broadcast_into_each_linear_layers_output_is_a_materialised_broadcast(ledger):
    copy = entry(ledger, "forward", "aten.baddbmm.default: C copied into the output")
    assert copy.kind == "materialised broadcast" and copy.calls == len(LINEARS)
    assert copy.read == sum(M * fan_out for _, fan_out, _ in LINEARS) * FLOAT  # each bias [M, 1, out] once
    assert copy.written == sum(M * rows * fan_out for _, fan_out, rows in LINEARS) * FLOAT
    gemm = entry(ledger, "forward", "aten.baddbmm.default")  # reads the copy back as C
    assert gemm.read == sum(M * rows * fan_in + M * fan_in * fan_out + M * rows * fan_out
                            for fan_in, fan_out, rows in LINEARS) * FLOAT


def test_per_model_step_totals_and_the_ceiling(ledger):
    moved = sum(e.read + e.written for e in ledger.entries.values())
    assert ledger.bytes_per_model_step == moved / M
    assert ledger.ceilings(4.3e12, 1e14)["bandwidth"] == pytest.approx(4.3e12 * M / moved)
    assert {e.phase for e in ledger.entries.values()} == set(traffic.PHASES)


def counted(function) -> traffic.Ledger:
    """The ledger of `function`'s ops (real CPU tensors)."""
    ledger = traffic.Ledger(num_models=1)
    with traffic.CountingMode(ledger):
        function()
    return ledger


def test_copying_an_expanded_view_out_is_a_materialised_broadcast_and_views_move_nothing():
    column = torch.zeros(4, 1)
    ledger = counted(lambda: column.expand(4, 8).t().contiguous())
    (clone,) = ledger.entries.values()  # expand and t are views: no entries
    assert (clone.op, clone.kind) == ("aten.clone.default", "materialised broadcast")
    assert (clone.read, clone.written) == (4 * FLOAT, 32 * FLOAT)


def test_an_in_place_op_writes_its_tensor_once_and_an_elementwise_broadcast_reads_the_stored_elements():
    x, row = torch.zeros(4, 8), torch.zeros(8)
    ledger = counted(lambda: x.add_(row))
    (add,) = ledger.entries.values()
    assert (add.read, add.written, add.kind) == ((32 + 8) * FLOAT, 32 * FLOAT, "")


def test_the_command_line_writes_the_ledger(tmp_path, capsys):
    out = tmp_path / "ledger.json"
    assert traffic.main([*SWEEP_FLAGS, "--precision", "bf16", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "torch.compile's fusion is not counted" in printed and "materialised broadcast" in printed
    written = json.loads(out.read_text())
    assert written["settings"]["precision"] == "bf16" and written["bytes_per_model_step"] > 0
    assert {"bandwidth", "compute"} == set(written["ceiling_model_steps_per_s"])
    projection = next(row for row in written["rows"] if row["op"] == "pe_fast::pe_attention projection")
    assert projection["bytes_written_per_model_step"] == ROWS * 3 * D * 2  # q, k, v in bf16


def test_under_bf16_autocast_the_layer_norm_runs_in_float32_as_on_cuda():
    # Without a PE the first block's residual sum stays bf16: CUDA's autocast casts it to float32 for the layer
    # norm, CPU's (which the fake tensors run under) would not.
    _, task, model_config, train_config, seeds, sigmas = traffic.sweep_pack(
        [*SWEEP_FLAGS[:SWEEP_FLAGS.index("--pe")], "--pe", "none", *SWEEP_FLAGS[SWEEP_FLAGS.index("--seeds"):]],
        None, "bf16")
    ledger = traffic.step_ledger(task, model_config, train_config, seeds, sigmas)
    norm = entry(ledger, "forward", "aten.native_layer_norm.default")
    assert norm.read == 2 * M * OUT_ROWS * D * FLOAT
