"""The "cpp" pe_attention backend (C++ kernels, CPU) against the reference (float64 oracle).

Skipped when the extension pe_fast._C is not built (pip install without a compiler); the kernels on their own
are tested by tests/test_cpp_kernels_ctest.py.
"""
import logging
import os
import subprocess
import sys

import pytest
import torch

from op_harness import make_inputs, run
from pe_fast.ops import BACKENDS, pe_attention, reference
from pe_fast.ops.backends import _warn_fallback, resolve_backend

pytestmark = pytest.mark.skipif("cpp" not in BACKENDS, reason="pe_fast._C (the C++ CPU kernels) is not built")


def assert_relative(got: dict, expected: dict, tol: float, peer: dict | None = None):
    """max |got − expected| ≤ tol · max |expected|, per output (each statistic column on its own), or, given the
    same outputs of a peer in the same dtype (the float32 reference), ≤ twice the peer's own error."""
    for name, e in expected.items():
        g, e = got[name].double(), e.double()
        p = None if peer is None else peer[name].double()
        if name == "stats":
            g, e = g.flatten(0, 1).T, e.flatten(0, 1).T  # one row per statistic
            p = None if p is None else p.flatten(0, 1).T
        for i, (g_row, e_row) in enumerate(zip(g.reshape(len(g), -1), e.reshape(len(e), -1))):
            error, scale = (g_row - e_row).abs().max().item(), e_row.abs().max().item()
            peer_error = 0.0 if p is None else (p.reshape(len(p), -1)[i] - e_row).abs().max().item()
            assert error <= max(tol * scale, 2 * peer_error), (
                f"{name}[{i}]: error {error:.3g}, scale {scale:.3g}, the peer's error {peer_error:.3g}")


