"""The "triton" pe_attention backend against the reference (float64 oracle).

CPU: the test_interpreter_* tests run the kernels in Triton's interpreter. Triton decides compile-or-interpret
for every @triton.jit function (its own tl.sum included) when it is imported, so they run in a child pytest
process started with TRITON_INTERPRET=1 (directly: `TRITON_INTERPRET=1 pytest tests/test_triton_attention.py`).
Every program instance runs in numpy, so shapes are small, and fp32 only (the interpreter's bf16 tl.dot is wrong).
CUDA (skipped without a GPU): longer sequences, wider and more heads, bf16 and TF32 with flash-attention's rule
for low precision: the kernel's error is at most twice the reference's own error in that precision.
"""
import logging
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")
from op_harness import make_inputs, run  # noqa: E402
from pe_fast.ops import pe_attention, projection, reference, triton_attention  # noqa: E402
from pe_fast.ops.backends import _warn_fallback, resolve_backend  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cuda = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs a CUDA GPU, compiled Triton")
interpreter = pytest.mark.skipif(not INTERPRETED, reason="runs in the TRITON_INTERPRET=1 child process")


@pytest.mark.skipif(INTERPRETED, reason="this is the child process")
def test_cpu_interpreter_suite_in_a_child_process():
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "test_interpreter_", __file__],
        env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stdout[-6000:] + child.stderr[-3000:]
    assert " passed" in child.stdout and "skipped" not in child.stdout, child.stdout[-3000:]


def max_error(got, expected):
    return (got.double() - expected.double()).abs().max().item()


def assert_relative(got: dict, expected: dict, tol: float):
    """max |got − expected| ≤ tol · max |expected|, per output."""
    for name, e in expected.items():
        scale = e.double().abs().max().item()
        error = max_error(got[name], e)
        assert error <= tol * scale, f"{name}: error {error:.3g}, scale {scale:.3g}"


def assert_flash_rule(got: dict, low: dict, oracle: dict, eps: float):
    """|kernel − oracle| ≤ 2·|same-precision reference − oracle| + half an ulp (eps) of the largest value."""
    for name, o in oracle.items():
        bound = 2 * max_error(low[name], o) + 0.5 * eps * o.double().abs().max().item()
        error = max_error(got[name], o)
        assert error <= bound, f"{name}: error {error:.3g} > {bound:.3g}"


CPU_CASES = {  # M, B, N, D, H, K, pe, b_qkv
    "packed-4-per-tile-dh16": (2, 2, 16, 48, 3, 2, True, True),
    "packed-last-tile-part-empty-no-pe-probes-bias": (1, 5, 16, 32, 1, 0, False, False),
    "packed-odd-N17-dh24": (2, 1, 17, 72, 3, 1, True, True),
    "long-N100-2x2-blocks-dh24": (1, 2, 100, 24, 1, 2, True, True),
    "long-N40-H3-dh16": (1, 1, 40, 48, 3, 1, True, True),
    "packed-H8-dh16": (1, 2, 16, 128, 8, 1, True, True),  # issue 3's largest head count
    "lst-N16-dh160": (1, 3, 16, 160, 1, 2, True, True),  # 2-problem tiles, head dim in 5 chunks of 32
    "N20-dh40-partial-chunk": (1, 1, 20, 160, 4, 1, True, True),  # one problem per fp32 tile, chunks 32 + 8
    "N32-dh48-full-tile": (1, 2, 32, 96, 2, 1, True, True),
}


