"""pe_attention under torch's transforms: torch.func.vmap (the op's vmap rule folds the vmapped dim into the
model axis, or loops when a tensor shared by all models is vmapped), gradients through vmap, a vmapped
backward (autograd.grad with is_grads_batched), torch.library.opcheck, and torch.compile(fullgraph=True)
forward and backward; and plain eager calls, which bypass the custom-op dispatcher with the same numbers.

The oracle is a Python loop over the vmapped dim calling the op on each slice. CPU: the reference backend.
CUDA (skipped without a GPU): the same tests on the triton backend, whose backward is an op with its own rule.
"""
import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.func import vmap

from pe_fast.ops import pe_attention
from pe_fast.ops.transforms import is_traced

pe_attention_module = importlib.import_module("pe_fast.ops.pe_attention")  # the package's name is the function

CUDA = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
TARGETS = [pytest.param(("cpu", "reference", torch.float64), id="cpu-reference")]
if CUDA:
    TARGETS.append(pytest.param(("cuda", "triton", torch.float32), id="cuda-triton"))
V, M, B, N, D, H, K = 3, 2, 2, 16, 32, 2, 2  # V: the vmapped dim


def make(target, seed=0):
    device, _, dtype = target
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(device, dtype)  # noqa: E731
    return dict(x=r(V, M, B, N, D), pe=r(V, M, N, D), w=r(V, M, D, 3 * D) / math.sqrt(D), b=r(V, M, 3 * D),
                probes=(torch.rand(V, K, N, N, generator=g) > 0.5).to(device, dtype), grad=r(V, M, B, N, D))


def tolerance(target):
    return dict(rtol=1e-9, atol=1e-9) if target[2] == torch.float64 else dict(rtol=1e-5, atol=1e-5)


def op(target):
    backend = target[1]
    return lambda x, pe, w, b, probes: pe_attention(x, pe, w, b, H, probes, backend=backend)


# which of (x, pe, w, b, probes) carry the vmapped dim; the others are the slice 0 shared by every index
IN_DIMS = {
    "per-model-tensors": (0, 0, 0, 0, None),
    "x-only-shared-weights": (0, None, None, None, None),
    "weights-only": (None, 0, 0, 0, None),
    "probes-too-loop-fallback": (0, 0, 0, 0, 0),
}


def arguments(t, in_dims):
    return [t[k] if d is not None else t[k][0] for k, d in zip(("x", "pe", "w", "b", "probes"), in_dims)]


def loop(fn, args, in_dims):
    results = [fn(*(a if d is None else a[v] for a, d in zip(args, in_dims))) for v in range(V)]
    return tuple(torch.stack(r) for r in zip(*results))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("in_dims", IN_DIMS.values(), ids=IN_DIMS.keys())
def test_vmap_matches_a_loop(target, in_dims):
    t = make(target)
    args = arguments(t, in_dims)
    got = vmap(op(target), in_dims=in_dims)(*args)
    expected = loop(op(target), args, in_dims)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, **tolerance(target))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("in_dims", [IN_DIMS["per-model-tensors"], IN_DIMS["x-only-shared-weights"]],
                         ids=["per-model-tensors", "x-only-shared-weights"])
def test_gradients_through_vmap_match_a_loop(target, in_dims):
    t = make(target)

    def grads(run):
        leaves = [a.detach().clone().requires_grad_() for a in arguments(t, in_dims)[:4]]
        out, _ = run(*leaves, t["probes"][0])
        out.backward(t["grad"])
        return [leaf.grad for leaf in leaves]

    got = grads(lambda *a: vmap(op(target), in_dims=in_dims)(*a))
    expected = grads(lambda *a: loop(op(target), a, in_dims))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, **tolerance(target))


