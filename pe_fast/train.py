"""Training loop for one pack of stacked models, readable top to bottom.

A pack is M models of one architecture trained together: one forward pass, one loss (the sum of the models'
losses, so each model receives exactly its own gradient), one optimizer over stacked tensors (elementwise, so
it is M independent optimizers). Each model draws its own batches from its own seeded generator. Per-step
attention statistics stay on the device in a buffer that is copied out once per evaluation. PackTrainer's
state_dict() is everything the rest of the run depends on, so a pack resumed from a checkpoint ends exactly as an
uninterrupted one.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import operator
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from pe_fast import columns, precision
from pe_fast.host_to_device import upload
from pe_fast.metrics import convergence, pe_geometry
from pe_fast.metrics.attention_maps import AttentionMapSums, mean_attention_maps
from pe_fast.metrics.rich_lazy import RichLazyProbe, effective_rank
from pe_fast.metrics.tangent_kernel import TangentKernelProbe
from pe_fast.models import ModelConfig, StackedTransformer
from pe_fast.models.absolute_pe import PEDropout
from pe_fast.ops import STAT_NAMES, extension
from pe_fast.seeds import DATA_SEED_OFFSET
from pe_fast.stacked_optim import KINDS as OPTIMIZERS  # torch's fused optimizers (make_optimizer) cover them too
from pe_fast.stacked_optim import StackedOptimizer, moments_problem

# Items of the attention split on which every evaluation measures how far features and attention moved (a small
# batch: the first block's attention maps are held in full, [M, items, H, N, N])
RICH_LAZY_ITEMS = 16
SCHEDULES = ("constant", "cosine")
UNTIL = ("converged", "budget")  # when a pack stops (TrainConfig.until)


PerModel = float | tuple[float, ...]  # one value for every model of the pack, or one per model


# --compile: off (eager), on (torch.compile), graphs (compiled and replayed as CUDA graphs; CUDA only), with the
# torch.compile mode each uses
COMPILE_MODES = {"off": None, "on": "default", "graphs": "reduce-overhead"}


def compile_problem(mode: str, device: torch.device) -> str | None:
    """Why this --compile mode cannot run on this device, or None."""
    if mode not in COMPILE_MODES:
        return f"unknown mode {mode!r}; choose from {', '.join(COMPILE_MODES)}"
    if mode == "graphs" and device.type != "cuda":
        return f"CUDA graphs need a CUDA device, not {device.type}"
    return None


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int = 128
    lr: PerModel = 1e-4  # each model's base rate; the schedule scales it
    optimizer: str = "adamw"
    weight_decay: PerModel = 0.0
    momentum: PerModel = 0.0  # SGD only
    schedule: str = "constant"
    warmup: int = 0
    eval_every: int = 250
    # intermediate evaluations score at most this many items of each split but the task's attention split (in
    # full: the convergence check compares its scores); the last evaluation scores every item
    eval_items: int = 2048
    # the tangent kernel's probe items (evenly spaced over the attention split): metrics/tangent_kernel.py; 0: none
    ntk_items: int = 0
    precision: str = "fp32"  # pe_fast.precision: fp32, tf32, bf16 or fp16 (autocast; float32 weights and optimizer)
    compile: str = "off"  # COMPILE_MODES: torch.compile of the training step's forward and loss (and their backward)
    # UNTIL: "budget" trains every step; "converged" ends the pack at the first evaluation where every model's
    # plateau_score has levelled off (metrics.convergence, the report's test) and, where the task names a fit_score,
    # every model fits its training set
    until: str = "budget"
    plateau_score: str | None = None
    lower_is_better: bool = False
    fit_score: str | None = None


@dataclasses.dataclass
class PackResult:
    """Per-model final metrics and per-evaluation curves, as lists of row dicts (one per model / eval)."""
    final: list[dict]
    curves: list[dict]
    pe_tables: dict[int, np.ndarray]
    attention_maps: np.ndarray  # [M, L, N, N]: mean attention maps on the attention split (metrics.attention_maps)
    seconds: float
    steps: int     # trained: the budget, or fewer where the pack converged first
    stopped: str   # why it ended: "converged" or "budget" (UNTIL)


def _one_value(value: PerModel) -> float | None:
    """The value shared by every model, or None when the models differ."""
    values = set(value) if isinstance(value, tuple) else {value}
    return values.pop() if len(values) == 1 else None


def make_optimizer(params, config: TrainConfig) -> torch.optim.Optimizer:
    """torch's own optimizer when every model of the pack shares its numbers; else, or where a model may skip a
    step (fp16's loss scaling), the stacked optimizer with per-model values (exactly M torch optimizers,
    tests/test_stacked_optimizer.py)."""
    if config.optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {config.optimizer!r}; choose from {', '.join(OPTIMIZERS)}")
    lr, decay, momentum = (_one_value(v) for v in (config.lr, config.weight_decay, config.momentum))
    if None in (lr, decay, momentum) or config.precision in precision.SCALED:
        return StackedOptimizer(params, config.optimizer, lr=config.lr, weight_decay=config.weight_decay,
                                momentum=config.momentum if config.optimizer == "sgd" else 0.0)
    # fused: one multi-tensor kernel per step instead of about ten ops per parameter tensor: about 10 % of a
    # training step at d = 64 on the CPU (bench/training/bench_training.py)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=decay, fused=True)
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=decay, fused=True)
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=decay)


def current_lrs(optimizer: torch.optim.Optimizer, num_models: int) -> list[float]:
    """Each model's learning rate at the next step."""
    if isinstance(optimizer, StackedOptimizer):
        return optimizer.current_lrs()
    return [optimizer.param_groups[0]["lr"]] * num_models