@interpreter
@pytest.mark.parametrize("case", CPU_CASES.values(), ids=CPU_CASES.keys())
def test_interpreter_matches_reference_fp32(case):
    M, B, N, D, H, K, with_pe, with_bias = case
    inputs = make_inputs(M, B, N, D, K, with_pe=with_pe, with_bias=with_bias)
    assert_relative(run(inputs, H, torch.float32, "triton"), run(inputs, H, torch.float64, "reference"), 1e-5)
    # the saved tensors of the backend's forward too: x @ w (the kernels add pe @ w + b on load; with it, the
    # reference's qkv) and the natural-log lse
    args = [None if inputs[k] is None else inputs[k].float() for k in ("x", "pe", "w", "b")]
    _, _, xw, lse = triton_attention.forward(*args, H, inputs["probes"])
    qkv = projection.full_projection(xw, projection.token_addend(*args[1:], N))
    _, _, qkv_ref, lse_ref = reference.forward(*[None if a is None else a.double() for a in args], H, inputs["probes"])
    assert lse.dtype == torch.float32
    assert_relative({"qkv": qkv, "lse": lse}, {"qkv": qkv_ref, "lse": lse_ref}, 1e-5)


@interpreter
@pytest.mark.parametrize("N", [16, 40])  # packed, long
def test_interpreter_tf32_statistics_within_1e4(N, monkeypatch):
    """PE_FAST_TF32=1: the kernels round every tl.dot operand to TF32 (the interpreter's dot then multiplies
    exactly those values). Rounded, the statistics stay within 1e-4 relative (≈1e-5 measured); truncated,
    as the tensor cores do to unrounded fp32 registers, the logits shrink by ~1e-3 on average and the averaged
    entropy / max-prob / Σp² move by ~5e-4 relative (the H100 TF32 failures). Outputs and gradients carry
    TF32's own ~1e-3 error, as in any TF32 matmul."""
    inputs = make_inputs(1, 4, N, 160, 3)
    oracle = run(inputs, 1, torch.float64, "reference")
    monkeypatch.setenv("PE_FAST_TF32", "1")
    got = run(inputs, 1, torch.float32, "triton")
    assert_relative({"stats": got["stats"]}, {"stats": oracle["stats"]}, 1e-4)
    assert_relative(got, oracle, 4e-3)


@interpreter
@pytest.mark.parametrize("N", [16, 40])  # packed, long
def test_interpreter_probes_read_in_their_own_dtype_give_the_float32_statistics(N):
    """The kernel reads bool, uint8, bf16 and fp16 probes as they come (less L2 traffic per score): the same
    statistics, bit for bit, as the same values in float32; float64 ones are read as float32."""
    inputs = make_inputs(1, 2, N, 32, 3)
    args = [inputs[k].float() for k in ("x", "pe", "w", "b")]
    g = torch.Generator().manual_seed(3)
    binary = torch.rand(2, N, N, generator=g) > 0.5
    weighted = torch.randn(2, N, N, generator=g).to(torch.bfloat16)  # values fp16 holds exactly too
    for probes in (binary, binary.to(torch.uint8), weighted, weighted.to(torch.float16), weighted.double()):
        _, stats, _, _ = triton_attention.forward(*args, 2, probes)
        _, expected, _, _ = triton_attention.forward(*args, 2, probes.float())
        assert torch.equal(stats, expected), probes.dtype


@interpreter
def test_interpreter_batched_backward_matches_loop():
    """autograd.grad(is_grads_batched=True) vmaps the backward: the triton backward op's vmap rule."""
    inputs = make_inputs(1, 2, 8, 16, 1)
    leaves = [inputs[k].float().requires_grad_() for k in ("x", "pe", "w", "b")]
    out, _ = pe_attention(*leaves, 1, inputs["probes"].float(), backend="triton")
    grads = torch.stack([inputs["grad"].float(), -2 * inputs["grad"].float()])
    got = torch.autograd.grad(out, leaves, grads, is_grads_batched=True, retain_graph=True)
    for v in range(2):
        expected = torch.autograd.grad(out, leaves, grads[v], retain_graph=True)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g[v], e, rtol=1e-5, atol=1e-5)


