"""A byte ledger of the sweep's own training step: every kernel's bytes read and written and its FLOPs, per
model-step, and the throughput ceiling they imply on a GPU.

    python bench/training/traffic.py --task lst --preset paper --models 90 --precision tf32 [--json PATH]
                            [--bandwidth B_PER_S] [--peak-tflops T] [any other flag of python -m pe_fast.sweep]

The step is pe_fast.train.PackTrainer.train_step itself (the batch, forward, loss, backward, optimizer step and the
statistics buffers) of a pack built from the sweep's own settings (pe_fast.sweep.settings.from_flags and the grid's
model and training configurations): the first pack of the sweep's grid (--pe KIND picks the kind), or --models of
its models. It runs on fake tensors (FakeTensorMode: shapes and dtypes, no data), so the paper's 90-model pack
costs a few seconds of CPU and no GPU. The first step, which also allocates the optimizer's state and the
statistics buffer, runs uncounted; the second is counted. What is counted, op by op as the dispatcher sees them:
  * reads: the op's tensor inputs at their real storage extent (an expanded view's stride-0 dims count once);
    writes: its outputs and the inputs it writes. Views (view, reshape of a contiguous tensor, transpose, expand,
    slice, detach) move nothing. Fused AdamW reads parameter, gradient and both moments and writes all but the
    gradient: 28 bytes per float32 parameter.
  * materialised broadcasts, reported as rows of their own: CUDA's baddbmm first copies its bias, broadcast to
    the output's shape, into the output, and the GEMM then reads it back (the copy kernels of an H200 profile
    of the step); a copy of an expanded view writes the whole expanded tensor.
  * pe_fast::pe_attention (forward and backward) counts as the fused op's own kernels, bench_ops.py's
    fused_kernel_bytes and fused_kernel_flops, not as the reference decomposition that runs on the fake tensors.
  * --backend fused: the fused sublayer kernels (pe_fast/ops/fused_attention_sublayer.py, fused_mlp_sublayer.py)
    count as sublayer_traffic says (their loads and stores, from their code).
  * FLOPs: torch.utils.flop_counter's formulas (the GEMMs); element-wise work counts none.
  * precision: float32 for fp32 and tf32 (TF32 changes the tensor cores' rate, not the bytes); the 16-bit ones run
    under autocast, with CUDA's rules where CPU's differ (layer_norm runs in float32 on CUDA).
  * eager kernels only: torch.compile's fusion (--compile on) is NOT counted. Compiled, element-wise chains fuse
    into fewer passes (the baddbmm copies stay: inductor calls aten's baddbmm); no CUDA build here to count them.
  * the fake tensors are all on one device, so the little host work of a step (the masked-region tasks draw their
    masks on the CPU: B·N elements per model, against the step's B·N·D) counts as device traffic.
The ceiling is bandwidth / bytes per model-step (default: the 4.3 TB/s reachable on an H200) and peak / FLOPs
per model-step (default: the H200's dense rate for the precision); the lower one bounds the step.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import itertools
import json
import math
import sys
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only
from torch.utils.flop_counter import flop_registry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure.py, the scripts as kind.name
from op.bench_ops import BACKWARD_KERNELS, FORWARD_KERNELS, fused_kernel_bytes, fused_kernel_flops  # the op's own

from pe_fast import precision
from pe_fast.models.transformer import FUSED
from pe_fast.ops.backends import BACKENDS
from pe_fast.ops.pe_attention import OpInputs
from pe_fast.sweep import grid
from pe_fast.sweep.settings import UsageError, build_parser, from_flags
from pe_fast.sweep.task_loading import load_task
from pe_fast.train import PackTrainer

aten = torch.ops.aten

# Reachable HBM bandwidth of an H200: its step's GELU kernels ran at 4.24–4.40 TB/s in an H200 profile
H200_BYTES_PER_S = 4.3e12
# Dense peak TFLOP/s by precision (NVIDIA's data sheets, without sparsity): fp32 on CUDA cores.
PEAKS = {"H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0},
         "H100": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},  # SXM
         "H200": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}}

PHASES = ("forward", "backward", "update")  # update: the optimizer step and the statistics buffers
# Ops that move no bytes beyond the views OpOverload.is_view names: a reshape's alias, and allocations
FREE_OPS = {aten._unsafe_view, aten.empty, aten.empty_like, aten.new_empty, aten.empty_strided,
            aten.new_empty_strided, aten.empty_permuted}
# Ops that overwrite the tensor they write without reading it
OVERWRITES = {aten.copy_, aten.fill_, aten.zero_, aten.bernoulli_, aten.uniform_, aten.normal_, aten.random_,
              aten.exponential_}
COPIES = {aten.copy_, aten.clone, aten._to_copy, aten.expand_copy, aten.repeat}
# Ops that read of their first input only the elements they gather (their output), and all of their indices
GATHERS = {aten.index, aten.index_select, aten.gather, aten.embedding}
# Out-of-place GEMMs whose CUDA kernel copies C (self, broadcast to the output's shape) into the output first and
# then reads it back as cuBLAS's beta·C; addmm with a 1-D bias takes cuBLASLt's bias epilogue instead.
GEMMS_WITH_C = {aten.baddbmm, aten.addmm}
# Fused optimizers write the gradients back only when they unscale them (grad_scale; the sweep has none)
FUSED_OPTIMIZERS = {aten._fused_adam_, aten._fused_adamw_, aten._fused_sgd_}
PE_ATTENTION = torch.ops.pe_fast.pe_attention.default


def peak_tflops(device_name: str, precision_name: str) -> float | None:
    for key, peaks in PEAKS.items():  # "H100 PCIe" is tried before "H100"
        if key in device_name:
            return peaks[precision_name]
    return None


def distinct_elements(t: Tensor) -> int:
    """The elements of t's storage that t covers: an expanded view's stride-0 dims once."""
    return 0 if t.numel() == 0 else math.prod(size for size, stride in zip(t.shape, t.stride()) if stride != 0)


def stored_bytes(t: Tensor) -> int:
    """The bytes a kernel touches of t."""
    return distinct_elements(t) * t.element_size()


def logical_bytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def tensors_in(value) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for t in value if isinstance(t, Tensor)]
    return []


@dataclasses.dataclass
class Entry:
    """One kind of kernel of the step: an op in one phase, its calls and their totals over the whole pack."""
    phase: str
    op: str
    kind: str = ""  # "fused op" (the op's own count), "materialised broadcast", or ""
    calls: int = 0
    read: int = 0
    written: int = 0
    flops: float = 0.0

    @property
    def moved(self) -> int:
        return self.read + self.written


@dataclasses.dataclass
class Ledger:
    """Every kernel of one training step of a pack of `num_models` models."""
    num_models: int
    entries: dict[tuple[str, str, str], Entry] = dataclasses.field(default_factory=dict)
    phase: str = "forward"
    muted: bool = False  # inside a fused op, whose own count stands for the ops it runs
    # what a GPU runs for pe_attention beyond the fused kernels counted (fused_count_caveats)
    caveats: set[str] = dataclasses.field(default_factory=set)

    def add(self, op: str, read: int, written: int, flops: float = 0.0, kind: str = ""):
        entry = self.entries.setdefault((self.phase, op, kind), Entry(self.phase, op, kind))
        entry.calls += 1
        entry.read += read
        entry.written += written
        entry.flops += flops

    def rows(self) -> list[Entry]:
        """The entries, most bytes first."""
        return sorted(self.entries.values(), key=lambda e: (-e.moved, -e.flops, e.op))

    @property
    def bytes_per_model_step(self) -> float:
        return sum(e.moved for e in self.entries.values()) / self.num_models

    @property
    def flops_per_model_step(self) -> float:
        return sum(e.flops for e in self.entries.values()) / self.num_models

    def ceilings(self, bytes_per_s: float, flops_per_s: float) -> dict[str, float]:
        """Model-steps/s the bandwidth and the peak FLOP rate each allow."""
        return {"bandwidth": bytes_per_s / self.bytes_per_model_step,
                "compute": flops_per_s / self.flops_per_model_step if self.flops_per_model_step else math.inf}


def count_aten_op(ledger: Ledger, func, args, kwargs, out):
    """The bytes and FLOPs of one op as its CUDA kernel moves them (the rules in the module's docstring)."""
    packet = func.overloadpacket
    if func.is_view or packet in FREE_OPS:
        return
    read, written, read_ids, written_ids = 0, 0, set(), set()
    for index, argument in enumerate(func._schema.arguments):
        value = args[index] if index < len(args) else kwargs.get(argument.name)
        writes = argument.alias_info is not None and argument.alias_info.is_write
        if packet in FUSED_OPTIMIZERS and argument.name == "grads" and kwargs.get("grad_scale") is None:
            writes = False
        for t in tensors_in(value):
            if writes:
                written += stored_bytes(t)
                written_ids.add(id(t))
            if not (writes and (argument.is_out or packet in OVERWRITES)) and id(t) not in read_ids:
                read += logical_bytes(out) if packet in GATHERS and index == 0 else stored_bytes(t)
                read_ids.add(id(t))
    outputs = [t for t in tensors_in(out) if id(t) not in written_ids]  # an in-place op returns what it wrote
    if not outputs and not written_ids:
        return  # metadata (prim.device, sizes): no kernel
    written += sum(logical_bytes(t) for t in outputs)
    flops = flop_registry[packet](*args, **kwargs, out_val=out) if packet in flop_registry else 0
    name = str(func)
    c = args[0] if args else None
    if packet in GEMMS_WITH_C and kwargs.get("beta", 1) != 0 and not (packet is aten.addmm and c.dim() == 1):
        # the C copy, which reads self; the GEMM then reads C back from the output instead
        broadcast = tuple(c.shape) != tuple(out.shape)
        ledger.add(f"{name}: C copied into the output", stored_bytes(c), logical_bytes(out),
                   kind="materialised broadcast" if broadcast else "")
        read += logical_bytes(out) - stored_bytes(c)
    kind = ""
    if packet in COPIES:
        source, target = (args[1], args[0]) if packet is aten.copy_ else (args[0], out)
        if distinct_elements(source) < target.numel():  # an expanded view (or a repeat), written out whole
            kind = "materialised broadcast"
    ledger.add(name, read, written, flops, kind)


class CountingMode(TorchDispatchMode):
    """Counts every op that reaches the dispatcher, unless a fused op's own count stands for it."""

    def __init__(self, ledger: Ledger):
        super().__init__()
        self.ledger = ledger

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.ledger.muted:
            counted = op_traffic(func, args) if "pe_fast.ops.fused_common" in sys.modules else None
            if counted:  # a fused sublayer kernel: its own count (it reads more than its arguments)
                self.ledger.add(*counted, kind="fused op")
            else:
                count_aten_op(self.ledger, func, args, kwargs, out)
        return out


def sublayer_traffic(kernel: str, *, M: int, B: int, N: int, D: int, H: int = 1, F: int = 0, K: int = 0,
                     act: int = 4, param: int = 4, probe: int = 1, pe: bool = True,
                     addend: bool = True) -> tuple[int, int, float]:
    """(bytes read, bytes written, FLOPs) of one call of `kernel` (attention_fwd, attention_bwd,
    attention_wgrad, mlp_fwd, mlp_bwd, mlp_wgrad) over a pack, counted from the kernels' code: every tensor a
    program loads, once (the weights and the PE's addend once per launch: every tile of a model re-reads them, from
    L2), every tensor it stores, once; dz and d a2, read back by the program that wrote them, from L2, and the
    activations the weight-gradient kernels' programs of one model all read, from L2 after the first. act, param,
    probe: bytes per activation, parameter and probe element. The attention forward's statistics rows [M,H,S,B,N]
    (in the accumulation dtype) are written by the kernel and read once by the mean over (B, N) after it. FLOPs:
    the dots the programs run, with their padding rows and recomputations (2 per multiply-add), at the true width:
    the [rows, width] products padded to a power of two (160 -> 256) run up to 60 % more."""
    from pe_fast.ops.fused_attention_sublayer import WEIGHT_GRAD, attention_config, attention_tiles
    from pe_fast.ops.fused_common import padded
    from pe_fast.ops.fused_mlp_sublayer import mlp_config
    acc = 8 if act == 8 else 4
    rows = M * B * N * D * act  # one activation tensor [M,B,N,D]
    pe_bytes = M * N * D * param if pe else 0
    addend_bytes = M * N * 3 * D * param if addend else 0
    if kernel.startswith("attention"):
        cfg = attention_config(D // H)
        executed = M * attention_tiles(B, N, cfg) * cfg.block_t
        parts = 2 * M * attention_tiles(B, N, cfg) * D * acc
        weights = M * (3 * D * D + D * D + 2 * D) * param  # W_qkv, W_o, b_o, γ
        if kernel == "attention_fwd":
            stat_rows = M * H * (3 + K) * B * N * acc
            read = rows + pe_bytes + addend_bytes + weights + M * D * param + K * N * N * probe + stat_rows
            written = rows + stat_rows + M * H * (3 + K) * 4
            return read, written, executed * (8 * D * D + 4 * cfg.block_t * D)
        if kernel == "attention_bwd":
            read = 2 * rows + pe_bytes + addend_bytes + weights  # dy, x
            written = 3 * rows + 3 * rows + parts  # dx, dz, o, dqkv
            return read, written, executed * (28 * D * D + 14 * cfg.block_t * D)
        if kernel == "attention_wgrad":  # two launches of _weight_grad_kernel
            chunk = WEIGHT_GRAD.chunk
            rows_run = M * padded(B * N, WEIGHT_GRAD.block_t)
            read = 6 * rows + (rows + pe_bytes if pe else 0)  # x, dqkv (3), o, dz; with a PE, dx and pe
            written = M * (4 * D * D + 4 * D + (N * D if pe else 0)) * acc  # dW_qkv, d b_qkv, dW_o, d b_o, dpe
            flops = 2 * padded(D, chunk) * (padded(3 * D, chunk) + padded(D, chunk))
            if pe:  # the per-token sums of dx: a one-hot [16, rows] dot per column block
                flops += 2 * max(16, 1 << (N - 1).bit_length()) * padded(D, chunk)
            return read, written, rows_run * flops
    cfg = mlp_config()
    tiles = -(-(B * N) // cfg.block_t)
    executed = M * tiles * cfg.block_t
    weights = M * (2 * D * F + F + 2 * D) * param  # W_1, W_2, b_1, b_2, γ
    if kernel == "mlp_fwd":
        return rows + weights + M * D * param, rows, executed * 4 * D * F
    if kernel == "mlp_bwd":
        return 2 * rows + weights, 2 * rows + M * tiles * 3 * D * acc, executed * 10 * D * F
    if kernel == "mlp_wgrad":  # every hidden chunk's program runs over all rows: x and d a2 from L2 after the first
        padded_f = -(-F // cfg.chunk) * cfg.chunk
        return 2 * rows + M * (2 * D * F + F) * param, M * (2 * D * F + F) * acc, executed * 8 * D * padded_f
    raise ValueError(f"unknown fused kernel {kernel!r}")


def op_traffic(func, args) -> tuple[str, int, int, float] | None:
    """(name, bytes read, bytes written, FLOPs) of a call of one of the fused sublayer ops (a torch OpOverload and
    its arguments, as a dispatch mode sees them), from `sublayer_traffic`; None for any other op."""
    kernel = _fused_op_kernels().get(func.overloadpacket)
    if kernel is None:
        return None
    names = [a.name for a in func._schema.arguments]
    a = dict(zip(names, args))
    x = a["x"]
    M, B, N, D = x.shape if x.dim() == 4 else (x.shape[0], 1, x[0].numel() // x.shape[-1], x.shape[-1])
    param = next((a[k].element_size() for k in ("w_qkv", "w1", "pe") if a.get(k) is not None), 4)  # parameters
    probes = a.get("probes")
    counts = sublayer_traffic(
        kernel, M=M, B=B, N=N, D=D, H=a.get("num_heads", 1), F=a["w1"].shape[-1] if "w1" in a else 0,
        K=0 if probes is None else probes.shape[0], act=x.element_size(), param=param,
        probe=1 if probes is None else 4 if probes.dtype == torch.float64 else probes.element_size(),  # kernel_probes
        pe=a.get("pe") is not None, addend=a.get("addend") is not None)
    return f"pe_fast::fused {kernel}", *counts


@functools.cache
def _fused_op_kernels() -> dict:
    """The fused sublayer ops' overload packets -> their kernel's name in sublayer_traffic (imported where the ops
    ran: they need triton)."""
    from pe_fast.ops import fused_attention_sublayer as attention, fused_mlp_sublayer as mlp
    ops = {attention.attention_sublayer_forward: "attention_fwd", attention.attention_sublayer_backward: "attention_bwd",
           attention.attention_weight_gradients: "attention_wgrad", mlp.mlp_sublayer_forward: "mlp_fwd",
           mlp.mlp_sublayer_backward: "mlp_bwd", mlp.mlp_weight_gradients: "mlp_wgrad"}
    return {op._opoverload.overloadpacket: kernel for op, kernel in ops.items()}


def fused_count_caveats(inputs: OpInputs) -> list[str]:
    """What CUDA's Triton backend runs for this call beyond the fused kernels counted (nothing said where triton
    is not installed: it registers its backend, GPU or not)."""
    triton = BACKENDS.get("triton")
    if triton is None:
        return []
    reason = triton.reference_reason(inputs.x, inputs.num_heads, inputs.bias)
    if reason:
        return [f"pe_attention runs its unfused reference on CUDA ({reason})"]
    from pe_fast.ops.triton_attention import PACK_MAX_N
    caveats = []
    if inputs.rope_cos is not None:
        caveats.append("RoPE turns q and k with torch ops around pe_attention's kernels")
    if inputs.x.shape[2] > PACK_MAX_N:
        caveats.append("past N = 32, torch adds the PE's share of q, k, v before pe_attention's kernel (a pass)")
    return caveats


def count_fused_kernels(ledger: Ledger, inputs: OpInputs, kernels):
    ledger.caveats.update(fused_count_caveats(inputs))
    M, B, N, D = inputs.x.shape
    K = 0 if inputs.probes is None else inputs.probes.shape[0]
    moved = fused_kernel_bytes(M, B, N, D, inputs.num_heads, K, inputs.x.element_size())
    flops = fused_kernel_flops(M, B, N, D, inputs.num_heads)
    for kernel in kernels:
        ledger.add(f"pe_fast::pe_attention {kernel}", *moved[kernel], flops[kernel], kind="fused op")


class FusedAttentionNode(torch.autograd.Function):
    """pe_fast::pe_attention's autograd node as the ledger runs it: forward, the op itself (on fake tensors, its
    fake kernel); backward, the fused op's backward kernels counted and gradients of the inputs' shapes and dtypes
    returned uncomputed. The rest of the step's graph is the real one; no backend runs on the fake tensors."""

    @staticmethod
    def forward(ctx, ledger: Ledger, op, *args):
        ctx.ledger, ctx.inputs = ledger, OpInputs(*args)
        ctx.set_materialize_grads(False)
        ledger.muted = True  # the op's own count stands for it
        try:
            outputs = op(*args)
        finally:
            ledger.muted = False
        ctx.mark_non_differentiable(*outputs[1:])  # stats, and what the backward needs
        return outputs

    @staticmethod
    def backward(ctx, grad_out, *_):
        if grad_out is not None:  # else out never reached the loss: no backward kernel runs
            count_fused_kernels(ctx.ledger, ctx.inputs, BACKWARD_KERNELS)
        grads = [torch.empty_like(value) if needed else None
                 for value, needed in zip(ctx.inputs, ctx.needs_input_grad[2:])]
        return None, None, *grads


class StepSemantics(TorchFunctionMode):
    """What the dispatcher alone cannot tell: the phase of the step (Tensor.backward begins the backward, the
    update follows it); pe_fast::pe_attention as its fused kernels (FusedAttentionNode); and CUDA's autocast rule
    for layer_norm (float32 on CUDA; CPU's autocast, which the fake CPU tensors run under, keeps bf16)."""

    def __init__(self, ledger: Ledger):
        super().__init__()
        self.ledger = ledger

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is PE_ATTENTION:
            inputs = OpInputs(*args, **kwargs)
            count_fused_kernels(self.ledger, inputs, FORWARD_KERNELS)
            return FusedAttentionNode.apply(self.ledger, func, *inputs)
        if func in (Tensor.backward, torch.autograd.backward):
            self.ledger.phase = "backward"
            try:
                return func(*args, **kwargs)
            finally:
                self.ledger.phase = "update"
        if func is F.layer_norm and torch.is_autocast_enabled("cpu"):
            low = torch.get_autocast_dtype("cpu")
            args, kwargs = tree_map_only(Tensor, lambda t: t.float() if t.dtype == low else t, (args, kwargs))
        return func(*args, **kwargs)


@contextlib.contextmanager
def fake_tensors():
    """Everything made inside is a fake CPU tensor (the task's real data become fakes when first used)."""
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    swap_tensors = torch.utils.swap_tensors

    def swap_fake_tensors(t1, t2):
        # Module.to() swaps fake parameters, but FakeTensorMode's memo holds weak references to them, which
        # swap_tensors refuses (pytorch/pytorch#148977). The memo only saves re-wrapping a tensor: drop them.
        memo = fake.fake_tensor_converter.tensor_memo
        for key in [k for k, v in memo.items() if v is t1 or v is t2]:
            del memo[key]
        swap_tensors(t1, t2)

    with fake, mock.patch("torch.utils.swap_tensors", swap_fake_tensors):
        yield


def step_ledger(task, model_config, train_config, seeds: list[int], sigmas: list[float | None]) -> Ledger:
    """The ledger of PackTrainer.train_step for this pack (PackTrainer's own arguments), eager, on fake tensors."""
    # eval_every ≥ 2: the counted step is the second of the window it fills
    train_config = dataclasses.replace(train_config, compile="off", eval_every=max(2, train_config.eval_every))
    # the model's backend (--backend) may name a CUDA one: pe_attention counts as its Triton kernels whichever runs,
    # and the fake tensors, on the CPU, never reach a backend; so the named one is let take them
    name = "triton" if model_config.backend == FUSED else model_config.backend
    on_fake = {}
    if name in BACKENDS:
        on_fake[name] = dataclasses.replace(BACKENDS[name], devices=(*BACKENDS[name].devices, "cpu"))
    with mock.patch.dict(BACKENDS, on_fake), fake_tensors():
        trainer = PackTrainer(task, model_config, train_config, seeds, sigmas, torch.device("cpu"))
        for _ in range(2):  # the first step also allocates the optimizer's state and the statistics buffer
            ledger = Ledger(len(seeds))
            with StepSemantics(ledger), CountingMode(ledger):
                trainer.train_step()
    return ledger


# ---- the command line ----

def sweep_pack(sweep_flags: list[str], models: int | None, precision_name: str | None):
    """(settings, task, model config, train config, seeds, sigmas) of the pack the sweep's flags describe: its
    first pack (one PE kind, one optimizer kind), or `models` of that pack's models, in `precision_name` (default:
    the sweep's)."""
    s = from_flags(build_parser().parse_args([*sweep_flags, "--device", "cpu", "--compile", "off"]))  # fake, eager
    first = grid.split_into_packs(grid.expand_grid(s), s.max_pack or sys.maxsize)[0]
    pack = list(itertools.islice(itertools.cycle(first), models or len(first)))
    task = load_task(s)
    train = dataclasses.replace(grid.train_config(s, pack), precision=precision_name or s.precision)
    return (s, task, grid.model_config(s, task, pack[0]["pe"]), train, [m["seed"] for m in pack],
            [m["sigma"] for m in pack])


def report(ledger: Ledger, header: str, bytes_per_s: float, flops_per_s: float) -> str:
    per_model = 1 / ledger.num_models
    total = ledger.bytes_per_model_step
    lines = [header, "EAGER kernels: torch.compile's fusion is not counted (see --help).", "",
             (f"{'phase':8s} {'op':58s} {'calls':>5s} {'MB read':>9s} {'MB written':>10s} {'GFLOP':>7s} "
              f"{'bytes':>6s}  note")]
    for e in ledger.rows():
        lines.append(f"{e.phase:8s} {e.op[:58]:58s} {e.calls:5d} {e.read * per_model / 1e6:9.2f} "
                     f"{e.written * per_model / 1e6:10.2f} {e.flops * per_model / 1e9:7.3f} "
                     f"{100 * e.moved * per_model / total:5.1f}%  {e.kind}")
    for phase in PHASES:
        moved = sum(e.moved for e in ledger.entries.values() if e.phase == phase) * per_model
        lines.append(f"{phase:8s} {'(all)':58s} {'':5s} {'':9s} {'':10s} {'':7s} {100 * moved / total:5.1f}%  "
                     f"{moved / 1e6:.1f} MB")
    read = sum(e.read for e in ledger.entries.values()) * per_model
    ceilings = ledger.ceilings(bytes_per_s, flops_per_s)
    bound = min(ceilings, key=ceilings.get)
    flops = ledger.flops_per_model_step
    lines += [(f"{'total':8s} {'':58s} {sum(e.calls for e in ledger.entries.values()):5d} {read / 1e6:9.2f} "
               f"{(total - read) / 1e6:10.2f} {flops / 1e9:7.3f} 100.0%"), "",
              (f"bytes per model-step: {total / 1e6:.1f} MB; FLOPs per model-step: {flops / 1e9:.2f} GFLOP "
               f"({flops / total:.1f} FLOP/byte)"),
              (f"ceiling: {ceilings['bandwidth']:,.0f} model-steps/s at {bytes_per_s / 1e12:.2f} TB/s, "
               f"{ceilings['compute']:,.0f} at {flops_per_s / 1e12:.1f} TFLOP/s: {bound}-bound")]
    lines += [f"NOT COUNTED: {caveat}" for caveat in sorted(ledger.caveats)]
    return "\n".join(lines)


def to_json(ledger: Ledger, settings: dict, bytes_per_s: float, flops_per_s: float) -> dict:
    per_model = 1 / ledger.num_models
    return {"benchmark": "traffic", "counts": "eager kernels; torch.compile's fusion is not counted",
            "settings": settings, "bytes_per_s": bytes_per_s, "flops_per_s": flops_per_s,
            "bytes_per_model_step": ledger.bytes_per_model_step, "flops_per_model_step": ledger.flops_per_model_step,
            "ceiling_model_steps_per_s": ledger.ceilings(bytes_per_s, flops_per_s),
            "not_counted": sorted(ledger.caveats),
            "rows": [{"phase": e.phase, "op": e.op, "kind": e.kind, "calls": e.calls,
                      "bytes_read_per_model_step": e.read * per_model,
                      "bytes_written_per_model_step": e.written * per_model,
                      "flops_per_model_step": e.flops * per_model} for e in ledger.rows()]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,  # --pe is the sweep's
        usage="%(prog)s [--task TASK] [--preset NAME] [--models M] [--precision P] [--json PATH] [sweep flags...]")
    p.add_argument("--task", help="the sweep's --task")
    p.add_argument("--preset", help="the sweep's --preset")
    p.add_argument("--models", type=int, help="models in the pack (default: the sweep's first pack, as many as the "
                                              "grid has of its PE kind, at most --max-pack)")
    p.add_argument("--precision", choices=precision.PRECISIONS, help="default: the sweep's (fp32)")
    p.add_argument("--bandwidth", type=float, default=H200_BYTES_PER_S,
                   help=f"bytes/s for the ceiling (default {H200_BYTES_PER_S:.2g}: reachable on an H200)")
    p.add_argument("--peak-tflops", type=float, help="TFLOP/s for the ceiling (default: the H200's dense rate)")
    p.add_argument("--json", metavar="PATH", help="also write the ledger here")
    args, sweep_flags = p.parse_known_args(argv)
    if args.models is not None and args.models < 1:
        p.error("--models must be positive")
    named = [*(["--task", args.task] if args.task else []), *(["--preset", args.preset] if args.preset else [])]
    try:
        s, task, model_config, train_config, seeds, sigmas = sweep_pack(named + sweep_flags, args.models,
                                                                       args.precision)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    name = train_config.precision
    peak = (args.peak_tflops or peak_tflops("H200", name)) * 1e12
    # --backend fused: the blocks take the fused sublayer ops (pe_fast.ops.fused_*_sublayer), as the sweep's workers do
    ledger = step_ledger(task, model_config, train_config, seeds, sigmas)
    described = {"task": s.task, "preset": s.preset, "pe": model_config.pe, "models": len(seeds), "precision": name,
                 "batch_size": train_config.batch_size, "tokens": model_config.num_tokens, "width": model_config.width,
                 "depth": model_config.depth, "heads": model_config.heads, "mlp_width": model_config.mlp_width,
                 "optimizer": train_config.optimizer, "backend": s.backend}
    header = (f"Training step of {s.task}" + (f" --preset {s.preset}" if s.preset else "") + ": " +
              ", ".join(f"{k} {v}" for k, v in described.items() if k not in ("task", "preset")))
    print(report(ledger, header, args.bandwidth, peak))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(to_json(ledger, described, args.bandwidth, peak), indent=1))
        print(f"written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