CASES = {  # M, B, N, D, H, K, pe, b_qkv, logit scale
    "N17-dh24-H2": (2, 3, 17, 48, 2, 2, True, True, 1.0),
    "N100-dh40-H1-no-bias": (1, 2, 100, 40, 1, 1, True, False, 1.0),
    "N360-dh16-H4-no-pe": (1, 1, 360, 64, 4, 2, False, True, 1.0),
    "N16-dh8-H8-no-probes": (2, 2, 16, 64, 8, 0, True, True, 1.0),
    "N16-dh16-H3": (3, 2, 16, 48, 3, 3, True, True, 1.0),
    "N130-two-key-tiles-peaked-rows": (1, 2, 130, 24, 1, 1, True, True, 4.0),
    "N1": (1, 2, 1, 8, 2, 1, True, True, 1.0),
    "N33-no-pe-no-bias": (2, 2, 33, 32, 2, 1, False, False, 1.0),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_matches_reference(case):
    M, B, N, D, H, K, with_pe, with_bias, logit_scale = case
    inputs = make_inputs(M, B, N, D, K, with_pe=with_pe, with_bias=with_bias, logit_scale=logit_scale)
    oracle = run(inputs, H, torch.float64, "reference")
    assert_relative(run(inputs, H, torch.float64, "cpp"), oracle, 1e-10)
    # float32: within 1e-5 of the largest value, or as close as PyTorch's own float32 attention gets (its error
    # reaches 1.9e-5 on the peaked rows of N130)
    assert_relative(run(inputs, H, torch.float32, "cpp"), oracle, 1e-5, peer=run(inputs, H, torch.float32, "reference"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_saved_projection_and_lse_match_reference(dtype):
    """The backend saves x @ w (its kernels add pe @ w + b on load): with the addend, it is the reference's qkv."""
    from pe_fast.ops import cpp_attention, projection
    inputs = make_inputs(2, 2, 37, 48, 1)
    args = [None if inputs[k] is None else inputs[k].to(dtype) for k in ("x", "pe", "w", "b")]
    _, _, xw, lse = cpp_attention.forward(*args, 3, inputs["probes"].to(dtype))
    _, _, qkv_ref, lse_ref = reference.forward(*[a.double() for a in args], 3, inputs["probes"])
    qkv = projection.full_projection(xw, projection.token_addend(*args[1:], 37))
    assert lse.dtype == reference.accumulation_dtype(qkv)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert_relative({"qkv": qkv, "lse": lse}, {"qkv": qkv_ref, "lse": lse_ref}, tol)


def test_rope_matches_reference():
    N = 40
    inputs = make_inputs(1, 2, N, 48, 1)
    angles = torch.rand(N, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 6
    oracle = run(inputs, 3, torch.float64, "reference", (angles.cos(), angles.sin()))
    assert_relative(run(inputs, 3, torch.float64, "cpp", (angles.cos(), angles.sin())), oracle, 1e-10)
    rope32 = (angles.cos().float(), angles.sin().float())
    assert_relative(run(inputs, 3, torch.float32, "cpp", rope32), oracle, 1e-5)


def test_gradcheck_float64():
    inputs = make_inputs(2, 2, 5, 8, 2)
    tensors = [inputs[k].clone().requires_grad_() for k in ("x", "pe", "w", "b")]

    def f(x, pe, w, b):
        return pe_attention(x, pe, w, b, 2, inputs["probes"], backend="cpp")[0]
    assert torch.autograd.gradcheck(f, tensors)


def test_opcheck():
    inputs = make_inputs(1, 2, 17, 16, 2)
    x, pe, w, b = (inputs[k].float().requires_grad_() for k in ("x", "pe", "w", "b"))
    probes = inputs["probes"].float()
    torch.library.opcheck(torch.ops.pe_fast.pe_attention.default, (x, pe, w, b, 2, probes, None, None, None, "cpp"))
    qkv, addend = torch.randn(1, 2, 17, 48), torch.randn(1, 17, 48)
    for part in (None, addend):
        out, _, lse = torch.ops.pe_fast_cpp.attention_forward(qkv, part, 2, probes)
        torch.library.opcheck(torch.ops.pe_fast_cpp.attention_forward.default, (qkv, part, 2, probes))
        torch.library.opcheck(torch.ops.pe_fast_cpp.attention_backward.default,
                              (qkv, part, torch.randn_like(out), out, lse, 2))


def test_vmap_and_batched_backward_match_a_loop():
    V = 3
    inputs = make_inputs(V * 2, 2, 17, 32, 1)
    x, pe, w, b = (inputs[k].unflatten(0, (V, 2)) for k in ("x", "pe", "w", "b"))
    op = lambda x, pe, w, b: pe_attention(x, pe, w, b, 2, inputs["probes"], backend="cpp")
    got = torch.func.vmap(op)(x, pe, w, b)
    for v in range(V):
        for g, e in zip(got, op(x[v], pe[v], w[v], b[v])):
            torch.testing.assert_close(g[v], e, rtol=1e-12, atol=1e-12)
    # autograd.grad(is_grads_batched=True) vmaps the backward, pe_fast_cpp::attention_backward included
    leaves = [t[0].clone().requires_grad_() for t in (x, pe, w, b)]
    out, _ = op(*leaves)
    grads = inputs["grad"].unflatten(0, (V, 2))
    got = torch.autograd.grad(out, leaves, grads, is_grads_batched=True, retain_graph=True)
    expected = [torch.autograd.grad(out, leaves, grads[v], retain_graph=True) for v in range(V)]
    for i, g in enumerate(got):
        torch.testing.assert_close(g, torch.stack([e[i] for e in expected]), rtol=1e-12, atol=1e-12)


def test_same_result_with_one_and_two_threads():
    inputs = make_inputs(2, 3, 33, 32, 2)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run(inputs, 2, torch.float32, "cpp")
        torch.set_num_threads(2)
        two = run(inputs, 2, torch.float32, "cpp")
    finally:
        torch.set_num_threads(threads)
    for name in one:
        assert torch.equal(one[name], two[name]), name


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter puts triton first on CPU")
def test_cpp_is_the_cpu_default_and_can_be_overridden(monkeypatch):
    """backend= alone chooses: no environment variable is read (the compute path is chosen once, by its caller)."""
    monkeypatch.setenv("PE_FAST_BACKEND", "reference")
    assert resolve_backend(None, torch.device("cpu")) == "cpp"
    assert resolve_backend("reference", torch.device("cpu")) == "reference"
    assert resolve_backend("cpp", torch.device("cpu")) == "cpp"


def test_bias_and_other_dtypes_run_the_reference_with_one_warning(caplog):
    _warn_fallback.cache_clear()  # earlier tests may have warned already
    inputs = make_inputs(1, 2, 9, 16, 0)
    x, pe, w, b = (inputs[k] for k in ("x", "pe", "w", "b"))
    bias = torch.randn(1, 2, 9, 9, dtype=torch.float64)
    with caplog.at_level(logging.WARNING, logger="pe_fast"):
        for _ in range(2):
            got = pe_attention(x, pe, w, b, 2, bias=bias, backend="cpp")
            half = pe_attention(x.bfloat16(), pe.bfloat16(), w.bfloat16(), b.bfloat16(), 2, backend="cpp")
    torch.testing.assert_close(got, pe_attention(x, pe, w, b, 2, bias=bias, backend="reference"))
    torch.testing.assert_close(half, pe_attention(x.bfloat16(), pe.bfloat16(), w.bfloat16(), b.bfloat16(), 2,
                                                  backend="reference"))
    assert [r.getMessage() for r in caplog.records] == [
        "pe_attention backend 'cpp' runs the reference instead: relative-position bias",
        ("pe_attention backend 'cpp' runs the reference instead: dtype torch.bfloat16 (the C++ kernels take "
         "float32 and float64)")]


def test_without_the_extension_pe_fast_warns_once_and_runs_the_reference():
    """The warning comes with the first CPU call that would have run the kernels, not with the import (a program
    that refuses first says one line); backend='cpp' asked for by name says why it is missing."""
    script = ("import sys; sys.modules['pe_fast._C'] = None\n"  # makes `import pe_fast._C` fail
              "import torch\n"
              "from pe_fast.ops import BACKENDS, pe_attention\n"
              "print('imported', file=sys.stderr, flush=True)\n"
              "x = torch.randn(1, 2, 5, 8)\n"
              "for _ in range(2):\n"
              "    out, stats = pe_attention(x, None, torch.randn(1, 8, 24), None, 2)\n"
              "try:\n"
              "    pe_attention(x, None, torch.randn(1, 8, 24), None, 2, backend='cpp')\n"
              "except ValueError as error:\n"
              "    print('asked:', error)\n"
              "print(sorted(BACKENDS))\n")
    child = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120,
                           env={**{k: v for k, v in os.environ.items() if k != "PE_FAST_KERNELS"},  # isa.sh's build
                                "TRITON_INTERPRET": "0"})
    assert child.returncode == 0, child.stderr
    assert "'cpp'" not in child.stdout.splitlines()[-1]
    assert "asked: pe_attention backend 'cpp' is not available: pe_fast's C++ CPU kernels are not built" in child.stdout
    stderr = child.stderr.splitlines()
    warnings = [line for line in stderr if "C++ CPU kernels are not built" in line]
    assert len(warnings) == 1 and "pip install" in warnings[0], child.stderr
    assert stderr.index(warnings[0]) > stderr.index("imported"), child.stderr


def test_the_extension_imports_on_its_own():
    """import pe_fast._C first thing in a process: pe_fast imports torch, whose libraries the extension needs."""
    proc = subprocess.run([sys.executable, "-c", "import pe_fast._C"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_kernels_load_once_from_pe_fast_kernels_and_a_bad_path_is_named(tmp_path):
    """PE_FAST_KERNELS (bench/cpu/isa.sh) loads that build in place of the installed one, its ISA read from the build
    itself; a path that is no build leaves the reference running, with one warning naming the path, and a Python
    file named there (whatever its suffix) is never run."""
    from pe_fast.ops import extension
    probe = ("import torch, pe_fast.ops, pe_fast._C; from pe_fast.ops import extension, backends; "
             "print(extension.ISA, 'cpp' in backends.BACKENDS, extension.MODULE is pe_fast._C); "
             "pe_fast.ops.pe_attention(torch.randn(1, 2, 5, 8), None, torch.randn(1, 8, 24), None, 2)")
    env = {k: v for k, v in os.environ.items() if k != "PE_FAST_KERNELS"}

    def run(path):
        return subprocess.run([sys.executable, "-c", probe], env={**env, "PE_FAST_KERNELS": path},
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)
    installed = run(extension.MODULE.__file__)
    assert installed.returncode == 0, installed.stderr
    assert installed.stdout.split() == [extension.ISA, "True", "True"]
    missing = run(str(tmp_path / "no_such_C.so"))
    assert missing.returncode == 0, missing.stderr
    assert missing.stdout.split() == ["None", "False", "False"]
    assert "no_such_C.so" in missing.stderr and "not built" in missing.stderr
    assert "unset PE_FAST_KERNELS" in missing.stderr
    for name in ("evil.py", "evil.so"):
        (tmp_path / name).write_text("print('the named file ran')\n")
        source = run(str(tmp_path / name))
        assert source.returncode == 0, source.stderr
        assert source.stdout.split() == ["None", "False", "False"]
        assert "ran" not in source.stdout + source.stderr and name in source.stderr


@pytest.mark.parametrize("x_scale", [10.0, 100.0, 1e3, 1e4])
@pytest.mark.parametrize("N", [16, 100, 360])  # one key tile, and three
def test_backward_at_saturated_softmax_is_as_close_to_float64_as_the_reference(N, x_scale):
    """x scaled up saturates the softmax (almost one-hot rows), where its gradient cancels: P·(dP − Δ) with Δ a
    sum that must match P·dP to the last bit. Every float32 gradient of the kernels is as close to the float64
    one as the float32 reference is (or within float32 rounding of the largest value)."""
    inputs = make_inputs(1, 2, N, 32, 1, seed=3)
    inputs["x"] = inputs["x"] * x_scale
    exact = run(inputs, 2, torch.float64, "reference")
    reference32, kernels32 = run(inputs, 2, torch.float32, "reference"), run(inputs, 2, torch.float32, "cpp")
    for name in ("dx", "dpe", "dw", "db"):
        largest = exact[name].abs().max().item()
        reference_error = (reference32[name].double() - exact[name]).abs().max().item()
        error = (kernels32[name].double() - exact[name]).abs().max().item()
        assert error <= 4 * reference_error + 1e-5 * largest, (
            f"{name}: error {error:.3g} against the reference's {reference_error:.3g} (largest {largest:.3g})")


@pytest.mark.parametrize("backend", ["cpp", "reference"])
def test_logits_near_float32_s_range_keep_outputs_and_statistics(backend):
    """Finite float32 logits at the edge of its range: q·k formed before the 1/√dh scaling overflowed in the
    reference (NaN output, where the scaled logits fit), and a row whose finite logits differ by more than float's
    range gave a NaN entropy (0·log 0 as 0·(−inf)) in both. Against float64."""
    torch.manual_seed(1)
    x, w = torch.randn(1, 2, 6, 8) * 1e19, torch.randn(1, 8, 24) / 3
    exact_out, exact_stats = pe_attention(x.double(), None, w.double(), None, 2, backend="reference")
    out, stats = pe_attention(x, None, w, None, 2, backend=backend)
    assert (out.double() - exact_out).abs().max() <= 1e-6 * exact_out.abs().max()
    torch.testing.assert_close(stats.double(), exact_stats.double(), atol=1e-5, rtol=1e-5)
    x, w = torch.randn(1, 1, 3, 4), torch.randn(1, 4, 12) / 2
    bias = torch.zeros(1, 1, 3, 3)
    bias[..., 0], bias[..., 1] = 3e38, -3e38  # every row one-hot: entropy 0
    for probes in (None, torch.eye(3)[None]):
        stats = pe_attention(x, None, w, None, 1, probes, bias=bias, backend=backend)[1]
        exact = pe_attention(x.double(), None, w.double(), None, 1, probes, bias=bias.double(),
                             backend="reference")[1]
        torch.testing.assert_close(stats.double(), exact.double(), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("heads", [1, 2])
def test_backward_with_zero_rows_of_the_upstream_gradient_matches_reference(heads):
    """The kernels compute only the query rows whose upstream gradient is non-zero (a loss at some tokens, as the
    masked-token tasks' last block): every item keeps a different set of rows, one item none, one every row, and
    one head's half of a row alone may be zero. The gradients equal the float64 reference's."""
    M, B, N, D = 2, 4, 100, 32
    inputs = make_inputs(M, B, N, D, 1, seed=5)
    keep = torch.rand(M, B, N, generator=torch.Generator().manual_seed(6)) < 0.2
    keep[0, 1], keep[1, 2] = False, True
    grad = inputs["grad"] * keep[..., None]
    grad[1, 0, :, :D // 2] = 0.0  # the first head's rows of item 0 of model 1: all zero; the second head's not
    inputs["grad"] = grad
    oracle = run(inputs, heads, torch.float64, "reference")
    assert_relative(run(inputs, heads, torch.float64, "cpp"), oracle, 1e-10)
    assert_relative(run(inputs, heads, torch.float32, "cpp"), oracle, 1e-5,
                    peer=run(inputs, heads, torch.float32, "reference"))


def test_torch_func_second_derivatives_equal_the_references_and_first_ones_keep_the_kernels(monkeypatch):
    """Inside torch.func's transforms every backward runs with a graph, so create_graph cannot say whether the
    gradient is differentiated again: grad of grad, jacrev of jacrev and grad of vmap(grad) must take the
    differentiable backward (they were silently off by the whole second derivative: the kernels' gradient taken as
    a constant), and grad, vmap(grad) and jacrev alone the C++ kernels. Against plain torch ops (the reference's
    forward, which torch.func differentiates itself), float64."""
    op_module = sys.modules["pe_fast.ops.pe_attention"]
    calls = []
    differentiable = op_module._differentiable_backward
    monkeypatch.setattr(op_module, "_differentiable_backward", lambda *a: calls.append(1) or differentiable(*a))
    torch.manual_seed(0)
    x = torch.randn(1, 2, 6, 8, dtype=torch.float64)
    w = torch.randn(3, 8, 24, dtype=torch.float64) / 3
    ours = lambda x, w: pe_attention(x, None, w, None, 2, backend="cpp")[0].square().sum()  # noqa: E731
    plain = lambda x, w: reference.forward(x, None, w, None, 2)[0].square().sum()  # noqa: E731
    func = torch.func
    first_order = {
        "grad": lambda f: func.grad(lambda x: f(x, w[:1]))(x),
        "vmap(grad)": lambda f: func.vmap(func.grad(lambda w1: f(x, w1[None])))(w),
        "jacrev": lambda f: func.jacrev(lambda x: f(x, w[:1]))(x),
    }
    for name, derivative in first_order.items():
        torch.testing.assert_close(derivative(ours), derivative(plain), rtol=1e-10, atol=1e-10, msg=name)
    assert not calls, "a first derivative left the C++ kernels"
    second_order = {
        "grad(grad)": lambda f: func.grad(lambda x: func.grad(lambda x: f(x, w[:1]))(x).square().sum())(x),
        "jacrev(jacrev)": lambda f: func.jacrev(func.jacrev(lambda x: f(x, w[:1])))(x),
        "grad(vmap(grad))": lambda f: func.grad(
            lambda w: func.vmap(func.grad(lambda w1: f(x, w1[None])))(w).square().sum())(w),
    }
    for name, derivative in second_order.items():
        expected = derivative(plain)
        assert expected.abs().max() > 0
        torch.testing.assert_close(derivative(ours), expected, rtol=1e-9, atol=1e-9, msg=name)


def test_a_gradient_of_the_gradient_equals_the_references():
    """create_graph=True (a gradient penalty, a Hessian-vector product): the C++ backward is not differentiable,
    so the op differentiates the reference's there; the second-order gradients equal those of the reference's
    own autograd in float64 (they were silently missing: the first gradient was taken as a constant)."""
    torch.manual_seed(0)
    x = torch.randn(2, 2, 8, 16, dtype=torch.float64, requires_grad=True)
    pe = torch.randn(2, 8, 16, dtype=torch.float64, requires_grad=True)
    w = (torch.randn(2, 16, 48, dtype=torch.float64) / 4).requires_grad_()
    b = torch.randn(2, 48, dtype=torch.float64, requires_grad=True)
    second = {}
    for backend in ("reference", "cpp"):
        out, _ = pe_attention(x, pe, w, b, 2, backend=backend)
        grad_x, = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
        second[backend] = torch.autograd.grad(grad_x.pow(2).sum(), [x, pe, w, b])
    for ours, theirs in zip(second["cpp"], second["reference"]):
        assert theirs.abs().max() > 0
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
