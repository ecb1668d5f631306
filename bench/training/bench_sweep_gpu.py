"""The sweep's own training path at the paper's LST configuration, per precision, against the authors' loop.

    python bench/training/bench_sweep_gpu.py [--models 90,315] [--precisions fp32,tf32,bf16] [--compile off,on,graphs]
                                    [--out bench/results/sweep_gpu.json]

Each configuration builds a pe_fast.train.PackTrainer on the LST task (the sweep's class, task, batches,
statistics buffers and fused AdamW) with the authors' architecture and optimiser (d 160, 4 blocks, 1 head,
MLP 640, batch 128, AdamW lr 1e-4, learned PE over the paper's σ grid) and times:
  * training steps: --repeats rounds of --steps steps after --warmup steps (compilation happens there), each
    round ended by a device sync; the median round gives the step time;
  * one intermediate evaluation (--eval-items items per split, as the sweep does) and one full evaluation.
The rate *including evaluations* spreads them over the paper's schedule (252,000 steps, an evaluation every
12,600: 20 intermediate ones and a full one at the end). A pack larger than the sweep would choose (half the
free device memory, pe_fast.memory) is trained as several packs one after another, as the sweep would.

The baseline is the authors' loop: one float32 model (torch.nn.MultiheadAttention, post-LN, GELU after both
MLP linears, a learned PE per block, readout at the last cell) trained with AdamW on batches of the same data,
one model at a time, timed in the same process. FLOPs per model-step are bench_training.step_flops (the
matmuls of forward + backward); the device's peak is its dense tensor-core rate for tf32 / bf16 and its
CUDA-core rate for fp32. bytes_per_model_step is bench/training/traffic.py's count of the same step's eager kernels
(with --compile on/graphs too: torch.compile's fusion is not counted). One JSON record per configuration, written after
each (a time limit keeps what ran).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure.py, the scripts as kind.name
import measure

from pe_fast import memory, precision
from pe_fast.models import ModelConfig
from pe_fast.ops.backends import resolve_backend
from pe_fast.sweep.grid import split_into_packs
from pe_fast.tasks.lst import LSTTask
from pe_fast.train import PackTrainer, TrainConfig, compile_problem
from training.bench_training import step_flops
from training.traffic import peak_tflops, step_ledger

WIDTH, DEPTH, MLP, BATCH, LR = 160, 4, 640, 128, 1e-4
PAPER_SIGMAS = [s / 10 for s in range(1, 21)]
PAPER_MODELS, PAPER_STEPS, PAPER_EVAL_EVERY = 315, 252_000, 12_600


class AuthorsLST(nn.Module):
    """One model as the authors wrote it (their LST code): plain torch modules, post-LN, float32."""

    def __init__(self, sigma: float):
        super().__init__()
        self.embed = nn.Linear(5, WIDTH)
        self.pe = nn.ParameterList(nn.Parameter(torch.randn(16, WIDTH) * sigma) for _ in range(DEPTH))
        self.attention = nn.ModuleList(nn.MultiheadAttention(WIDTH, 1, batch_first=True) for _ in range(DEPTH))
        self.norm1 = nn.ModuleList(nn.LayerNorm(WIDTH) for _ in range(DEPTH))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, MLP), nn.GELU(), nn.Linear(MLP, WIDTH), nn.GELU())
                                 for _ in range(DEPTH))
        self.norm2 = nn.ModuleList(nn.LayerNorm(WIDTH) for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in range(DEPTH):
            h = h + self.pe[block]
            h = self.norm1[block](self.attention[block](h, h, h, need_weights=False)[0] + h)
            h = self.norm2[block](self.mlp[block](h) + h)
        return self.head(h[:, -1])


def authors_loop(task: LSTTask, device: torch.device, steps: int, repeats: int) -> float:
    """Model-steps/s of the authors' one-model training loop, float32 as they ran it."""
    torch.manual_seed(0)
    model = AuthorsLST(0.2).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    x, y = task.splits["train"].x.to(device), task.splits["train"].y.to(device)

    def step():
        index = torch.randint(0, len(y), (BATCH,), device=device)
        loss = nn.functional.cross_entropy(model(x[index]), y[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(5):
        step()
    rates = []
    for _ in range(repeats):
        measure.synchronize(device)
        start = time.perf_counter()
        for _ in range(steps):
            step()
        measure.synchronize(device)
        rates.append(steps / (time.perf_counter() - start))
    return statistics.median(rates)


def pack_size_for(models: int, config: ModelConfig, device: torch.device, task: LSTTask) -> int:
    """The sweep's choice: as many as fit in half the free memory (choose_pack_size), split into packs of
    near-equal size (split_into_packs)."""
    per_model = memory.bytes_per_model(config, BATCH, "adamw", resolve_backend(None, device), task.coordinates)
    fits = memory.pack_size(per_model, memory.free_bytes(device))
    return len(split_into_packs([dict(pe="learned")] * models, fits)[0])


def time_sweep_path(task: LSTTask, models: int, precision_name: str, compile_mode: str, device: torch.device,
                    steps: int, warmup: int, repeats: int, eval_items: int, backend: str | None = None) -> dict:
    precision.apply(precision_name)
    config = ModelConfig(num_tokens=16, token_dim=5, out_dim=4, width=WIDTH, depth=DEPTH, heads=1, mlp_width=MLP,
                         pe="learned", readout_token=task.readout_token, backend=backend)
    pack = pack_size_for(models, config, device, task)
    train = TrainConfig(steps=PAPER_STEPS, batch_size=BATCH, lr=LR, optimizer="adamw",
                        eval_every=warmup + steps * repeats, eval_items=eval_items, precision=precision_name,
                        compile=compile_mode)
    sigmas = [PAPER_SIGMAS[m % len(PAPER_SIGMAS)] for m in range(pack)]
    # what the step moves, eager (bench/training/traffic.py: fake tensors, no device time)
    moved = step_ledger(task, config, train, list(range(pack)), sigmas).bytes_per_model_step
    trainer = PackTrainer(task, config, train, list(range(pack)), sigmas, device)
    started = time.perf_counter()
    for _ in range(warmup):
        trainer.train_step()
    measure.synchronize(device)
    warmup_s = time.perf_counter() - started
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            trainer.train_step()
        measure.synchronize(device)
        rounds.append((time.perf_counter() - start) / steps)
    step_s = statistics.median(rounds)
    trainer.evaluate(trainer.step, final=False)  # warm: the evaluation's shapes are new
    evals = []
    for final in (False, True):
        measure.synchronize(device)
        start = time.perf_counter()
        trainer.evaluate(trainer.step, final=final)
        measure.synchronize(device)
        evals.append(time.perf_counter() - start)
    intermediate = PAPER_STEPS // PAPER_EVAL_EVERY  # at step 0 and every 12,600 before the last
    pack_seconds = PAPER_STEPS * step_s + intermediate * evals[0] + evals[1]
    packs = math.ceil(models / pack)
    with_evals = models * PAPER_STEPS / (packs * pack_seconds)
    del trainer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return dict(models=models, pack_size=pack, packs=packs, compile=compile_mode, backend=backend or "default",
                bytes_per_model_step=moved,
                step_ms=step_s * 1e3, step_ms_rounds=[r * 1e3 for r in rounds], warmup_s=warmup_s,
                train_model_steps_per_s=pack / step_s, model_steps_per_s=with_evals,
                eval_intermediate_s=evals[0], eval_full_s=evals[1],
                paper_sweep_hours=PAPER_MODELS * PAPER_STEPS / with_evals / 3600)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="90,315", help="comma-separated numbers of models")
    p.add_argument("--precisions", default="fp32,tf32,bf16")
    p.add_argument("--compile", default="off",
                   help="comma-separated: off, on (torch.compile of the step), graphs (compiled, replayed as "
                        "CUDA graphs)")
    p.add_argument("--steps", type=int, default=20, help="steps per timed round")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--eval-items", type=int, default=2048, help="items per split of an intermediate evaluation")
    p.add_argument("--baseline-steps", type=int, default=50)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backend", help="the models' compute path (pe_fast.models.transformer.compute_paths), e.g. "
                                     "fused; default: the fastest on the device")
    p.add_argument("--out", default="bench/results/sweep_gpu.json")
    p.add_argument("--science-check", type=Path,
                   help="the verdicts JSON of bench/science/precision_check.py --verdicts on this kind of device: "
                        "each record then says science_check pass or fail for its precision (else 'not run')")
    args = p.parse_args()
    try:
        models = [int(m) for m in args.models.split(",")]
        precisions = args.precisions.split(",")
        compiles = args.compile.split(",")
        device = torch.device(args.device)
        for mode in compiles:
            if (why := compile_problem(mode, device)) is not None:
                raise ValueError(f"--compile {mode}: {why}")
        if any(m <= 0 for m in models):
            raise ValueError("--models must be positive")
        for name in precisions:
            if (why := precision.problem(name, device)) is not None:
                raise ValueError(f"--precisions {name}: {why}")
    except (KeyError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    checked = json.loads(args.science_check.read_text())["verdicts"] if args.science_check else {}
    checked.setdefault("fp32", "pass")  # the reference of the science check passes by definition
    memory.keep_freed_memory()
    task = LSTTask()
    device_name = measure.device_name(device)
    fp32_kernel_dots = None  # how the Triton kernels multiply float32 (PE_FAST_TF32); the CPU has no Triton path
    if device.type == "cuda":
        from pe_fast.ops import triton_attention
        fp32_kernel_dots = triton_attention.dot_precision(torch.float32)
    precision.apply("fp32")
    baseline = authors_loop(task, device, args.baseline_steps, args.repeats)
    print(f"{device_name}: authors' one-model loop (fp32) {baseline:.1f} model-steps/s", flush=True)
    flops = step_flops(WIDTH, DEPTH, BATCH, MLP)
    records = []
    for precision_name in precisions:
        for compile_mode in compiles:
            for count in models:
                try:
                    row = time_sweep_path(task, count, precision_name, compile_mode, device, args.steps, args.warmup,
                                          args.repeats, args.eval_items, args.backend)
                except Exception as error:  # an out-of-memory or compile failure is a result too
                    row = dict(models=count, compile=compile_mode, error=f"{type(error).__name__}: {error}"[:300])
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                peak = peak_tflops(device_name, precision_name)
                record = dict(device=device_name, precision=precision_name,
                              science_check=checked.get(precision_name, "not run"),
                              fp32_kernel_dots=fp32_kernel_dots, **row,
                              baseline_model_steps_per_s=baseline, baseline_precision="fp32",
                              torch=torch.__version__, time=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
                if "error" not in row:
                    tflops = flops * row["train_model_steps_per_s"] / 1e12
                    record.update(tflops=tflops, peak_tflops=peak,
                                  peak_fraction=None if peak is None else tflops / peak,
                                  speedup_over_baseline=row["model_steps_per_s"] / baseline)
                    print(f"{precision_name} compile={compile_mode} M={count} (packs of "
                          f"{row['pack_size']}): {row['step_ms']:.1f} ms/step, {row['train_model_steps_per_s']:,.0f} "
                          f"model-steps/s training, {row['model_steps_per_s']:,.0f} with evaluations, "
                          f"{tflops:.1f} TFLOP/s" + (f" ({100 * tflops / peak:.1f} % of peak)" if peak else "")
                          + f", paper sweep {row['paper_sweep_hours']:.1f} h, {record['speedup_over_baseline']:.1f}×"
                          f" the authors' loop", flush=True)
                else:
                    print(f"{precision_name} compile={compile_mode} M={count}: {row['error']}", flush=True)
                records.append(record)
                measure.write_result(args.out, {"benchmark": "sweep_gpu", "records": records})
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
