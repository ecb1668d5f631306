"""Model-steps/s of pe_fast's pack against its peers: a torch.func ensemble and a one-model loop, same models.

    python bench/training/bench_peers.py [--shapes lst,fmri] [--steps 10] [--warmup 3] [--repeats 5]
                                         [--ensemble-compile on|off] [--pack-compile on|off]
                                         [--sweep-flags "--width 8 ..."]
                                         [--out bench/results/peers_cpu.json]

Each shape is a pack of the sweep's own settings (pe_fast.sweep.settings.from_flags, the grid's first pack, the
task's data, as bench/training/traffic.py builds it) with a learned PE added at the input (--pe learned --pe-at
input; pe_fast's default adds a PE at every block, which nn.TransformerEncoder has no place for), fp32:
  * lst:  --task lst --preset cpu (d 32, 4 blocks, 1 head, MLP 128, batch 64, the 6 models of its learned pack,
          AdamW); loss: the task's cross-entropy on 4 classes from the last token;
  * fmri: --task fmri (N 100, d 32, 2 blocks, 1 head, MLP 64, batch 32, 12 models, Adam); loss: the task's MSE
          on the masked tokens.
The three ways to train those M models, each on the task's own batches (the sweep's BatchSampler and the task's
batch builder, so every way does the same data work) and the task's own loss:
  * pack: pe_fast.train.PackTrainer.train_step, the sweep's step (stacked model, fused op with its attention
    statistics, fused Adam(W), the LR schedule, the loss and statistics buffers); eager, as the sweep trains on the
    CPU, and (pack_compiled, unless --pack-compile off) with the sweep's --compile on: torch.compile of the forward
    and loss, the C++ attention op opaque inside;
  * ensemble: M copies of a standard model as a new user writes it (torch.nn.TransformerEncoder: post-LN, GELU,
    batch_first, no dropout, plus a linear input projection, a learned PE [N, d] and a linear readout),
    stacked with torch.func.stack_module_state, gradients by vmap(grad(functional_call)), then one
    torch.optim.Adam / AdamW step (torch's default implementation) over the stacked tensors; eager, and
    torch.compile'd (the gradient function) unless --ensemble-compile off. torch's default CPU attention kernel
    has no vmap batching rule (eager loops it over the models) and no derivative of its backward, which
    compiling grad needs: if the compile fails so, the error is recorded and the compiled ensemble runs with
    SDPA's math backend, the workaround a user finds;
  * loop: the same nn.TransformerEncoder model trained alone, as the authors train: one model, its own Adam(W),
    M steps in a row count as M model-steps.
Work that differs: the pack also computes attention statistics and steps a schedule; its MLP has a GELU after
both linears (the authors' models), nn.TransformerEncoderLayer after the first only; pe_fast's last block computes
the readout token's output alone (lst) and, after its attention, the masked tokens' alone (fmri: 20 of 100, what the
loss reads), nn.TransformerEncoder every token's.
Timing: --warmup steps of each way, then measure.in_turn: --repeats rounds, each timing --steps steps of every
way one after the other; the median round's model-steps/s, and pack / peer as the median of the ratios within
rounds (measure.per_round).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import shlex
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._pytree import tree_map

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure.py, the scripts as kind.name
import measure

from pe_fast.models import ModelConfig
from pe_fast.train import BatchSampler, PackTrainer, TrainConfig
from training.traffic import sweep_pack

SHAPES = {"lst": ["--task", "lst", "--preset", "cpu"], "fmri": ["--task", "fmri"]}
SAME_PLACE = ["--pe", "learned", "--pe-at", "input"]  # where nn.TransformerEncoder can take a PE: the input
LOSSES = {"lst": "cross-entropy on 4 classes from the last token (the task's loss)",
          "fmri": "MSE on the masked tokens (the task's loss)"}


class UserModel(nn.Module):
    """One model as a new user writes it: torch.nn.TransformerEncoder (post-LN, GELU, batch_first, no dropout),
    with a linear input projection, a learned PE [N, d] added once at the input, and a linear readout."""

    def __init__(self, config: ModelConfig, seed: int, sigma: float):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Linear(config.token_dim, config.width)
        self.pe = nn.Parameter(torch.randn(config.num_tokens, config.width) * sigma)
        layer = nn.TransformerEncoderLayer(config.width, config.heads, config.mlp_width, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=False)
        self.encoder = nn.TransformerEncoder(layer, config.depth, enable_nested_tensor=False)
        self.head = nn.Linear(config.width, config.out_dim)
        self.readout_token = config.readout_token

    def forward(self, tokens):
        h = self.encoder(self.embed(tokens) + self.pe)
        return self.head(h if self.readout_token is None else h[:, self.readout_token])


def one_model_loss(task, outputs, targets):
    """The task's loss, which takes a pack [M, ...], of one model's outputs and targets."""
    return task.loss(*tree_map(lambda t: t.unsqueeze(0), (outputs, targets)))[0]


def peer_optimizer(params, train: TrainConfig) -> torch.optim.Optimizer:
    """The sweep's optimizer kind and numbers in torch's default implementation (on the CPU: a loop over the
    tensors; the pack's is fused), as a user writes it."""
    kind = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[train.optimizer]
    return kind(params, lr=train.lr[0], weight_decay=train.weight_decay[0])


def task_batches(task, train: TrainConfig, seeds: list[int], device: torch.device):
    """() -> (inputs [M,B,N,token_dim], targets): the sweep's batch order and the task's batches."""
    sampler = BatchSampler(len(task.splits["train"]), train.batch_size, seeds, device)
    batches = task.training_batches(seeds, device)
    return lambda: batches(sampler.next())


def ensemble_step(task, config: ModelConfig, train: TrainConfig, seeds, sigmas, device, compiled: bool,
                  math_attention: bool):
    """One step of M UserModels stacked by torch.func: per-model gradients by vmap(grad(functional_call))."""
    params, buffers = stack_module_state([UserModel(config, s, g).to(device) for s, g in zip(seeds, sigmas)])
    base = UserModel(config, seeds[0], sigmas[0]).to("meta")  # the structure only, for functional_call

    def loss(p, b, inputs, targets):
        return one_model_loss(task, functional_call(base, (p, b), (inputs,)), targets)

    grads = vmap(grad(loss))
    if compiled:
        torch.compiler.reset()
        grads = torch.compile(grads)
    optimizer = peer_optimizer(params.values(), train)
    batch = task_batches(task, train, seeds, device)
    attention = (lambda: sdpa_kernel(SDPBackend.MATH)) if math_attention else contextlib.nullcontext

    def step():
        inputs, targets = batch()
        with attention():
            per_model = grads(params, buffers, inputs, targets)
        for name, p in params.items():
            p.grad = per_model[name]
        optimizer.step()

    return step


def loop_step(task, config: ModelConfig, train: TrainConfig, seeds, sigmas, device):
    """M steps of one UserModel trained alone (the authors' way: one model at a time)."""
    model = UserModel(config, seeds[0], sigmas[0]).to(device)
    optimizer = peer_optimizer(model.parameters(), train)
    batch = task_batches(task, train, seeds[:1], device)

    def step():
        for _ in range(len(seeds)):
            inputs, targets = tree_map(lambda t: t[0], batch())
            loss = one_model_loss(task, model(inputs), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    return step


def first_call_seconds(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def compiled_ensemble(task, config, train, seeds, sigmas, device) -> tuple:
    """(step, record): the compiled ensemble with torch's default attention, else with SDPA's math backend; the
    first call (the compilation) timed; step None where neither compiles."""
    record = {}
    for math_attention in (False, True):
        step = ensemble_step(task, config, train, seeds, sigmas, device, True, math_attention)
        try:
            with warnings.catch_warnings():  # a failing compile's anomaly traces: its error is recorded
                warnings.simplefilter("ignore")
                record["compile_s"] = first_call_seconds(step)
        except Exception as error:  # a compile failure is a result: recorded, and the workaround tried
            record["compile_error_default_attention" if not math_attention else "compile_error_math_attention"] = \
                f"{type(error).__name__}: {error}"[:400]
            continue
        record["attention"] = "SDPA math backend" if math_attention else "torch's default SDPA"
        return step, record
    return None, record


def time_shape(name: str, sweep_flags: list[str], args, device: torch.device) -> dict:
    s, task, config, train, seeds, sigmas = sweep_pack([*SHAPES[name], *SAME_PLACE, *sweep_flags], None, "fp32")
    M = len(seeds)
    calls = args.warmup + 2 + args.repeats * args.steps  # in_turn warms up with one more call, the compile one more
    train = dataclasses.replace(train, eval_every=calls)  # no evaluation, and room in the statistics buffer
    trainer = PackTrainer(task, config, train, seeds, sigmas, device)
    steps = {"pack": trainer.train_step}
    compile_s = {}
    if args.pack_compile == "on":
        compiled = PackTrainer(task, config, dataclasses.replace(train, compile="on"), seeds, sigmas, device)
        compile_s["pack_compiled"] = first_call_seconds(compiled.train_step)
        steps["pack_compiled"] = compiled.train_step
    steps["ensemble_eager"] = ensemble_step(task, config, train, seeds, sigmas, device, False, False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steps["ensemble_eager"]()
    # ops vmap runs one model at a time, for want of a batching rule (torch warns of each)
    fallbacks = sorted({m for w in caught for m in re.findall(r"batching rule for (aten::\w+)", str(w.message))})
    warnings.filterwarnings("ignore", message=".*batching rule", category=UserWarning)  # recorded, once is enough
    record = {"shape": name, "sweep_flags": [*SHAPES[name], *SAME_PLACE, *sweep_flags], "models": M,
              "tokens": config.num_tokens, "token_dim": config.token_dim, "out_dim": config.out_dim,
              "width": config.width, "depth": config.depth, "heads": config.heads, "mlp_width": config.mlp_width,
              "batch_size": train.batch_size, "optimizer": train.optimizer, "lr": train.lr[0],
              "weight_decay": train.weight_decay[0], "precision": "fp32", "loss": LOSSES.get(name, "the task's"),
              "params_per_model": {"pack": sum(p.numel() for p in trainer.model.parameters()) // M,
                                   "peers": sum(p.numel() for p in UserModel(config, 0, 1.0).parameters())},
              "ensemble_eager_vmap_fallbacks": fallbacks, "ensemble_compiled": {},
              "pack_compiled_compile_s": compile_s.get("pack_compiled")}
    if args.ensemble_compile == "on":
        step, record["ensemble_compiled"] = compiled_ensemble(task, config, train, seeds, sigmas, device)
        if step is not None:
            steps["ensemble_compiled"] = step
    else:
        record["ensemble_compiled"]["skipped"] = "--ensemble-compile off"
    steps["loop"] = loop_step(task, config, train, seeds, sigmas, device)
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    # every call is M model-steps: the pack's and the ensemble's one step, the loop's M steps of one model
    seconds = measure.in_turn(steps, args.repeats, device, inner={way: args.steps for way in steps})
    record["ways"] = {way: {"model_steps_per_s": statistics.median(M / t for t in times),
                            "rounds_model_steps_per_s": [M / t for t in times]} for way, times in seconds.items()}
    for way in steps:
        if way != "pack":  # seconds per call of the peer over the pack's: the pack's speed-up
            record["ways"][way]["pack_over_peer"] = measure.per_round(lambda pack, peer: peer / pack,
                                                                      seconds["pack"], seconds[way])
    return record


def table(records: list[dict]) -> str:
    lines = [f"{'shape':6s} {'M':>3s} {'way':18s} {'model-steps/s':>14s} {'pack / way':>10s}"]
    for r in records:
        for way, row in r["ways"].items():
            ratio = f"{row['pack_over_peer']:.2f}×" if "pack_over_peer" in row else ""
            lines.append(f"{r['shape']:6s} {r['models']:3d} {way:18s} {row['model_steps_per_s']:14,.1f} {ratio:>10s}")
        if r["ensemble_eager_vmap_fallbacks"]:
            lines.append(f"{'':6s} {'':3s} ensemble_eager: vmap loops over the models in "
                         f"{', '.join(r['ensemble_eager_vmap_fallbacks'])} (no batching rule)")
        if "ensemble_compiled" not in r["ways"]:
            lines.append(f"{r['shape']:6s} {r['models']:3d} {'ensemble_compiled':18s} skipped: "
                         f"{r['ensemble_compiled']}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="lst,fmri", help=f"comma-separated: {', '.join(SHAPES)}")
    p.add_argument("--sweep-flags", default="",
                   help="more flags of python -m pe_fast.sweep for every shape, e.g. a smaller one: "
                        "\"--width 8 --depth 1 --mlp-width 16 --batch-size 4 --seeds 1\"")
    p.add_argument("--steps", type=int, default=10, help="steps of each way per timed round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps of each way first (compiling is there)")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds")
    p.add_argument("--ensemble-compile", choices=("on", "off"), default="on",
                   help="also time the torch.func ensemble torch.compile'd")
    p.add_argument("--pack-compile", choices=("on", "off"), default="on",
                   help="also time the pack's step torch.compile'd (the sweep's --compile on)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="bench/results/peers_cpu.json")
    args = p.parse_args()
    shapes = args.shapes.split(",")
    if unknown := [s for s in shapes if s not in SHAPES]:
        print(f"error: unknown shapes {unknown}; choose from {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    if min(args.steps, args.repeats) < 1 or args.warmup < 0:
        print("error: --steps and --repeats must be positive, --warmup not negative", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    records = []
    for name in shapes:
        records.append(time_shape(name, shlex.split(args.sweep_flags), args, device))
        result = {"benchmark": "peers", "environment": measure.environment(device), "steps": args.steps,
                  "warmup": args.warmup, "repeats": args.repeats, "records": records}
        measure.write_result(args.out, result)  # after each shape: a time limit keeps what ran
    print(table(records))
    print(measure.instruction_set_line())
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
