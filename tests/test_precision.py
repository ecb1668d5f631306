"""--precision and --compile: bf16 under autocast matches float64 as closely as the reference does in bf16, keeps
float32 weights and optimizer state; a compiled step (also in the CUDA-graphs mode) trains like the eager one; the
sweep records the precision, keeps it on --resume and refuses what the device cannot run with one line."""
import json
import subprocess
import sys

import pandas as pd
import pytest
import torch

from op_harness import make_inputs
from pe_fast.models import ModelConfig
from pe_fast.ops import pe_attention
from pe_fast.tasks.lst import LSTTask
from pe_fast.train import PackTrainer, TrainConfig


def run_sweep(*args):
    return subprocess.run([sys.executable, "-m", "pe_fast.sweep", *args], capture_output=True, text=True,
                          timeout=600)


def test_op_under_autocast_is_as_close_to_float64_as_the_reference_in_bf16():
    inputs = make_inputs(2, 3, 17, 32, 2)
    exact, _ = pe_attention(inputs["x"], inputs["pe"], inputs["w"], inputs["b"], 2, inputs["probes"],
                            backend="reference")
    as_float = {k: None if v is None else v.float() for k, v in inputs.items()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, stats = pe_attention(as_float["x"], as_float["pe"], as_float["w"], as_float["b"], 2,
                                  as_float["probes"])
    assert out.dtype == torch.bfloat16 and stats.dtype == torch.float32
    low = {k: None if v is None else v.to(torch.bfloat16) for k, v in inputs.items()}
    reference_bf16, _ = pe_attention(low["x"], low["pe"], low["w"], low["b"], 2, low["probes"], backend="reference")
    error = (out.double() - exact).abs().max()
    reference_error = (reference_bf16.double() - exact).abs().max()
    assert 0 < error <= 2 * reference_error


@pytest.fixture(scope="module")
def lst_task():
    return LSTTask()


def lst_trainer(task, **train):
    config = ModelConfig(num_tokens=16, token_dim=5, out_dim=4, width=32, depth=2, heads=2, mlp_width=64,
                         readout_token=task.readout_token)
    return PackTrainer(task, config, TrainConfig(steps=100, batch_size=32, lr=1e-3, eval_every=100, **train),
                       [1, 2], [0.2, 1.0], torch.device("cpu"))


def losses(trainer, steps):
    for _ in range(steps):
        trainer.train_step()
    return trainer.loss_buffer[:steps].clone()


def test_bf16_training_keeps_float32_state_and_follows_fp32(lst_task):
    fp32, bf16 = lst_trainer(lst_task), lst_trainer(lst_task, precision="bf16")
    loss32, loss16 = losses(fp32, 6), losses(bf16, 6)
    assert {p.dtype for p in bf16.model.parameters()} == {torch.float32}
    assert {s.dtype for state in bf16.optimizer.state.values() for s in state.values() if s.dim()} == {torch.float32}
    assert bf16.stats_buffer.dtype == torch.float32
    # bf16 keeps 8 bits of mantissa: the losses agree to about 1 %, not to float32's 1e-6
    assert torch.allclose(loss16, loss32, rtol=3e-2)
    assert not torch.equal(loss16, loss32)  # the bf16 path did run in bf16


# "graphs" is CUDA graphs on a GPU; here it runs torch.compile's reduce-overhead mode, which skips the graphs off
# CUDA: this checks the step's plumbing (the per-step graph marker, outputs copied out), not the replay.
@pytest.mark.parametrize("mode", ["on", "graphs"])
def test_compiled_step_trains_like_the_eager_one(lst_task, mode):
    eager, compiled = lst_trainer(lst_task), lst_trainer(lst_task, compile=mode)
    for trainer in (eager, compiled):  # one batch, forward and backward: the same gradients
        loss, stats = trainer.forward_loss(*trainer.batches(trainer.sampler.next()))
        loss.sum().backward()
    for a, b in zip(compiled.model.parameters(), eager.model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6)
    for trainer in (eager, compiled):
        trainer.optimizer.zero_grad()
    # and the same losses over the next steps (Adam's normalised updates amplify rounding in the weights
    # themselves, so those are not compared)
    torch.testing.assert_close(losses(compiled, 4), losses(eager, 4), rtol=1e-4, atol=1e-5)


TINY = ["--task", "lst", "--pe", "learned", "--sigmas", "0.5", "--seeds", "1", "--steps", "4", "--eval-every", "2",
        "--width", "16", "--depth", "1", "--batch-size", "16", "--no-report"]


def test_sweep_records_bf16_and_keeps_it_on_resume(tmp_path):
    out = tmp_path / "run"
    proc = run_sweep(*TINY, "--precision", "bf16", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "config.json").read_text())["settings"]["precision"] == "bf16"
    assert set(pd.read_parquet(out / "results.parquet")["precision"]) == {"bf16"}
    refused = run_sweep("--resume", "--out", str(out), "--precision", "fp32")
    assert refused.returncode == 2 and "--precision" in refused.stderr


def test_default_precision_on_the_cpu_is_fp32(tmp_path):
    out = tmp_path / "run"
    assert run_sweep(*TINY, "--out", str(out)).returncode == 0
    assert json.loads((out / "config.json").read_text())["settings"]["precision"] == "fp32"


@pytest.mark.skipif(torch.cuda.is_available(), reason="tf32 and CUDA graphs run on CUDA")
@pytest.mark.parametrize("flags", [("--precision", "tf32"), ("--compile", "graphs")])
def test_a_cuda_only_mode_on_the_cpu_is_one_line_and_no_folder(tmp_path, flags):
    out = tmp_path / "run"
    proc = run_sweep(*TINY, *flags, "--out", str(out))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and " ".join(flags) in lines[0], proc.stderr
    assert not out.exists()
