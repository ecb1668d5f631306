"""The fused sublayers (backend "fused", pe_fast/ops/fused_attention_sublayer.py and fused_mlp_sublayer.py) against
the unfused path (float64 oracle).

CPU: the test_interpreter_* tests run the kernels in Triton's interpreter, in float64, in a child pytest process
started with TRITON_INTERPRET=1 (as tests/test_triton_attention.py does): outputs, statistics and every gradient
equal the reference path's to float64 rounding. The kernels also compile ahead of time for sm_90 (as
tests/test_triton_compile.py does) without register spills; PE_FAST_FUSED_AOT_RECORD=path writes the registers,
spills and shared memory as JSON (bench/results/fused-sublayers-20261201-cpu-aot.json).
"""
import concurrent.futures
import dataclasses
import json
import logging
import math
import multiprocessing
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")
from pe_fast.models.transformer import ModelConfig, StackedTransformer  # noqa: E402
from pe_fast.ops import fused_attention_sublayer as fa  # noqa: E402
from pe_fast.ops import fused_common as fc  # noqa: E402
from pe_fast.ops import fused_mlp_sublayer as fm  # noqa: E402
from pe_fast.ops import pe_attention  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from training import traffic  # noqa: E402  the byte ledger, and its count of the fused kernels

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
interpreter = pytest.mark.skipif(not INTERPRETED, reason="runs in the TRITON_INTERPRET=1 child process")
compiled_only = pytest.mark.skipif(INTERPRETED, reason="this process's kernels are interpreted, not compiled")
TOLERANCE = 1e-12  # relative to the largest value of each output: float64 rounding, not float32's


@compiled_only
def test_cpu_interpreter_suite_in_a_child_process():
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "test_interpreter_", __file__],
        env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stdout[-6000:] + child.stderr[-3000:]
    assert " passed" in child.stdout and "skipped" not in child.stdout, child.stdout[-3000:]


def assert_close(got: dict, expected: dict, tol: float = TOLERANCE):
    for name, e in expected.items():
        g = got[name]
        assert g.shape == e.shape and g.dtype == e.dtype, name
        error = (g.double() - e.double()).abs().max().item()
        assert error <= tol * max(e.double().abs().max().item(), 1e-300), f"{name}: error {error:.3g}"


def random(*shape, g):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


# ---- kernel A and kernel B against their definitions, through the reference op ----

def attention_sublayer_reference(x, pe, w_qkv, b_qkv, w_o, b_o, ln_w, ln_b, probes, num_heads, eps):
    out, stats = pe_attention(x, pe, w_qkv, b_qkv, num_heads, probes, backend="reference")
    residual = x if pe is None else x + pe[:, None]
    z = torch.baddbmm(b_o[:, None], out.flatten(1, 2), w_o).view_as(x) + residual
    return F.layer_norm(z, z.shape[-1:], eps=eps) * ln_w[:, None, None] + ln_b[:, None, None], stats


def mlp_sublayer_reference(x, w1, b1, w2, b2, ln_w, ln_b, eps):
    hidden = F.gelu(torch.baddbmm(b1[:, None], x.flatten(1, 2), w1))
    z = F.gelu(torch.baddbmm(b2[:, None], hidden, w2)).view_as(x) + x
    return F.layer_norm(z, z.shape[-1:], eps=eps) * ln_w[:, None, None] + ln_b[:, None, None]


def outputs_and_gradients(fn, leaves: dict, constants: tuple, grad, names_out=("y", "stats")):
    leaves = {k: None if v is None else v.detach().clone().requires_grad_() for k, v in leaves.items()}
    out = fn(*leaves.values(), *constants)
    out = out if isinstance(out, tuple) else (out,)
    present = {k: v for k, v in leaves.items() if v is not None}
    grads = torch.autograd.grad(out[0], list(present.values()), grad)
    return {**dict(zip(names_out, out)), **{"d" + k: g for k, g in zip(present, grads)}}