def lr_factor(step: int, config: TrainConfig) -> float:
    """Linear warm-up, then constant or cosine decay to zero."""
    if step < config.warmup:
        return (step + 1) / config.warmup
    if config.schedule == "cosine":
        progress = (step - config.warmup) / max(1, config.steps - config.warmup)
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


def structure_problem(own, found, where: str) -> str | None:
    """Where `found` (a state read from a checkpoint) differs in structure from `own` (the state this code makes):
    other keys, lengths, tensor shapes or dtypes, or types of number (a bool is not an int); None where it does
    not."""
    if own is None:
        return None if found is None else f"{where} a {type(found).__name__}, where this pack's holds None"
    if isinstance(own, dict):
        if not isinstance(found, dict) or set(found) != set(own):
            keys = sorted(map(str, found))[:6] if isinstance(found, dict) else type(found).__name__
            return f"{where} holding {keys}, where this pack's holds {sorted(map(str, own))[:6]}"
        return next((problem for key in own
                     if (problem := structure_problem(own[key], found[key], f"{where}.{key}")) is not None), None)
    if isinstance(own, (list, tuple)):
        if not isinstance(found, (list, tuple)) or len(found) != len(own):
            return f"{where} of {len(found) if isinstance(found, (list, tuple)) else type(found).__name__} items, " \
                   f"where this pack's has {len(own)}"
        return next((problem for i, (a, b) in enumerate(zip(own, found))
                     if (problem := structure_problem(a, b, f"{where}[{i}]")) is not None), None)
    if isinstance(own, Tensor):
        if not isinstance(found, Tensor) or found.shape != own.shape or found.dtype != own.dtype:
            got = f"{tuple(found.shape)} {found.dtype}" if isinstance(found, Tensor) else type(found).__name__
            return f"{where} of {got}, where this pack's is {tuple(own.shape)} {own.dtype}"
        return None
    if type(found) is not type(own):
        return f"{where} a {type(found).__name__}, where this pack's is a {type(own).__name__}"
    return None


def stacked_count_problem(entry: dict, step: int, models: int) -> str | None:
    """What in a StackedOptimizer's count of Adam steps (one "step" ≤ the pack's, or each model's "beta_powers",
    β₁ᵗ and β₂ᵗ in (0, 1]) no training leaves, or None."""
    if "step" in entry:
        count = entry["step"]
        return None if type(count) is int and 0 <= count <= step else f"an Adam step count {count!r:.20}"
    powers = entry.get("beta_powers")
    if powers is None:
        return None  # SGD: no count
    if not (isinstance(powers, Tensor) and powers.dtype == torch.float64 and powers.shape in ((2, 1), (2, models))
            and bool(((powers > 0) & (powers <= 1)).all())):
        return "Adam's per-model beta powers of another shape or beyond (0, 1]"
    return None


class BatchSampler:
    """Each model walks through its own random permutation of the training set, epoch after epoch."""

    def __init__(self, num_items: int, batch_size: int, seeds: list[int], device: torch.device):
        if batch_size > num_items:
            raise ValueError(f"batch size {batch_size} exceeds the {num_items} training items")
        self.generators = [torch.Generator().manual_seed(s + DATA_SEED_OFFSET) for s in seeds]
        self.num_items, self.batch_size, self.device = num_items, batch_size, device
        self.per_epoch = num_items // batch_size  # the last partial batch is dropped
        self.position = self.per_epoch

    def next(self) -> Tensor:
        if self.position == self.per_epoch:
            perms = torch.stack([torch.randperm(self.num_items, generator=g) for g in self.generators])
            self.epoch = upload(perms[:, : self.per_epoch * self.batch_size], self.device)
            self.position = 0
        start = self.position * self.batch_size
        self.position += 1
        return self.epoch[:, start:start + self.batch_size]

    def state_dict(self) -> dict:
        return {"generators": [g.get_state() for g in self.generators], "position": self.position,
                "epoch": self.epoch.cpu() if hasattr(self, "epoch") else None}

    def load_state_dict(self, state: dict):
        for generator, saved in zip(self.generators, state["generators"], strict=True):
            generator.set_state(saved)
        self.position = state["position"]
        if state["epoch"] is not None:
            self.epoch = state["epoch"].to(self.device)


