"""Where a stacked CPU training step spends its time, by ablation.

    python bench/training/bench_step_breakdown.py [--width 64] [--batch 32] [--models 16] [--repeats 15]

Times the full training step of bench_training.py (LST shape: 16 tokens, 4 blocks, 1 head, MLP 4·d, fused
AdamW) against variants with one part replaced by something almost free, in turn within every round (a shared
machine's slow spells hit all variants alike); reports medians and each variant's time saved as a share of the
full step. The variants are not the model (their numbers are meaningless); only their step times are used:
  no-attention-core  pe_attention returns the value projection instead of attending (the QKV projection stays);
  no-gelu            the MLP's GELUs are the identity;
  no-layernorm       the layer norms are the identity.
A profiler attributes time less reliably here: it inflates small ops and hides page faults.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure.py, the scripts as kind.name
import measure

import pe_fast.models.transformer as transformer
import pe_fast.nn as layers
from pe_fast.memory import keep_freed_memory
from pe_fast.ops import reference
from pe_fast.train import make_optimizer
from training.bench_training import SWEEP_OPTIMIZER, lst_model, random_batch, training_step


def values_only(h, pe, w_qkv, b_qkv, num_heads, probes=None, rope=None, bias=None, backend=None):
    """The QKV projection of pe_attention without the attention: returns v."""
    qkv = reference.project_qkv(h, pe, w_qkv, b_qkv)
    D = h.shape[-1]
    return qkv[..., 2 * D:], torch.zeros(h.shape[0], num_heads, 3)


def replace(module, name, value):
    original = getattr(module, name)
    setattr(module, name, value)
    return lambda: setattr(module, name, original)


VARIANTS = {
    "full": lambda: (lambda: None),
    "no-attention-core": lambda: replace(layers, "pe_attention", values_only),
    "no-gelu": lambda: replace(transformer.F, "gelu", lambda x: x),
    "no-layernorm": lambda: replace(layers.StackedLayerNorm, "forward", lambda self, x: x),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--models", type=int, default=16)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", default="bench/results/step_breakdown_cpu.json")
    args = p.parse_args()
    keep_freed_memory()
    cpu = torch.device("cpu")
    tokens, targets = random_batch(args.models, args.batch, cpu)
    pack = lst_model(args.width, 4, list(range(args.models)), cpu)
    optimizer = make_optimizer(pack.parameters(), SWEEP_OPTIMIZER)
    times = {name: [] for name in VARIANTS}
    for round_ in range(args.repeats + 2):  # two warm-up rounds
        for name, apply in VARIANTS.items():
            undo = apply()
            start = time.perf_counter()
            training_step(pack, optimizer, tokens, targets)
            elapsed = time.perf_counter() - start
            undo()
            if round_ >= 2:
                times[name].append(elapsed)
    full = times["full"]
    rows = []
    for name, t in times.items():
        saved = statistics.median([(f - v) / f for f, v in zip(full, t)])
        rows.append({"variant": name, "step_ms": 1e3 * statistics.median(t), "share_of_full_step": saved,
                     "all_ms": [1e3 * v for v in t]})
        print(f"{name:18s} {1e3 * statistics.median(t):8.1f} ms" +
              ("" if name == "full" else f"   saves {100 * saved:4.1f} % of the full step"), flush=True)
    result = {"benchmark": "training_step_breakdown", "width": args.width, "batch": args.batch,
              "models": args.models, "repeats": args.repeats, "cpu_threads": torch.get_num_threads(),
              "torch": torch.__version__, "rows": rows}
    measure.write_result(args.out, result)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