ATTENTION_CASES = {  # M, B, N, D, H, K, pe, b_qkv
    "lst-like-N16-3-tiles-probes": (1, 3, 16, 48, 1, 2, True, True),
    "N5-3-per-tile-1-row-padding-H2-dh20": (1, 4, 5, 40, 2, 1, True, True),
    "N7-no-pe-no-qkv-bias-2-models-H3-dh16": (2, 3, 7, 48, 3, 0, False, False),
}


@interpreter
@pytest.mark.parametrize("case", ATTENTION_CASES.values(), ids=ATTENTION_CASES.keys())
def test_interpreter_attention_sublayer_matches_reference_float64(case):
    M, B, N, D, H, K, with_pe, with_b = case
    g = torch.Generator().manual_seed(0)
    leaves = {"x": random(M, B, N, D, g=g), "pe": random(M, N, D, g=g) if with_pe else None,
              "w_qkv": random(M, D, 3 * D, g=g) / math.sqrt(D), "b_qkv": random(M, 3 * D, g=g) if with_b else None,
              "w_o": random(M, D, D, g=g) / math.sqrt(D), "b_o": random(M, D, g=g),
              "ln_w": 1 + 0.1 * random(M, D, g=g), "ln_b": 0.1 * random(M, D, g=g)}
    probes = (torch.rand(K, N, N, generator=g) > 0.5).double() if K else None
    grad = random(M, B, N, D, g=g)
    got = outputs_and_gradients(fa.AttentionSublayer.apply, leaves, (probes, H, 1e-5), grad)
    expected = outputs_and_gradients(attention_sublayer_reference, leaves, (probes, H, 1e-5), grad)
    assert got["stats"].dtype == torch.float32 and got["stats"].shape == (M, H, 3 + K)
    assert_close(got, expected)


@interpreter
@pytest.mark.parametrize("rows", [(2, 3, 7), (1, 1, 40)], ids=["21-rows-1-partial-tile", "40-rows-2-tiles"])
def test_interpreter_mlp_sublayer_matches_reference_float64(rows):
    M, B, N = rows
    D, F_ = 40, 72  # width below its padding; the last hidden chunk partial
    g = torch.Generator().manual_seed(1)
    leaves = {"x": random(M, B, N, D, g=g), "w1": random(M, D, F_, g=g) / math.sqrt(D), "b1": random(M, F_, g=g),
              "w2": random(M, F_, D, g=g) / math.sqrt(F_), "b2": random(M, D, g=g),
              "ln_w": 1 + 0.1 * random(M, D, g=g), "ln_b": 0.1 * random(M, D, g=g)}
    grad = random(M, B, N, D, g=g)
    got = outputs_and_gradients(fm.MLPSublayer.apply, leaves, (1e-5,), grad, ("y",))
    expected = outputs_and_gradients(mlp_sublayer_reference, leaves, (1e-5,), grad, ("y",))
    assert_close(got, expected)


# ---- the switch: a stacked transformer trains the same with and without fusion ----

def train(config: ModelConfig, backend: str, steps: int, device: str = "cpu",
          dtype: torch.dtype = torch.float64) -> dict:
    """Outputs, statistics and parameters of a tiny pack after `steps` SGD steps, in float64 (SGD, not Adam:
    Adam divides by √v, which blows the rounding noise of gradients that are 0 in exact arithmetic, the key
    bias's, up to ~1e-11)."""
    model, outputs, stats = train_on_device(config, backend, steps, device, dtype)
    return {"outputs": outputs.detach().cpu(), "stats": stats.cpu(),
            **{n: p.detach().cpu() for n, p in model.named_parameters()}}