@pytest.mark.parametrize("target", TARGETS)
def test_batched_backward_matches_a_loop(target):
    """autograd.grad(is_grads_batched=True) vmaps the op's backward over V upstream gradients (on triton, the
    backward op's own vmap rule). (torch.func.grad itself does not apply: torch's custom_op autograd is an
    autograd.Function without setup_context, which functorch rejects.)"""
    t = make(target)
    leaves = [t[k][0].detach().clone().requires_grad_() for k in ("x", "pe", "w", "b")]
    out, _ = op(target)(*leaves, t["probes"][0])
    got = torch.autograd.grad(out, leaves, t["grad"], is_grads_batched=True, retain_graph=True)
    expected = [torch.autograd.grad(out, leaves, t["grad"][v], retain_graph=True) for v in range(V)]
    for i, g in enumerate(got):
        torch.testing.assert_close(g, torch.stack([e[i] for e in expected]), **tolerance(target))


def test_opcheck_reference():
    t = make(TARGETS[0].values[0])
    x, pe, w, b = (t[k][0].requires_grad_() for k in ("x", "pe", "w", "b"))
    torch.library.opcheck(torch.ops.pe_fast.pe_attention.default,
                          (x, pe, w, b, H, t["probes"][0], None, None, None, "reference"))


@pytest.mark.parametrize("target", TARGETS)
# inductor's on-disk caches key on the traced graph, not on the op's fake implementation: a stale entry could
# hide a fake/real mismatch (one was found this way: the lse dtype of float64 inputs). The config's own patch
# restores it; monkeypatch's undo leaves this aliased setting unreadable for every later compile.
@torch._inductor.config.patch(force_disable_caches=True)
def test_compile_fullgraph_forward_and_backward(target):
    torch._dynamo.reset()
    t = make(target)
    args = [t[k][0] for k in ("x", "pe", "w", "b")]

    def step(x, pe, w, b, probes, g):
        out, stats = op(target)(x, pe, w, b, probes)
        return (out * g).sum(), stats

    def run(fn):
        leaves = [a.detach().clone().requires_grad_() for a in args]
        loss, stats = fn(*leaves, t["probes"][0], t["grad"][0])
        loss.backward()
        return [loss.detach(), stats] + [leaf.grad for leaf in leaves]

    compiled = run(torch.compile(step, fullgraph=True, dynamic=False))
    for c, e in zip(compiled, run(step)):
        torch.testing.assert_close(c, e, **tolerance(target))


def test_eager_calls_run_the_backend_directly_with_the_ops_numbers(monkeypatch):
    """Plain eager calls skip the custom-op dispatcher (host time) for an autograd.Function over the same
    functions: outputs and gradients equal the op's exactly."""
    t = make(TARGETS[0].values[0])
    args = [t[k][0] for k in ("x", "pe", "w", "b")]

    def run(call):
        leaves = [a.detach().clone().requires_grad_() for a in args]
        out, stats = call(*leaves)
        out.backward(t["grad"][0])
        return [out.detach(), stats] + [leaf.grad for leaf in leaves]

    through_op = run(lambda x, pe, w, b: torch.ops.pe_fast.pe_attention(
        x, pe, w, b, H, t["probes"][0], None, None, None, "reference")[:2])
    monkeypatch.setattr(pe_attention_module, "_pe_attention", None)  # an eager call must not reach it
    direct = run(lambda x, pe, w, b: pe_attention(x, pe, w, b, H, t["probes"][0], backend="reference"))
    for d, o in zip(direct, through_op):
        torch.testing.assert_close(d, o, rtol=0, atol=0)


def test_only_plain_eager_calls_count_as_untraced():
    x = torch.randn(2, 3)
    assert not is_traced(x, torch.nn.Parameter(x), None)
    with torch.device("cpu"):  # a torch-function mode
        assert is_traced(x)
    with FakeTensorMode():
        assert is_traced(torch.empty(2))
    seen = []
    vmap(lambda row: seen.append(is_traced(row)) or row)(x)
    batched_backward_seen = []

    class Probe(torch.autograd.Function):
        forward = staticmethod(lambda ctx, a: a * 2)

        @staticmethod
        def backward(ctx, grad):
            batched_backward_seen.append(is_traced(grad))
            return grad

    leaf = x.clone().requires_grad_()
    torch.autograd.grad(Probe.apply(leaf), leaf, torch.ones(4, 2, 3), is_grads_batched=True)
    assert seen == [True] and batched_backward_seen == [True]


