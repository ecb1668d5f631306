"""The main job's CPU training step: the pack `python -m pe_fast.sweep --task fmri` trains, step by step.

    python bench/training/bench_main_job_step.py [--repeats 15] [--out bench/results/main_job_step_cpu.json]

Builds the sweep's own pack for the default flags (or those after `--`: `... -- --task fmri --atlas glasser360`),
then times full training steps (forward, backward, Adam) with the C++ sublayer ends (pe_fast.ops.sublayer_ends)
and with torch's ops in their place, in turn within every round (a shared machine's slow spells hit both), and
a 2048³ matmul in the same rounds. Reports the median step, model-steps/s, GFLOP/s (the step's matmul and
attention FLOPs, forward + backward = 3 × forward) and their share of the large matmul's rate, and the speed-up.
The attention kernels' own changes are measured against a git revision by bench/op/kernel_ab.sh.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure.py, the scripts as kind.name
import measure

from pe_fast.ops import sublayer_ends
from pe_fast.sweep import settings as sweep_settings
from pe_fast.sweep.executors import apply_runtime
from pe_fast.sweep.grid import choose_pack_size, expand_grid, pack_models, pack_trainer
from pe_fast.sweep.task_loading import load_task


def step_flops(config, batch: int) -> float:
    """Matmul and attention FLOPs one model executes in a training step: per token and block the QKV projection,
    QKᵀ and PV over N keys, the output projection and the MLP; the embedding and the head; ×3 for the backward."""
    D, N, F = config.width, config.num_tokens, config.mlp_width
    per_token_block = 2 * D * 3 * D + 2 * 2 * N * D + 2 * D * D + 2 * 2 * D * F
    per_token = config.depth * per_token_block + 2 * config.token_dim * D + 2 * D * config.out_dim
    return 3.0 * batch * N * per_token


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", default="bench/results/main_job_step_cpu.json")
    p.add_argument("sweep_flags", nargs="*", help="the sweep's flags, after --; default: --task fmri")
    args = p.parse_args()
    flags = args.sweep_flags or ["--task", "fmri"]
    s = sweep_settings.from_flags(sweep_settings.build_parser().parse_args([*flags, "--out", "unused"]))
    apply_runtime(s)
    task = load_task(s)
    s = dataclasses.replace(s, max_pack=choose_pack_size(s, task))
    pack = pack_models(s, expand_grid(s))[0]
    trainer = pack_trainer(s, task, pack)
    config = trainer.model_config
    size = 2048
    a, b = torch.randn(size, size), torch.randn(size, size)
    built = sublayer_ends.BUILT  # False without the C++ extension: then both variants run torch's ops
    variants = {"sublayer ends fused": True, "torch's ops": False}
    times = {name: [] for name in (*variants, "large matmul")}
    print(f"{len(pack)} models, {torch.get_num_threads()} threads; {args.repeats} rounds; "
          f"{measure.instruction_set_line()}", flush=True)
    for round_ in range(args.repeats + 2):  # two warm-up rounds
        for name, fused in variants.items():
            sublayer_ends.BUILT = fused and built
            start = time.perf_counter()
            trainer.train_step()
            elapsed = time.perf_counter() - start
            trainer.filled = 0  # no evaluation window: the buffers are overwritten
            if round_ >= 2:
                times[name].append(elapsed)
        start = time.perf_counter()
        a @ b
        if round_ >= 2:
            times["large matmul"].append(time.perf_counter() - start)
    sublayer_ends.BUILT = built
    large_gflops = 2 * size ** 3 / statistics.median(times["large matmul"]) / 1e9
    flops = step_flops(config, s.batch_size) * len(pack)
    rows = []
    for name in variants:
        step = statistics.median(times[name])
        gflops = flops / step / 1e9
        rows.append({"variant": name, "step_ms": 1e3 * step, "model_steps_per_s": len(pack) / step,
                     "gflops": gflops, "share_of_large_matmul": gflops / large_gflops,
                     "all_ms": [1e3 * t for t in times[name]]})
        print(f"{name:22s} {1e3 * step:7.1f} ms  {len(pack) / step:6.1f} model-steps/s  {gflops:5.1f} GFLOP/s "
              f"({100 * gflops / large_gflops:.0f} % of the large matmul's {large_gflops:.0f})", flush=True)
    speedup = statistics.median([t / f for f, t in zip(times["sublayer ends fused"], times["torch's ops"])])
    print(f"speed-up of the fused sublayer ends: {speedup:.2f}x (median of the rounds' ratios)")
    measure.write_result(args.out, {"benchmark": "main_job_step", "sweep_flags": flags, "models": len(pack),
                                    "gflop_per_model_step": step_flops(config, s.batch_size) / 1e9,
                                    "large_matmul_gflops": large_gflops, "speedup": speedup,
                                    "cpu_threads": torch.get_num_threads(), "torch": torch.__version__,
                                    "environment": measure.environment("cpu"), "rows": rows})
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