def train_on_device(config: ModelConfig, backend: str, steps: int, device: str, dtype: torch.dtype):
    """train()'s pack, trained where it lives: (model, outputs, stats) on `device`."""
    model = StackedTransformer(dataclasses.replace(config, backend=backend), seeds=[3, 4],
                               sigmas=[0.5, 2.0]).to(device, dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    g = torch.Generator().manual_seed(5)
    tokens = random(2, 2, config.num_tokens, config.token_dim, g=g).to(device, dtype)
    probes = (torch.rand(2, config.num_tokens, config.num_tokens, generator=g) > 0.5).to(device, dtype)
    for _ in range(steps):
        outputs, stats = model(tokens, probes)
        targets = torch.arange(outputs[0].numel(), dtype=outputs.dtype, device=outputs.device).view_as(outputs[0]).cos()
        loss = (outputs - targets).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    outputs, stats = model(tokens, probes)
    return model, outputs, stats


def test_training_helper_keeps_every_tensor_on_the_models_device():
    """The CUDA check below builds its tensors as train_on_device does; on the meta device (no data, no GPU) a
    tensor left on the CPU fails as it would on CUDA (the H200 run of 2026-12-04 found the targets left there)."""
    model, outputs, stats = train_on_device(ModelConfig(**TINY, readout_token=5), "reference", 1, "meta",
                                            torch.float32)
    assert outputs.device.type == stats.device.type == "meta"


TINY = dict(num_tokens=8, token_dim=3, out_dim=2, width=24, depth=2, heads=2, mlp_width=40)


@interpreter
def test_interpreter_transformer_trains_the_same_fused(caplog):
    """Two blocks: the first fused whole, the last (reading out one token, as the LST's models do) computing the
    MLP sublayer at that token alone."""
    config = ModelConfig(**TINY, readout_token=5)
    with caplog.at_level(logging.WARNING, logger="pe_fast"):
        fused = train(config, "fused", 2)
    assert not [r for r in caplog.records if "unfused" in r.getMessage()]  # it did take the fused path
    reference = train(config, "reference", 2)
    assert (fused["blocks.0.mlp_in.weight"] - train(config, "reference", 0)[
        "blocks.0.mlp_in.weight"]).abs().max() > 1e-3  # the steps moved the weights
    assert_close(fused, reference)


@interpreter
@pytest.mark.parametrize("pe, num_tokens, warning", [
    ("rope", 8, "the attention sublayer unfused: RoPE is not fused (q and k are turned outside the kernels)"),
    ("learned", 20, "the attention sublayer unfused: N = 20 > 16: a sequence does not fit kernel A's tile")],
    ids=["rope", "N20"])
def test_interpreter_refused_attention_runs_unfused_with_one_warning_and_the_mlp_fused(pe, num_tokens, warning,
                                                                                     monkeypatch, caplog):
    """Kernel A refuses RoPE and sequences longer than its tile: every block runs its attention sublayer unfused,
    with one logged warning for all of them, and its MLP sublayer through kernel B (which does not care about N:
    the fMRI shapes' path); the pack trains as with the reference backend."""
    fc.warn_unfused.cache_clear()
    config = ModelConfig(**dict(TINY, num_tokens=num_tokens), pe=pe)
    mlp_calls, mlp_forward = [], fm.mlp_forward
    with monkeypatch.context() as patched, caplog.at_level(logging.WARNING, logger="pe_fast"):
        patched.setattr(fm, "mlp_forward", lambda *args: mlp_calls.append(1) or mlp_forward(*args))
        fused = train(config, "fused", 1)
    refusals = [r.getMessage() for r in caplog.records if "unfused" in r.getMessage()]
    assert refusals == [f"backend 'fused' runs {warning}"]
    assert len(mlp_calls) == 2 * 2  # 2 blocks, a training step's forward and the final one
    assert_close(fused, train(config, "reference", 1))


@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs a CUDA GPU, compiled Triton")
def test_cuda_transformer_trains_as_the_unfused_triton_path_in_float32():
    """On the GPU (bench/gpu/gpu_check.sh's tests step), at the LST width: fused and unfused float32 IEEE agree to
    float32 rounding after two steps."""
    config = ModelConfig(**dict(TINY, num_tokens=16, width=160, heads=1, mlp_width=640), readout_token=15)
    fused = train(config, "fused", 2, "cuda", torch.float32)
    assert_close(fused, train(config, "triton", 2, "cuda", torch.float32), 1e-4)


# ---- what the fused path refuses (no kernel runs) ----

def test_refusal_names_each_unsupported_input():
    x = torch.zeros(1, 2, 8, 24)
    assert fa.attention_refusal(x, None, None, None) is None
    assert fa.attention_refusal(x.double(), None, None, None) is None
    cos = torch.ones(8, 6)
    assert "RoPE" in fa.attention_refusal(x, (cos, cos), None, None)
    assert "relative-position bias" in fa.attention_refusal(x, None, torch.zeros(1, 2, 8, 8), None)
    assert "PE dropout" in fa.attention_refusal(x, None, None, torch.ones_like(x))
    long = torch.zeros(1, 2, 360, 24)
    assert "N = 360 > 16" in fa.attention_refusal(long, None, None, None)
    assert fm.mlp_refusal(long) is None  # kernel B takes any N: the fMRI shapes
    assert "float16" in fm.mlp_refusal(x.half()) and "float16" in fa.attention_refusal(x.half(), None, None, None)
    assert "width 512 > 256" in fm.mlp_refusal(torch.zeros(1, 2, 8, 512))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fa.attention_refusal(x, None, None, None) is None  # bf16 activations, float32 parameters


# ---- ahead-of-time compiles for sm_90 ----

SHAPES = {"lst": dict(N=16, D=160, H=1, F=640, K=2),  # the paper's LST shape (bench/training/traffic.py's defaults)
          "fmri": dict(D=32, F=64)}  # the fMRI default's MLP (its attention stays unfused: N = 100, 360)
KERNELS = ("attention_fwd", "attention_bwd", "wgrad_qkv", "wgrad_out", "mlp_fwd", "mlp_bwd", "mlp_wgrad")
AOT_JOBS = [(kernel, dtype, precision, "lst") for kernel in KERNELS
            for dtype, precision in (("fp32", "ieee"), ("fp32", "tf32"), ("bf16", "ieee"))]
AOT_JOBS += [(kernel, "fp32", "ieee", "fmri") for kernel in KERNELS[4:]]


def aot_source(kernel: str, dtype: str, precision: str, shape: str):
    """The kernel as its launcher calls it at that shape: activations in `dtype`, parameters in float32 (bf16
    activations come from autocast)."""
    from triton.compiler import ASTSource
    t, p = "*" + dtype, "*fp32"
    sh = SHAPES[shape]
    D, H = sh["D"], sh.get("H")
    if kernel.startswith("wgrad"):  # _weight_grad_kernel's two launches: x + pe against dqkv, o against dz (+ dx)
        cfg = fa.WEIGHT_GRAD
        qkv = kernel == "wgrad_qkv"
        const = dict(N=sh["N"], K=D, G_COLS=(3 if qkv else 1) * D, NP=16, BLOCK_T=cfg.block_t, CHUNK=cfg.chunk,
                     HAS_ADD=qkv, TOK_SUM=not qkv, ACC=triton.language.float32, PRECISION=precision)
        fn = fa._weight_grad_kernel
        args = dict(a_ptr=t, add_ptr=p if qkv else t, g_ptr=t, s_ptr=t, dw_ptr=p, col_sum_ptr=p, tok_sum_ptr=p,
                    R="i32")
    elif kernel.startswith("attention"):
        cfg = fa.attention_config(D // H)
        const = dict(N=sh["N"], D=D, DP=triton.next_power_of_2(D), H=H, BLOCK_T=cfg.block_t, CHUNK=cfg.chunk,
                     HAS_PE=True, HAS_ADD=True, ACC=triton.language.float32, PRECISION=precision)
        common = dict(pe_ptr=p, add_ptr=p, w_ptr=p, wo_ptr=p, bo_ptr=p, lnw_ptr=p, B="i32", num_tiles="i32",
                      eps="fp32")
        if kernel == "attention_fwd":
            fn = fa._attention_sublayer_fwd_kernel
            args = dict(common, x_ptr=t, lnb_ptr=p, probe_ptr="*u8", y_ptr=t, stat_ptr=p, qk_scale="fp32")
            const["NUM_PROBES"] = sh["K"]
        else:
            fn = fa._attention_sublayer_bwd_kernel
            args = dict(common, dy_ptr=t, x_ptr=t, dx_ptr=t, dz_ptr=t, o_ptr=t, dqkv_ptr=t, part_ptr=p, sm_scale="fp32")
    else:
        cfg = fm.mlp_config()
        const = dict(D=D, F=sh["F"], DP=triton.next_power_of_2(D), BLOCK_T=cfg.block_t, CHUNK=cfg.chunk,
                     HIDDEN_CHUNK=cfg.chunk, ACC=triton.language.float32, PRECISION=precision)
        common = dict(x_ptr=t, w1_ptr=p, b1_ptr=p, w2_ptr=p, b2_ptr=p, lnw_ptr=p, R="i32", eps="fp32")
        if kernel == "mlp_fwd":
            fn = fm._mlp_sublayer_fwd_kernel
            args = dict(common, lnb_ptr=p, y_ptr=t)
        elif kernel == "mlp_bwd":
            fn = fm._mlp_sublayer_bwd_kernel
            args = dict(common, dy_ptr=t, dx_ptr=t, da2_ptr=t, part_ptr=p, num_tiles="i32")
        else:
            fn = fm._mlp_weight_grad_kernel
            args = dict(x_ptr=t, da2_ptr=t, w1_ptr=p, b1_ptr=p, w2_ptr=p, dw1_ptr=p, dw2_ptr=p, db1_ptr=p, R="i32")
    signature = {name: args.get(name, "constexpr") for name in fn.arg_names}
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name, ty in args.items() if ty[0] == "*"}
    return ASTSource(fn=fn, signature=signature, constexprs=const, attrs=attrs), cfg


def aot_compile(job) -> dict:
    from triton.backends.compiler import GPUTarget
    from test_triton_compile import register_use
    source, cfg = aot_source(*job)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": cfg.warps, "num_stages": 1})
    return {"shared_bytes": compiled.metadata.shared, "block_rows": cfg.block_t, "warps": cfg.warps,
            **register_use(compiled.asm["ptx"], 90)}


@pytest.fixture(scope="module")
def aot():
    context = multiprocessing.get_context("spawn")  # the parent may hold MLIR/OpenMP threads
    with concurrent.futures.ProcessPoolExecutor(os.cpu_count() or 1, mp_context=context) as pool:
        results = dict(zip(AOT_JOBS, pool.map(aot_compile, AOT_JOBS)))
    record = os.environ.get("PE_FAST_FUSED_AOT_RECORD")
    if record:
        rows = [{"kernel": k, "dtype": d, "precision": p, "shape": s, **r} for (k, d, p, s), r in results.items()]
        with open(record, "w") as f:
            json.dump({"triton": triton.__version__, "target": "sm_90", "shapes": SHAPES, "kernels": rows}, f, indent=1)
    return results


@compiled_only
@pytest.mark.parametrize("job", AOT_JOBS, ids=["-".join(j) for j in AOT_JOBS])
def test_kernel_compiles_for_sm90_without_spills(aot, job):
    result = aot[job]
    assert result["spill_bytes"] == 0, result
    assert result["shared_bytes"] <= 227 * 1024, result


# ---- the byte ledger ----

def test_sublayer_traffic_against_a_hand_count():
    """M 2, B 3, N 4, D 8, H 2, F 12, one binary probe, float32: one 16-row tile per model in both kernels (32 rows
    executed). One activation [M,B,N,D] is 2·3·4·8·4 = 768 bytes; the statistics rows [M,H,S,B,N] 2·2·4·3·4·4 = 768."""
    shape = dict(M=2, B=3, N=4, D=8, H=2, F=12, K=1)
    act, pe, addend = 768, 2 * 4 * 8 * 4, 2 * 4 * 24 * 4
    w_qkv, w_o, vector = 2 * 8 * 24 * 4, 2 * 8 * 8 * 4, 2 * 8 * 4
    assert traffic.sublayer_traffic("attention_fwd", **shape) == (
        act + pe + addend + w_qkv + w_o + 3 * vector + 16 + 768,  # x, pe, addend, weights, b_o γ β, probe, rows
        act + 768 + 2 * 2 * 4 * 4,  # y, rows, stats [M,H,S]
        32 * (8 * 8 * 8 + 4 * 16 * 8))  # 32 rows · (QKV and out-projection 2·4·D², scores and P·V 2·2·16·D)
    assert traffic.sublayer_traffic("attention_bwd", **shape) == (
        2 * act + pe + addend + w_qkv + w_o + 2 * vector,  # dy, x, pe, addend, weights, b_o, γ
        3 * act + 3 * act + 2 * 2 * 8 * 4,  # dx, dz, o, dqkv, partial sums of dγ, dβ [2, M, 1 tile, D]
        32 * (28 * 8 * 8 + 14 * 16 * 8))
    # two launches over the 12 rows of each model in one 16-row step, [32, 32] blocks (D 8 and 3D 24 pad to 32):
    # x + pe against dqkv, o against dz, and the one-hot [16, 16] dot of the per-token sums of dx
    assert traffic.sublayer_traffic("attention_wgrad", **shape) == (
        act + pe + 3 * act + act + act + act,  # x, pe, dqkv, o, dz, dx
        2 * (8 * 24 + 24 + 8 * 8 + 8 + 4 * 8) * 4,  # dW_qkv, d b_qkv, dW_o, d b_o, dpe
        32 * (2 * 32 * 32 + 2 * 32 * 32 + 2 * 16 * 32))
    w1 = w2 = 2 * 8 * 12 * 4
    b1 = 2 * 12 * 4
    assert traffic.sublayer_traffic("mlp_fwd", **shape) == (act + w1 + w2 + b1 + 3 * vector, act, 32 * 4 * 8 * 12)
    assert traffic.sublayer_traffic("mlp_bwd", **shape) == (
        2 * act + w1 + w2 + b1 + 2 * vector,  # dy, x, weights, b_1, b_2, γ
        2 * act + 3 * 2 * 8 * 4,  # dx, d a2, partial sums [3, M, 1 tile, D]
        32 * 10 * 8 * 12)
    # one program per model and 32-unit hidden chunk (12 units: one, 20 idle), over the 12 rows in one 16-row step
    assert traffic.sublayer_traffic("mlp_wgrad", **shape) == (2 * act + w1 + w2 + b1, w1 + w2 + b1, 32 * 8 * 8 * 32)


def test_the_ledger_counts_each_fused_kernel_once_per_block():
    """bench/training/traffic.py on the fused step (fake tensors, no kernel runs): each block's six kernel calls as
    sublayer_traffic counts them (the last block's MLP at the masked tokens alone), and fewer bytes than the
    unfused step."""
    flags = ["--task", "netsim", "--nodes", "12", "--modules", "3", "--timepoints", "200", "--runs", "4", "--width",
             "16", "--depth", "2", "--heads", "2", "--mlp-width", "24", "--batch-size", "3", "--pe", "learned",
             "--sigmas", "1", "--seeds", "2", "--optimizer", "adamw"]
    _, task, model, train_config, seeds, sigmas = traffic.sweep_pack(flags, None, None)
    ledgers = {}
    for backend in ("fused", "reference"):
        ledgers[backend] = traffic.step_ledger(task, dataclasses.replace(model, backend=backend), train_config,
                                               seeds, sigmas)
    fused = {e.op: e for e in ledgers["fused"].entries.values() if e.kind == "fused op"}
    kernels = ("attention_bwd", "attention_fwd", "attention_wgrad", "mlp_bwd", "mlp_fwd", "mlp_wgrad")
    assert sorted(fused) == [f"pe_fast::fused {k}" for k in kernels]
    for kernel in kernels:
        e = fused[f"pe_fast::fused {kernel}"]
        # tokens per item in the two blocks: every one, then (the MLP after the last attention) the masked ones
        tokens = (12, task.num_masked if kernel.startswith("mlp") else 12)
        expected = [sum(per_block) for per_block in zip(*(
            traffic.sublayer_traffic(kernel, M=2, B=3, N=n, D=16, H=2, F=24, K=task.probes.shape[0],
                                     probe=task.probes.element_size()) for n in tokens))]
        assert (e.calls, e.read, e.written, e.flops) == (2, *expected), kernel
    assert not any(e.op.startswith("pe_fast::pe_attention") for e in ledgers["fused"].entries.values())
    assert ledgers["fused"].bytes_per_model_step < ledgers["reference"].bytes_per_model_step