def test_compiled_graphs_hold_the_custom_op():
    torch._dynamo.reset()
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm

    t = make(TARGETS[0].values[0])
    torch.compile(op(TARGETS[0].values[0]), backend=capture, fullgraph=True)(
        *(t[k][0] for k in ("x", "pe", "w", "b", "probes")))
    assert graphs and "pe_fast.pe_attention" in graphs[0]


def test_overhead_benchmark_times_the_op_path_it_names(tmp_path, monkeypatch):
    """bench/op/bench_op_overhead.py: its "op" rounds really go through the custom op, and it runs end to end."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.syspath_prepend(os.path.join(root, "bench"))  # so that undo() also drops the entry the script adds
    spec = importlib.util.spec_from_file_location("bench_op_overhead", os.path.join(root, "bench", "op",
                                                                                   "bench_op_overhead.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    t = make(TARGETS[0].values[0])
    args = [t[k][0] for k in ("x", "pe", "w", "b")]
    monkeypatch.setattr(pe_attention_module._EagerPEAttention, "apply", None)  # the direct path now fails
    with bench.through_the_op():
        pe_attention(*args, H, backend="reference")
    with pytest.raises(TypeError):
        pe_attention(*args, H, backend="reference")
    monkeypatch.undo()

    out = tmp_path / "overhead.json"
    run = subprocess.run([sys.executable, "bench/op/bench_op_overhead.py", "--device", "cpu", "--repeats", "1",
                          "--calls", "2", "--out", str(out)], cwd=root, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    rows = json.loads(out.read_text())["results"]
    assert [r["mode"] for r in rows] == ["forward", "forward+backward"] and all(r["op_us"] > 0 for r in rows)
    if not torch.cuda.is_available():
        no_gpu = subprocess.run([sys.executable, "bench/op/bench_op_overhead.py", "--device", "cuda"], cwd=root,
                                capture_output=True, text=True)
        assert no_gpu.returncode == 2 and len(no_gpu.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("backend", ["reference", "cpp"])
def test_torch_func_grad_vmap_of_grad_and_jacrev_equal_autograd(backend):
    """torch.func's gradient transforms, which a custom op's autograd does not support, run the op's
    autograd.Function: grad equals torch.autograd's gradient, vmap(grad) a loop of grad, and jacrev the
    reference backend's Jacobian built row by row with torch.autograd.grad (float64)."""
    if backend == "cpp" and importlib.util.find_spec("pe_fast._C") is None:
        pytest.skip("the C++ extension is not built")
    t = make(("cpu", "reference", torch.float64))
    x, w, b = t["x"][0], t["w"][0], t["b"][0]
    loss = lambda pe: pe_attention(x, pe, w, b, H, backend=backend)[0].square().sum()  # noqa: E731
    pe = t["pe"][0].clone().requires_grad_()
    expected, = torch.autograd.grad(loss(pe), pe)
    torch.testing.assert_close(torch.func.grad(loss)(t["pe"][0]), expected, rtol=1e-9, atol=1e-9)
    by_loop = torch.stack([torch.func.grad(loss)(p) for p in t["pe"]])
    torch.testing.assert_close(vmap(torch.func.grad(loss))(t["pe"]), by_loop, rtol=1e-9, atol=1e-9)
    row = lambda pe: pe_attention(x, pe, w, b, H, backend=backend)[0][0, 0, 0]  # noqa: E731
    out = pe_attention(x, pe, w, b, H, backend="reference")[0][0, 0, 0]
    rows = torch.stack([torch.autograd.grad(out[i], pe, retain_graph=True)[0] for i in range(D)])
    torch.testing.assert_close(torch.func.jacrev(row)(t["pe"][0]), rows, rtol=1e-9, atol=1e-9)


def test_num_heads_as_a_numpy_integer_is_the_int():
    import numpy as np
    t = make(("cpu", "reference", torch.float64))
    args = (t["x"][0], t["pe"][0], t["w"][0], t["b"][0])
    torch.testing.assert_close(pe_attention(*args, np.int64(H)), pe_attention(*args, H), rtol=0, atol=0)