# On the CPU, evaluation chunks whose activations [M, chunk, N, width] hold about this many floats (4 MiB) stay in
# the cache from one layer to the next: 12-25 % faster than chunks bounded by memory alone, at the fMRI default and
# at LST shapes of 6 and 30 models (2 cores, 2026-12-01); twice or half as many floats are within 5 % of it.
CPU_CHUNK_FLOATS = 2 ** 20


@torch.no_grad()
def predict(model: StackedTransformer, tokens: Tensor, probes: Tensor | None, max_scores: int = 2 ** 25,
            output_tokens: Tensor | None = None):
    """Outputs of every model on the same items [P, N, token_dim] -> ([M, P, out], stats [L,M,H,S]).
    Items go through in chunks of at most max_scores attention scores (M·chunk·N²), to bound the memory of
    backends that materialise the map, and on the CPU of about CPU_CHUNK_FLOATS activations.
    output_tokens [P,K] (models that predict at every token): the outputs at these tokens of each item alone,
    [M,P,K,out] (StackedTransformer's output_tokens); the statistics still cover every query."""
    outputs, stats_sum = [], 0.0
    M, N = model.num_models, tokens.shape[1]
    chunk = max(1, max_scores // (M * N * N))
    if tokens.device.type == "cpu":
        chunk = min(chunk, max(1, CPU_CHUNK_FLOATS // (M * N * model.config.width)))
    for start in range(0, len(tokens), chunk):
        part = tokens[start:start + chunk]
        at = None if output_tokens is None else output_tokens[start:start + chunk].expand(M, -1, -1)
        out, stats = model(part.unsqueeze(0).expand(M, *part.shape), probes, output_tokens=at)
        outputs.append(out)
        stats_sum = stats_sum + stats * len(part)
    return torch.cat(outputs, dim=1), stats_sum / len(tokens)


def scored_outputs(task, model: StackedTransformer, split: str, tokens: Tensor, items: Tensor, probes: Tensor | None
                   ) -> tuple[Tensor, Tensor]:
    """The outputs [M,P,...] that task.score() takes for these items of a split, and the statistics. A task whose
    loss reads some tokens of each item (loss_tokens: the masked-token tasks, whose score reads the same tokens under
    the split's fixed mask) has the model compute its outputs there alone; the others are left zero, never read."""
    loss_tokens = getattr(task, "loss_tokens", None)
    if loss_tokens is None:
        return predict(model, tokens, probes)
    read, _ = loss_tokens(task.targets(split, items, 1))
    read = read[0].to(tokens.device)  # [P,K], the same for every model
    outputs, stats = predict(model, tokens, probes, output_tokens=read)
    full = outputs.new_zeros(*outputs.shape[:2], tokens.shape[1], outputs.shape[-1])
    return full.scatter_(2, read.expand(len(outputs), -1, -1).unsqueeze(-1).expand_as(outputs), outputs), stats


def stat_columns(stats: np.ndarray, probe_names, prefix: str) -> list[dict]:
    """[L,M,H,S] -> per model, {columns.attention_column(prefix, l, h, stat): value}."""
    names = list(STAT_NAMES) + [columns.probe_stat(p) for p in probe_names]
    L, M, H, S = stats.shape
    return [{columns.attention_column(prefix, l, h, names[s]): float(stats[l, m, h, s])
             for l in range(L) for h in range(H) for s in range(S)} for m in range(M)]


class PackEvaluation:
    """A pack's evaluations: which items of each split are scored (evenly spaced subsets between, every item at the
    last), the rich/lazy probe and the initial PE that drift is measured from, and the mean attention maps the
    final pass over the attention split gathers."""

    def __init__(self, task, model: StackedTransformer, config: TrainConfig, probes: Tensor, device: torch.device):
        self.task, self.model, self.config, self.probes, self.device = task, model, config, probes, device
        self.tokens = {name: split.x.to(device) for name, split in task.splits.items()}
        # Intermediate evaluations score an evenly spaced subset of each split (files are often sorted by
        # condition, so a prefix would not do); the final evaluation scores every item. The attention split is
        # scored in full every time: the report's convergence check compares its scores across evaluations, and
        # a subset's score differs from the full split's by as much as the plateau tolerance.
        def items(name, count):
            keep = count if name == task.attention_split else min(config.eval_items, count)
            return torch.linspace(0, count - 1, keep).round().long()
        self.items = {name: items(name, len(t)) for name, t in self.tokens.items()}
        self.initial_pe = [t.detach().cpu().clone() for t in model.pe_tables()]
        watched = self.tokens[task.attention_split]
        pick = torch.linspace(0, len(watched) - 1, min(RICH_LAZY_ITEMS, len(watched))).round().long()
        self.rich_lazy = RichLazyProbe(model, watched[pick.to(device)], probes)
        self.tangent_kernel = None
        if config.ntk_items:
            pick = torch.linspace(0, len(watched) - 1, min(config.ntk_items, len(watched))).round().long()
            targets = task.targets(task.attention_split, pick, model.num_models)
            targets = tuple(t.to(device) for t in targets) if isinstance(targets, tuple) else targets.to(device)
            self.tangent_kernel = TangentKernelProbe(model, task, watched[pick.to(device)], targets, probes)
        self.final_maps = None  # the mean attention maps, gathered by the final evaluation

    def rows(self, step: int, final: bool, lrs: list[float], window: tuple[np.ndarray, np.ndarray] | None
             ) -> list[dict]:
        """Score every split; one host sync. window: the training steps' mean loss [M] and attention statistics
        [L,M,H,S] since the last evaluation, if any. Returns one row per model."""
        task, model, M = self.task, self.model, self.model.num_models
        rows = [{"model": m, "step": step, "lr_last": lr} for m, lr in enumerate(lrs)]
        if window is not None:
            window_loss, window_stats = window
            for m, extra in enumerate(stat_columns(window_stats, task.probe_names, columns.attention_prefix())):
                rows[m]["train_loss"] = float(window_loss[m])
                rows[m].update(extra)
        model.eval()
        for name, tokens in self.tokens.items():
            items = self.items[name] if not final else torch.arange(len(tokens))
            # the final pass over the attention split also gives the mean attention maps (result()), unless
            # autocast would make them differ from the float32 maps computed apart
            maps_here = final and name == task.attention_split and self.config.precision not in precision.LOW
            with precision.autocast(self.config.precision, self.device), \
                    AttentionMapSums(model) if maps_here else contextlib.nullcontext() as sums:
                outputs, stats = scored_outputs(task, model, name, tokens[items.to(self.device)], items, self.probes)
            if maps_here:
                self.final_maps = sums.mean()
            outputs = outputs.float()
            for m, scores in enumerate(task.score(outputs.cpu(), name, items)):
                rows[m].update(scores)
            if name == task.attention_split:
                prefix = columns.attention_prefix(name)
                for m, extra in enumerate(stat_columns(stats.cpu().numpy(), task.probe_names, prefix)):
                    rows[m].update(extra)
        model.train()
        tables = [t.detach().cpu().numpy() for t in model.pe_tables()]
        for m, moved in enumerate(self.rich_lazy.measure(model)):
            rows[m].update(moved)
        if self.tangent_kernel is not None:
            for m, kernel_rows in enumerate(self.tangent_kernel.measure(model, step)):
                rows[m].update(kernel_rows)
        for m in range(M):
            # a diverged model (NaN or inf weights: too large a learning rate) keeps NaN PE metrics; the SVDs and
            # correlations behind them cannot take it, and the pack's other models train on
            if tables and np.isfinite(tables[0][m]).all():
                rows[m].update(task.pe_metrics(tables[0][m]))
            if tables and model.config.pe == "learned":
                rows[m][columns.PE_DRIFT] = pe_geometry.relative_drift(np.stack([t[m] for t in tables]),
                                                                 np.stack([t[m].numpy() for t in self.initial_pe]))
                change = torch.from_numpy(tables[0][m] - self.initial_pe[0][m].numpy())
                rows[m][columns.PE_CHANGE_RANK] = float(effective_rank(change[None])[0])
        return rows

    def attention_maps(self) -> np.ndarray:
        """The mean attention maps on the attention split: the final evaluation's, else computed now (a pack
        resumed at its last step, or autocast)."""
        if self.final_maps is not None:
            return self.final_maps
        return mean_attention_maps(self.model, self.tokens[self.task.attention_split], self.probes)




class PackTrainer:
    """The training of one pack, resumable: state_dict() holds everything the rest of the run depends on
    (weights, optimizer, schedule, batch order, the task's batch generators, the current evaluation window, the
    curves so far, the initial PE), so that run() after load_state_dict() continues exactly where it stopped.
    Its evaluations are a PackEvaluation's."""

    # A checkpoint, key by key: where the trainer holds each (an object with a state_dict of its own saves and
    # loads through it); "torch_rng" is torch's global generator. A checkpoint without one of the keys but the
    # OPTIONAL_STATE_KEYS is not this class's (run_folder.check_checkpoint).
    STATE = {"step": "step", "model": "model", "optimizer": "optimizer", "scheduler": "scheduler",
             "sampler": "sampler", "batches": "batches", "loss_buffer": "loss_buffer", "stats_buffer": "stats_buffer",
             "filled": "filled", "curves": "curves", "initial_pe": "evaluation.initial_pe", "seconds": "seconds",
             "torch_rng": None, "scaler": "scaler", "tangent_kernel": "evaluation.tangent_kernel"}
    STATE_KEYS = tuple(STATE)
    # missing from checkpoints written before they existed: "scaler" (fp16) and "tangent_kernel" (the previous
    # evaluation's kernels: a pack resumed from such a checkpoint has no velocity at its first evaluation)
    OPTIONAL_STATE_KEYS = ("scaler", "tangent_kernel")
    REQUIRED_STATE_KEYS = tuple(sorted(set(STATE) - set(OPTIONAL_STATE_KEYS), key=STATE_KEYS.index))

    def __init__(self, task, model_config: ModelConfig, train_config: TrainConfig, seeds: list[int],
                 sigmas: list[float | None], device: torch.device, init_gammas: list[float | None] | None = None):
        """init_gammas: each model's initialisation scale γ (StackedTransformer), None: the default one."""
        self.task, self.model_config, self.config, self.device = task, model_config, train_config, device
        self.model = StackedTransformer(model_config, seeds, sigmas, task.coordinates, init_gammas).to(device)
        self.M = M = self.model.num_models
        self.probes = task.probes.to(device)
        self.batches = task.training_batches(seeds, device)
        self.evaluation = PackEvaluation(task, self.model, train_config, self.probes, device)

        self.optimizer = make_optimizer(self.model.parameters(), train_config)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, train_config))
        self.sampler = BatchSampler(len(task.splits["train"]), train_config.batch_size, seeds, device)
        self.autocast = lambda: precision.autocast(train_config.precision, device)
        self.scaler = precision.LossScaler(M, device, enabled=train_config.precision in precision.SCALED)
        if train_config.until not in UNTIL or (train_config.until == "converged" and not train_config.plateau_score):
            raise ValueError(f"until={train_config.until!r}: choose from {', '.join(UNTIL)}; converged needs the "
                             f"plateau_score to follow")
        self.stopped = "budget"  # until the pack converges, if it does before its last step
        # Compiled, the step's layer norms, residual adds, GELUs and loss fuse with their backward into a few
        # kernels; the fused attention op stays one opaque custom op. Evaluation stays eager (other shapes).
        # The previous pack's compiled code is dropped: every pack would add an entry to torch's per-function
        # cache, which falls back to eager after a few (the paper's preset trains seven PE kinds in one process).
        # "graphs" also replays the compiled step as CUDA graphs (mode reduce-overhead): one launch instead of
        # hundreds, for the small packs whose step the host's launches bound. torch's on-disk caches are tagged with
        # this build of pe_fast's ops: their keys hold the traced graph, not the ops' code.
        self.pe_dropout = None
        if model_config.pe_dropout:
            self.pe_dropout = PEDropout(model_config.pe_dropout, seeds, self.model.absolute.num_blocks, device)
        self.forward_loss = self._forward_loss
        if train_config.compile != "off":
            torch.compiler.reset()
            torch.compiler.config.cache_key_tag = f"pe_fast-{extension.build_id()}"
            self.forward_loss = torch.compile(self._forward_loss, mode=COMPILE_MODES[train_config.compile])

        # The current evaluation window: per-step losses and attention statistics, kept on the device. It ends at
        # the last step at the latest (a preset's --eval-every may exceed a short --steps).
        self.window = min(train_config.eval_every, train_config.steps)
        self.loss_buffer = torch.zeros(self.window, M, device=device)
        self.stats_buffer = None  # [window, L, M, H, S], allocated once the stats' shape is known
        self.filled = 0
        self.step = 0  # steps done
        self.curves: list[dict] = []
        self.seconds = 0.0  # training time so far, over all the processes that trained this pack

    def run(self, on_step: Callable[[int], None] | None = None,
            checkpoint: Callable[[], None] | None = None, checkpoint_every: int | None = None,
            on_evaluate: Callable[[list[dict]], None] | None = None) -> PackResult:
        """Train from the current step to the last; call on_step(steps done) after every step, on_evaluate(rows)
        after every evaluation, and checkpoint() every checkpoint_every steps (default: after every evaluation)
        before the last."""
        config = self.config
        checkpoint_every = checkpoint_every or config.eval_every
        started = time.perf_counter() - self.seconds
        def evaluate(final: bool):
            rows = self.evaluate(self.step, final)
            if not final and config.until == "converged" and self.plateaued(rows):
                self.stopped = "converged"  # this evaluation is the last: every item scored
                rows = self.evaluate(self.step, final=True)
            self.curves.extend(rows)
            if on_evaluate is not None:
                on_evaluate(rows)

        if self.step == 0 and not self.curves:
            evaluate(final=False)
        while self.step < config.steps and self.stopped == "budget":
            self.train_step()
            if self.filled == config.eval_every or self.step == config.steps:
                evaluate(final=self.step == config.steps)
                self.filled = 0
            self.seconds = time.perf_counter() - started
            if on_step is not None:
                on_step(self.step)
            if checkpoint is not None and self.step % checkpoint_every == 0 and self.step < config.steps \
                    and self.stopped == "budget":
                checkpoint()
        return self.result()

    def plateaued(self, rows: list[dict]) -> bool:
        """Whether every model's curve, with this evaluation's rows, has levelled off and fits its training set.
        A model whose score is not finite (diverged) has nothing left to gain and does not hold the pack back."""
        config = self.config
        for m, row in enumerate(rows):
            if not np.isfinite(row[config.plateau_score]):
                continue
            curve = [(r["step"], r[config.plateau_score]) for r in self.curves if r["model"] == m]
            steps, scores = zip(*curve, (row["step"], row[config.plateau_score]))
            if not convergence.has_plateaued(steps, scores, config.lower_is_better):
                return False
            if config.fit_score is not None and not row[config.fit_score] >= convergence.FIT_THRESHOLD:
                return False
        return True

    def train_step(self):
        if self.config.compile == "graphs":
            # the graphs' outputs are overwritten by the next replay: this step's are copied out below
            torch.compiler.cudagraph_mark_step_begin()
        inputs, targets = self.batches(self.sampler.next())
        loss_per_model, stats = self.forward_loss(inputs, targets, self.pe_dropout_masks(inputs))
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scaled_loss(loss_per_model).backward()
        self.scaler.step(self.optimizer)
        self.scheduler.step()
        if self.stats_buffer is None:
            self.stats_buffer = torch.zeros(self.window, *stats.shape, device=self.device)
        self.loss_buffer[self.filled] = loss_per_model.detach()
        self.stats_buffer[self.filled] = stats
        self.filled += 1
        self.step += 1

    def pe_dropout_masks(self, inputs: Tensor) -> Tensor | None:
        """This step's PE dropout masks for a batch of inputs [M,B,N,token_dim], or None without PE dropout."""
        if self.pe_dropout is None:
            return None
        hidden = (inputs.shape[1], inputs.shape[2], self.model_config.width)
        return self.pe_dropout.masks(self.step, hidden, inputs.dtype)

    def _forward_loss(self, inputs: Tensor, targets, pe_dropout_masks: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Each model's loss [M] and the attention statistics [L,M,H,S] of one training batch."""
        # a task whose loss reads some tokens only (the masked-token tasks) has the model compute its outputs there
        loss_tokens = getattr(self.task, "loss_tokens", None)
        tokens, targets = loss_tokens(targets) if loss_tokens is not None else (None, targets)
        with self.autocast():
            outputs, stats = self.model(inputs, self.probes, pe_dropout_masks, output_tokens=tokens)
            return self.task.loss(outputs, targets), stats

    def evaluate(self, step: int, final: bool) -> list[dict]:
        """The evaluation's rows, with the training window since the last one."""
        window = None
        if self.filled:
            window = (self.loss_buffer[:self.filled].mean(0).cpu().numpy(),
                      self.stats_buffer[:self.filled].mean(0).cpu().numpy())
        return self.evaluation.rows(step, final, current_lrs(self.optimizer, self.M), window)

    def result(self) -> PackResult:
        M = self.M
        final_rows = [dict(row) for row in self.curves[-M:]]
        tables = [t.detach().cpu().numpy() for t in self.model.pe_tables()]
        pe_tables = {m: np.stack([t[m] for t in tables]) for m in range(M)} if tables else {}
        return PackResult(final=final_rows, curves=self.curves, pe_tables=pe_tables,
                          attention_maps=self.evaluation.attention_maps(), seconds=self.seconds, steps=self.step,
                          stopped=self.stopped)

    def state_dict(self) -> dict:
        state = {}
        for key, where in self.STATE.items():
            value = torch.get_rng_state() if where is None else operator.attrgetter(where)(self)
            state[key] = value.state_dict() if hasattr(value, "load_state_dict") else value
        return state

    def state_problem(self, state: dict) -> str | None:
        """What in a checkpoint's state (loaded safely, its keys and value kinds checked: run_folder.check_checkpoint)
        this pack's training could not have left, or None: its evaluation window of another size or dtype, a curves
        row of a model the pack lacks, the initial PE of other models (drawn from the seeds: another pack's
        checkpoint), a step its curves and window do not add up to (a step rewritten runs fewer steps than the
        results would record), then the rest of its training state (progress_problem)."""
        M = self.model.num_models
        step, filled, curves = state.get("step"), state.get("filled"), state.get("curves")
        buffer = state.get("loss_buffer")
        if not (isinstance(buffer, Tensor) and buffer.shape == self.loss_buffer.shape
                and buffer.dtype == self.loss_buffer.dtype):
            return (f"loss_buffer of {tuple(getattr(buffer, 'shape', ()))} {getattr(buffer, 'dtype', '')}, the "
                    f"pack's {tuple(self.loss_buffer.shape)} {self.loss_buffer.dtype}")
        stats = state.get("stats_buffer")
        probes = 0 if self.probes is None else len(self.probes)
        window_stats = (self.window, self.model_config.depth, M, self.model_config.heads, len(STAT_NAMES) + probes)
        if stats is not None and not (isinstance(stats, Tensor) and tuple(stats.shape) == window_stats
                                      and stats.dtype == self.loss_buffer.dtype):
            return f"stats_buffer of {tuple(getattr(stats, 'shape', ()))}, the pack's {window_stats}"
        if not (isinstance(curves, list) and all(isinstance(row, dict) for row in curves)):
            return "curves that are not rows"
        models = [row.get("model") for row in curves]
        if any(type(m) is not int or not 0 <= m < M for m in models):
            return f"a curves row of model {next(m for m in models if type(m) is not int or not 0 <= m < M)!r:.20}, " \
                   f"the pack has {M}"
        if any(type(row.get("step")) is not int for row in curves):
            return "a curves row without its step"
        initial = state.get("initial_pe")
        ours = self.evaluation.initial_pe
        if not (isinstance(initial, list) and len(initial) == len(ours) and all(
                isinstance(t, Tensor) and t.shape == o.shape and t.dtype == o.dtype and torch.equal(t, o)
                for t, o in zip(initial, ours))):
            return "the initial PE of other models (another pack's or sweep's checkpoint?)"  # drawn from the seeds
        evaluated = max((row["step"] for row in curves), default=0)
        if type(filled) is not int or type(step) is not int or filled != step - evaluated or filled > self.window:
            return f"step {step!r:.20} with {filled!r:.20} steps since its last evaluation, at step {evaluated}"
        seconds = state.get("seconds")
        if type(seconds) not in (int, float):  # a bool is a number to Python, not a training time
            return f"seconds {seconds!r:.20}"
        return self.progress_problem(state, step, evaluated)

    def progress_problem(self, state: dict, step: int, evaluated: int) -> str | None:
        """What in the optimizer's, schedule's, samplers', loss scaler's, RNG's and tangent kernel probe's states this
        pack's training could not have left at `step`, or None. Each has the structure (keys, lengths, tensors'
        shapes and dtypes, numbers' types) of this trainer's own state (the optimizer's after one step on zeros),
        the values the settings fix (the optimizer's hyperparameters, the schedule's base rates and its rate at
        `step`) and values its training can reach (second moments ≥ 0, the optimizer's step count the pack's, an
        epoch a permutation, generator states a generator takes): torch loads such a state as given, into a fused
        kernel that writes past a buffer of another shape, or a training other than the one the results record."""
        own = {**self.state_dict(), "optimizer": self.stepped_optimizer_state()}
        sampler = state["sampler"]
        if isinstance(sampler, dict) and isinstance(sampler.get("epoch"), Tensor):
            own["sampler"]["epoch"] = sampler["epoch"]  # a fresh sampler has none yet: checked below
        stacked = isinstance(self.optimizer, StackedOptimizer)
        if step == 0:  # no step taken: no moments yet
            own["optimizer"]["state"] = {}
        elif stacked:  # its count is one "step" until a model skips one, then each model's "beta_powers"
            for entry in own["optimizer"]["state"].values():
                entry.pop("step", None)
            for entry in (state["optimizer"].get("state") or {}).values():
                if isinstance(entry, dict) and (problem := stacked_count_problem(entry, step, self.M)) is not None:
                    return problem
        # torch's own options differ between its versions (a group's decoupled_weight_decay, a schedule's
        # _is_initial): a checkpoint written by another torch is checked on the options both know, as torch loads it
        found_groups = state["optimizer"].get("param_groups") if isinstance(state["optimizer"], dict) else None
        if isinstance(found_groups, list) and all(isinstance(group, dict) for group in found_groups):
            own["optimizer"]["param_groups"] = [{k: v for k, v in group.items()
                                                 if k in found or k in ("params", "lr", "initial_lr")}
                                                for group, found in zip(own["optimizer"]["param_groups"], found_groups)]
            state = {**state, "optimizer": {**state["optimizer"], "param_groups": [
                {k: v for k, v in found.items() if k in group}
                for found, group in zip(found_groups, own["optimizer"]["param_groups"])] + found_groups[
                    len(own["optimizer"]["param_groups"]):]}}
        if isinstance(state["scheduler"], dict):
            kept = set(own["scheduler"]) & set(state["scheduler"]) | {"base_lrs", "last_epoch", "_step_count",
                                                                       "_last_lr"}
            own["scheduler"] = {k: v for k, v in own["scheduler"].items() if k in kept}
            state = {**state, "scheduler": {k: v for k, v in state["scheduler"].items() if k in kept}}
        for key in ("optimizer", "scheduler", "sampler", "batches", "scaler", "torch_rng"):
            found = state[key] if key in state else None
            if stacked and key == "optimizer" and isinstance(found, dict) and isinstance(found.get("state"), dict):
                found = {**found, "state": {i: {k: v for k, v in entry.items() if k not in ("step", "beta_powers")}
                                            if isinstance(entry, dict) else entry
                                            for i, entry in found["state"].items()}}
            if key in state and (problem := structure_problem(own[key], found, key)) is not None:
                return problem
        groups, own_groups = state["optimizer"]["param_groups"], own["optimizer"]["param_groups"]
        for group, own_group in zip(groups, own_groups):
            for name, value in group.items():
                if name != "lr" and value != own_group[name]:
                    return f"optimizer {name} {value!r:.40}, where this pack's settings give {own_group[name]!r:.40}"
            if not math.isclose(group["lr"], group["initial_lr"] * lr_factor(step, self.config), rel_tol=1e-9):
                return f"optimizer lr {group['lr']!r:.20} at step {step}, not its schedule's"
        names = {id(p): name for name, p in self.model.named_parameters()}
        weights = [state["model"].get(names[id(p)]) for group in self.optimizer.param_groups for p in group["params"]]
        for index, entry in state["optimizer"]["state"].items():
            weight = weights[index] if type(index) is int and 0 <= index < len(weights) else None
            if (problem := moments_problem(entry, weight)) is not None:
                return f"optimizer.state.{index}.{problem}"
            if not stacked and "step" in entry and not float(entry["step"]) == step:  # torch's optimizers: a count
                return f"optimizer.state.{index}.step {float(entry['step']):g}, at the pack's step {step}"
        scheduler, own_scheduler = state["scheduler"], own["scheduler"]
        if scheduler["base_lrs"] != own_scheduler["base_lrs"] or scheduler["last_epoch"] != step:
            return (f"a schedule of base rates {scheduler['base_lrs']!r:.40} at step {scheduler['last_epoch']}, "
                    f"where this pack's is {own_scheduler['base_lrs']!r:.40} at step {step}")
        rates = [base * lr_factor(step, self.config) for base in scheduler["base_lrs"]]
        if scheduler["_step_count"] != step + 1 or not all(
                math.isclose(a, b, rel_tol=1e-9) for a, b in zip(scheduler["_last_lr"], rates)):
            return f"a schedule counting {scheduler['_step_count']!r:.20} steps at rates {scheduler['_last_lr']!r:.40}"
        position, epoch = sampler["position"], sampler["epoch"]
        per_epoch, items = self.sampler.per_epoch, self.sampler.num_items
        width = per_epoch * self.sampler.batch_size  # an epoch's items, its last partial batch dropped
        if not 0 <= position <= per_epoch or (epoch is None) != (step == 0) or epoch is not None and not (
                isinstance(epoch, Tensor) and epoch.dtype == torch.int64 and epoch.shape == (self.M, width)
                and bool(((epoch >= 0) & (epoch < items)).all())
                and bool((epoch.sort(dim=1).values.diff(dim=1) > 0).all())):  # a permutation's first items
            return (f"a batch sampler at batch {position!r:.20} of {per_epoch}, with an epoch "
                    f"{'of ' + str(tuple(epoch.shape)) if isinstance(epoch, Tensor) else repr(epoch)[:20]} "
                    f"(each model's a permutation's first {width} of {items} items)")
        batches = state.get("batches") or {}
        for where, generator_state in [("torch_rng", state["torch_rng"]),
                                       *((f"sampler.generators[{i}]", g) for i, g in enumerate(sampler["generators"])),
                                       *((f"batches.generators[{i}]", g)
                                         for i, g in enumerate(batches.get("generators", ())))]:
            try:
                torch.Generator().set_state(generator_state)
            except RuntimeError:
                return f"{where}: not a random-number generator's state"
        scale = state.get("scaler", {}).get("scale")
        if scale is not None and not bool(torch.isfinite(scale).all() and (scale > 0).all()):
            return "a loss scale that is not a positive number"
        if "tangent_kernel" not in state:  # a checkpoint from before the probe had a state (OPTIONAL_STATE_KEYS)
            return None
        probe = state["tangent_kernel"]
        if self.evaluation.tangent_kernel is None:  # loaded, a record would take the probe's place
            if probe is not None:
                return "a tangent kernel probe's state, where this pack has none (--ntk-items 0)"
            return None
        if not (isinstance(probe, dict) and set(probe) == {"previous"}):
            return "a tangent kernel probe's state of another form"
        previous = probe["previous"]
        if previous is not None:
            initial = self.evaluation.tangent_kernel.initial
            kernels = previous.get("kernels") if isinstance(previous, dict) else None
            if not (isinstance(kernels, dict) and set(kernels) == set(initial) and previous.get("step") == evaluated
                    and all(isinstance(kernels[k], Tensor) and kernels[k].shape == initial[k].shape
                            and kernels[k].dtype == initial[k].dtype for k in initial)):
                return "tangent kernels of another pack or step"
        return None

    def stepped_optimizer_state(self) -> dict:
        """The state_dict of this pack's optimizer after one step on zero gradients: the structure of a trained one's
        (this trainer's own optimizer has no per-parameter state before its first step)."""
        params = [torch.zeros_like(p, requires_grad=True) for p in self.model.parameters()]
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizer = make_optimizer(params, self.config)
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, self.config))  # sets initial_lr
        optimizer.step()
        return optimizer.state_dict()

    def load_state_dict(self, state: dict):
        for key, where in self.STATE.items():
            if key not in state:  # OPTIONAL_STATE_KEYS: "scaler" before fp16, none of which scaled its loss
                continue
            value = state[key]
            if where is None:
                torch.set_rng_state(value)
                continue
            owner_path, _, name = where.rpartition(".")
            owner = operator.attrgetter(owner_path)(self) if owner_path else self
            current = getattr(owner, name)
            if hasattr(current, "load_state_dict"):
                if value is not None:  # batches None: a checkpoint from before every task's batches had a state
                    current.load_state_dict(value)
            elif isinstance(value, Tensor):  # the evaluation window's buffers
                setattr(owner, name, value.to(self.device))
            else:
                setattr(owner, name, list(value) if isinstance(value, list) else value)