@interpreter
@pytest.mark.parametrize("N", [17, 40])  # packed, long
def test_interpreter_rope_matches_reference_fp32(N):
    inputs = make_inputs(1, 2, N, 48, 1)
    angles = torch.rand(N, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 6
    rope = {dtype: (angles.cos().to(dtype), angles.sin().to(dtype)) for dtype in (torch.float32, torch.float64)}
    got = run(inputs, 3, torch.float32, "triton", rope[torch.float32])
    assert_relative(got, run(inputs, 3, torch.float64, "reference", rope[torch.float64]), 1e-5)


@interpreter
def test_interpreter_opcheck():
    inputs = make_inputs(1, 2, 17, 16, 2)
    x, pe, w, b = (inputs[k].float().requires_grad_() for k in ("x", "pe", "w", "b"))
    torch.library.opcheck(torch.ops.pe_fast.pe_attention.default,
                          (x, pe, w, b, 2, inputs["probes"].float(), None, None, None, "triton"))
    out, _, xw, lse = triton_attention.forward(x.detach(), pe.detach(), w.detach(), b.detach(), 2)
    addend = projection.token_addend(pe.detach(), w.detach(), b.detach(), 17)
    for part in (None, addend):
        torch.library.opcheck(torch.ops.pe_fast.triton_attention_backward.default,
                              (xw, part, inputs["grad"].float(), out, lse, 2))


@interpreter
def test_interpreter_bias_falls_back_to_reference_with_one_warning(caplog):
    inputs = make_inputs(1, 2, 6, 8, 1)
    x, pe, w, b = (inputs[k].float() for k in ("x", "pe", "w", "b"))
    bias = torch.randn(1, 2, 6, 6)
    _warn_fallback.cache_clear()
    with caplog.at_level(logging.WARNING, logger="pe_fast"):
        for _ in range(2):
            got = pe_attention(x, pe, w, b, 2, bias=bias, backend="triton")
    torch.testing.assert_close(got, pe_attention(x, pe, w, b, 2, bias=bias, backend="reference"))
    assert [r.getMessage() for r in caplog.records] == ["pe_attention backend 'triton' runs the reference instead: "
                                                        "a relative-position bias is not fused into the Triton kernels"]


@pytest.mark.skipif(INTERPRETED, reason="compiled Triton only")
def test_cpu_tensors_are_not_offered_to_compiled_triton():
    with pytest.raises(ValueError, match="does not run on cpu"):
        resolve_backend("triton", torch.device("cpu"))


@interpreter
def test_interpreter_runs_triton_on_cpu_by_default():
    assert resolve_backend(None, torch.device("cpu")) == "triton"


@cuda
def test_triton_is_the_default_backend_on_cuda():
    assert resolve_backend(None, torch.device("cuda")) == "triton"


CUDA_CASES = {  # M, B, N, D, H, K, pe, b_qkv (lst, N100-dh16, fmri: the benchmark's kernels, compiled once)
    "lst-N16-dh160": (3, 8, 16, 160, 1, 3, True, True),
    "N16-dh16-H4": (4, 16, 16, 64, 4, 2, True, True),
    "N17-dh24-H3": (2, 9, 17, 72, 3, 1, False, True),
    "N32-dh128-H2": (2, 4, 32, 256, 2, 0, True, False),
    "N100-dh16-H4": (2, 6, 100, 64, 4, 2, True, True),
    "N100-dh40-H8": (1, 4, 100, 320, 8, 1, True, True),
    "fmri-N360-dh16-H4": (2, 4, 360, 64, 4, 3, True, True),
    "N360-dh128-H1": (1, 2, 360, 128, 1, 1, True, True),
}


@cuda
@pytest.mark.parametrize("case", CUDA_CASES.values(), ids=CUDA_CASES.keys())
def test_cuda_matches_reference_fp32(case):
    M, B, N, D, H, K, with_pe, with_bias = case
    inputs = make_inputs(M, B, N, D, K, with_pe=with_pe, with_bias=with_bias, device="cuda")
    assert_relative(run(inputs, H, torch.float32, "triton"), run(inputs, H, torch.float64, "reference"), 1e-5)


@cuda
@pytest.mark.parametrize("case", ["N16-dh16-H4", "N100-dh16-H4"])
def test_cuda_rope_matches_reference_fp32(case):
    M, B, N, D, H, K, with_pe, with_bias = CUDA_CASES[case]
    inputs = make_inputs(M, B, N, D, K, with_pe=with_pe, with_bias=with_bias, device="cuda")
    angles = torch.rand(N, D // H // 2, dtype=torch.float64, device="cuda") * 6
    rope = {dtype: (angles.cos().to(dtype), angles.sin().to(dtype)) for dtype in (torch.float32, torch.float64)}
    got = run(inputs, H, torch.float32, "triton", rope[torch.float32])
    assert_relative(got, run(inputs, H, torch.float64, "reference", rope[torch.float64]), 1e-5)


@cuda
@pytest.mark.parametrize("case", ["lst-N16-dh160", "N17-dh24-H3", "N100-dh16-H4", "fmri-N360-dh16-H4",
                                  "N360-dh128-H1"])
def test_cuda_bf16_within_twice_the_reference_error(case):
    M, B, N, D, H, K, with_pe, with_bias = CUDA_CASES[case]
    inputs = make_inputs(M, B, N, D, K, with_pe=with_pe, with_bias=with_bias, device="cuda")
    oracle = run(inputs, H, torch.float64, "reference")
    assert_flash_rule(run(inputs, H, torch.bfloat16, "triton"), run(inputs, H, torch.bfloat16, "reference"), oracle,
                      eps=torch.finfo(torch.bfloat16).eps)


@cuda
@pytest.mark.parametrize("case", ["lst-N16-dh160", "N32-dh128-H2", "fmri-N360-dh16-H4"])
def test_cuda_autocast_bf16_within_twice_the_reference_error(case):
    """Under autocast (the sweep's --precision bf16) the op takes float32 parameters: x @ W in bf16, the PE's
    float32 addend added as the packed kernels load q, k, v (projection.py), by torch before the long ones."""
    M, B, N, D, H, K, with_pe, with_bias = CUDA_CASES[case]
    inputs = make_inputs(M, B, N, D, K, with_pe=with_pe, with_bias=with_bias, device="cuda")
    oracle = run(inputs, H, torch.float64, "reference")
    got = run(inputs, H, torch.float32, "triton", autocast=torch.bfloat16)
    assert got["out"].dtype == torch.bfloat16 and got["dpe"].dtype == torch.float32
    assert_flash_rule(got, run(inputs, H, torch.float32, "reference", autocast=torch.bfloat16), oracle,
                      eps=torch.finfo(torch.bfloat16).eps)


@cuda
@pytest.mark.parametrize("case", ["lst-N16-dh160", "N100-dh16-H4", "fmri-N360-dh16-H4"])
def test_cuda_tf32_within_twice_the_reference_error(case, monkeypatch):
    """Flash rule against the reference's own TF32 run, and 1e-4 relative for the statistics
    (means over many rows: TF32's rounding errors average out, a bias would not; the kernels round their
    operands to TF32 like cuBLAS instead of letting the tensor cores truncate them). Elementwise outputs and
    gradients carry TF32's ~1e-3 error, the reference's too, so 1e-4 is not attainable for them."""
    M, B, N, D, H, K, with_pe, with_bias = CUDA_CASES[case]
    inputs = make_inputs(M, B, N, D, K, with_pe=with_pe, with_bias=with_bias, device="cuda")
    oracle = run(inputs, H, torch.float64, "reference")
    monkeypatch.setenv("PE_FAST_TF32", "1")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)  # the reference's matmuls in TF32 too
    got = run(inputs, H, torch.float32, "triton")
    assert_flash_rule(got, run(inputs, H, torch.float32, "reference"), oracle, eps=2.0 ** -10)  # 10 mantissa bits
    assert_relative({"stats": got["stats"]}, {"stats": oracle["stats"]}, 1e-4)
