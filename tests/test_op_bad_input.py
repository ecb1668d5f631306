"""pe_attention's own argument checks: every backend rejects the same bad calls, before it runs, with the same
exception naming the argument (a meta or mixed-device tensor, num_heads that is not an int ≥ 1, an empty
dimension, a dtype that is not floating, something that is not a tensor); valid calls still match the reference.

Every backend that runs on this machine's devices: reference and cpp on the CPU, triton on CUDA, and triton on the
CPU too under `TRITON_INTERPRET=1 python -m pytest tests/test_op_bad_input.py` (its interpreter decides at import).
"""
import math
import re

import numpy as np
import pytest
import torch

from pe_fast.nn import PEAttention
from pe_fast.ops import BACKENDS, pe_attention

M, B, N, D, H, K = 2, 2, 4, 8, 2, 2


def _device(backend: str) -> str | None:
    devices = BACKENDS[backend].devices
    return "cpu" if "cpu" in devices else "cuda" if "cuda" in devices and torch.cuda.is_available() else None


TARGETS = [pytest.param((name, _device(name)), id=f"{name}-{_device(name)}") for name in BACKENDS
           if _device(name) is not None]


def make(device, dtype=torch.float64, shape=(M, B, N, D), seed=0):
    """A valid call's arguments, as pe_attention's keyword names (rope has head dim D/H = 4)."""
    m, b, n, d = shape
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=torch.float64).to(device, dtype)

    angles = torch.rand(n, d // H // 2, generator=g, dtype=torch.float64).to(device, dtype)
    return {"x": r(m, b, n, d), "pe": r(m, n, d), "w_qkv": r(m, d, 3 * d) / max(d, 1) ** 0.5, "b_qkv": r(m, 3 * d),
            "num_heads": H, "probes": (torch.rand(K, n, n, generator=g) > 0.5).to(device),
            "rope": (angles.cos(), angles.sin()), "bias": None}


def call(args, backend):
    return pe_attention(args["x"], args["pe"], args["w_qkv"], args["b_qkv"], args["num_heads"], args["probes"],
                        rope=args["rope"], bias=args["bias"], backend=backend)


def with_rope_table(i, change):
    return lambda a: {**a, "rope": tuple(change(t) if j == i else t for j, t in enumerate(a["rope"]))}


def with_bias(change):
    return lambda a: {**a, "bias": change(torch.zeros(M, H, N, N, dtype=a["x"].dtype, device=a["x"].device))}


def changed(name, change):
    return lambda a: {**a, name: change(a[name])}


def meta(t):
    return t.to("meta")


def integer(t):
    return t.round().long()


def as_float32(a):
    return {**a, **{k: a[k].float() for k in ("x", "pe", "w_qkv", "b_qkv")}, "rope": tuple(t.float() for t in a["rope"])}


# (case, a change to a valid call's arguments, the exception, what its message must name)
CASES = [
    *[(f"meta {name}", changed(name, meta), ValueError, rf"{name} is on meta but x is on") for name in
      ("pe", "w_qkv", "b_qkv", "probes")],
    ("meta bias", with_bias(meta), ValueError, r"bias is on meta but x is on"),
    ("meta rope cos", with_rope_table(0, meta), ValueError, r"rope\[0\] is on meta but x is on"),
    ("meta x among real tensors", changed("x", meta), ValueError, r"pe is on \S+ but x is on meta"),
    ("num_heads True", changed("num_heads", lambda h: True), TypeError, r"num_heads .*True \(bool\)"),
    ("num_heads float", changed("num_heads", float), TypeError, r"num_heads .*2.0 \(float\)"),
    ("num_heads str", changed("num_heads", str), TypeError, r"num_heads"),
    ("num_heads zero", changed("num_heads", lambda h: 0), ValueError, r"num_heads=0"),
    ("num_heads negative", changed("num_heads", lambda h: -2), ValueError, r"num_heads=-2"),
    *[(f"int {name}", changed(name, integer), TypeError, rf"{name} .*torch.int64") for name in
      ("x", "pe", "w_qkv", "b_qkv")],
    ("int bias", with_bias(integer), TypeError, r"bias .*torch.int64"),
    ("int rope sin", with_rope_table(1, integer), TypeError, r"rope\[1\] .*torch.int64"),
    ("bool w_qkv", changed("w_qkv", lambda t: t > 0), TypeError, r"w_qkv .*torch.bool"),
    ("complex x", changed("x", lambda t: t.to(torch.complex128)), TypeError, r"x .*torch.complex128"),
    ("x a numpy array", changed("x", lambda t: t.cpu().numpy()), TypeError, r"x must be a torch.Tensor"),
    ("w_qkv None", changed("w_qkv", lambda t: None), TypeError, r"w_qkv must be a torch.Tensor"),
    ("pe a list", changed("pe", lambda t: t.tolist()), TypeError, r"pe must be a torch.Tensor"),
    ("rope one table", changed("rope", lambda r: r[0]), TypeError, r"rope must be a \(cos, sin\) pair"),
    # an AttributeError on None.shape, from every backend
    ("rope without its sin table", with_rope_table(1, lambda t: None), TypeError,
     r"rope\[1\] must be a torch.Tensor, got NoneType"),
    ("rope of no tables", changed("rope", lambda r: (None, None)), TypeError,
     r"rope\[0\] must be a torch.Tensor, got NoneType"),
    # its gradient was never computed: None, without a word
    ("rope table asking for a gradient", with_rope_table(0, lambda t: t.clone().requires_grad_()), ValueError,
     r"rope: its \(cos, sin\) tables take no gradient"),
    ("probes asking for a gradient", changed("probes", lambda p: p.double().requires_grad_()), ValueError,
     r"probes: the statistics take no gradient"),
    # a causal mask of -inf: the entropy of its rows NaN (0 · log 0), from every backend, without a word
    ("bias a mask of -inf", with_bias(lambda b: b.masked_fill(torch.ones_like(b, dtype=torch.bool).triu(1),
                                                              float("-inf"))), ValueError, r"bias holds NaN or ±inf"),
    # fixed tables: a NaN made every output (RoPE) or a probe's mass NaN, without a word
    ("probes with a NaN", changed("probes", lambda p: p.double().index_fill(0, torch.tensor([0]), float("nan"))),
     ValueError, r"probes holds NaN or ±inf"),
    ("rope table with an inf", with_rope_table(1, lambda t: t.index_fill(0, torch.tensor([0]), float("inf"))),
     ValueError, r"rope\[1\] holds NaN or ±inf"),
    # cosines of 1e30: q·k beyond float32, NaN outputs and gradients where float64 is finite
    ("rope table beyond ±1", with_rope_table(0, lambda t: t.index_fill(0, torch.tensor([0]), 1e30)),
     ValueError, r"rope\[0\] holds 1e\+30: the tables are cosines and sines, within ±1"),
    # finite probes near float32's largest: the statistics' sums over rows were inf from the reference, finite from
    # the C++ kernels; beyond float32 (float64 probes of 1e300) inf from both
    ("probes near float32's largest", changed("probes", lambda p: p.float().index_fill(0, torch.tensor([0]), 3e38)),
     ValueError, r"probes hold 3e\+38, beyond ±1e\+30"),
    ("probes beyond float32", changed("probes", lambda p: p.double().index_fill(0, torch.tensor([0]), 1e300)),
     ValueError, r"probes hold 1e\+300, beyond ±1e\+30"),
    # the backends index dense memory: these failed deep inside (reshape, bmm, the C++ op's dispatch)
    *[(f"sparse {name}", changed(name, torch.Tensor.to_sparse), TypeError, rf"{name} must be a dense tensor")
      for name in ("x", "w_qkv", "probes")],
    ("nested x", changed("x", lambda t: torch.nested.nested_tensor(list(t))), TypeError,
     r"x must be a dense tensor .*nested"),
    ("complex probes", changed("probes", lambda t: t.to(torch.complex64)), TypeError, r"probes .*torch.complex64"),
    ("float8 probes", changed("probes", lambda t: t.to(torch.float8_e4m3fn)), TypeError,
     r"probes must be bool, integer or one of .*, got torch.float8_e4m3fn"),  # torch's NotImplementedError
    # x @ w_qkv would run in one of the two dtypes, rounding or widening the other without a word
    ("w_qkv float32 under float64 x", changed("w_qkv", lambda t: t.float()), TypeError,
     r"w_qkv is torch.float32 but x is torch.float64"),
    ("x float32 over float64 w_qkv", changed("x", lambda t: t.float()), TypeError,
     r"w_qkv is torch.float64 but x is torch.float32"),
    ("bias float64 with float32 x", lambda a: with_bias(lambda t: t.double())(as_float32(a)), TypeError,
     r"bias is torch.float64 but x is torch.float32"),
    # rope tables in another dtype: the reference failed in a matmul, the C++ kernels rounded them without a word
    ("rope float64 with float32 weights", lambda a: with_rope_table(0, torch.Tensor.double)(as_float32(a)),
     TypeError, r"rope\[0\] is torch.float64 but w_qkv is torch.float32"),
    ("rope float16 with float32 weights", lambda a: with_rope_table(1, torch.Tensor.half)(as_float32(a)),
     TypeError, r"rope\[1\] is torch.float16 but w_qkv is torch.float32"),
    ("rope float32 under float64", with_rope_table(0, torch.Tensor.float), TypeError,
     r"rope\[0\] is torch.float32 but w_qkv is torch.float64"),
    # pe and b_qkv were cast to w_qkv's dtype without a word, where bias and rope raised
    ("pe float64 with float32 x", lambda a: changed("pe", torch.Tensor.double)(as_float32(a)), TypeError,
     r"pe is torch.float64 but w_qkv is torch.float32"),
    ("b_qkv float16 with float32 x", lambda a: changed("b_qkv", torch.Tensor.half)(as_float32(a)), TypeError,
     r"b_qkv is torch.float16 but w_qkv is torch.float32"),
    ("pe float32 under float64", changed("pe", torch.Tensor.float), TypeError,
     r"pe is torch.float32 but w_qkv is torch.float64"),
    ("b_qkv bf16 under float64", changed("b_qkv", torch.Tensor.bfloat16), TypeError,
     r"b_qkv is torch.bfloat16 but w_qkv is torch.float64"),
    # autocast's mix: x in 16 bits, the parameters (pe, b_qkv) in float32 as the weights, not in x's dtype
    ("pe bf16 in autocast's mix", lambda a: {**as_float32(a), "x": a["x"].bfloat16(), "pe": a["pe"].bfloat16()},
     TypeError, r"pe is torch.bfloat16 but w_qkv is torch.float32"),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("change, error, names", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_argument_raises_one_error_naming_it(target, change, error, names):
    backend, device = target
    with pytest.raises(error, match=names):
        call(change(make(device)), backend)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name, change", [("pe", torch.Tensor.double), ("b_qkv", torch.Tensor.half)])
def test_a_parameter_in_another_dtype_raises_under_autocast_too(target, name, change):
    """Autocast casts x and the bias, not the parameters: pe and b_qkv must still have w_qkv's dtype."""
    backend, device = target
    args = changed(name, change)(as_float32(make(device)))
    with torch.autocast(device, dtype=torch.bfloat16), pytest.raises(TypeError, match=rf"{name} is .* but w_qkv is "):
        call(args, backend)


@pytest.mark.parametrize("backend, error", [("", ValueError), ("  ", ValueError), (3, TypeError)])
def test_a_backend_naming_none_raises_naming_it(backend, error):
    """backend="" is not None: it must not quietly choose the default."""
    with pytest.raises(error, match="backend"):
        call(make("cpu"), backend)


@pytest.mark.parametrize("target", TARGETS)
def test_x_in_bf16_with_float32_weights_is_autocasts_mix_and_runs(target):
    """The one pair of dtypes allowed to differ: what the op receives under autocast, given directly. With rope
    tables (float32, as the weights) too: the reference once turned q and k into float32 and failed against v."""
    backend, device = target
    args = as_float32(make(device))
    x = args["x"].bfloat16().requires_grad_()
    out, _ = call({**args, "x": x}, backend)
    expected, _ = call(make(device), "reference")
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), expected, rtol=0.05, atol=0.05)
    out.float().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and x.grad.isfinite().all()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dim", range(4), ids=list("MBND"))
def test_empty_dimension_raises_a_value_error_naming_it(target, dim):
    backend, device = target
    shape = [M, B, N, D]
    shape[dim] = 0
    args = {**make(device, shape=tuple(shape)), "rope": None}  # rope tables need a head dim
    with pytest.raises(ValueError, match=re.escape(f"{'MBND'[dim]}=0")):
        call(args, backend)


@pytest.mark.parametrize("target", TARGETS)
def test_valid_call_matches_the_float64_reference(target):
    backend, device = target
    args = make(device, torch.float32)
    leaves = {k: args[k].detach().clone().requires_grad_() for k in ("x", "pe", "w_qkv", "b_qkv")}
    out, stats = call({**args, **leaves}, backend)
    out.backward(torch.ones_like(out))
    expected = make("cpu")
    expected_leaves = {k: expected[k].requires_grad_() for k in leaves}
    out64, stats64 = call({**expected, **expected_leaves}, "reference")
    out64.backward(torch.ones_like(out64))
    close = {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(out.cpu().double(), out64.detach(), **close)
    torch.testing.assert_close(stats.cpu().double(), stats64.double(), **close)
    for k, leaf in leaves.items():
        torch.testing.assert_close(leaf.grad.cpu().double(), expected_leaves[k].grad, **close, msg=k)


@pytest.mark.parametrize("target", TARGETS)
def test_all_meta_arguments_infer_shapes_or_name_the_device(target):
    """Meta tensors throughout are shape inference, not a mix: the backends that run on meta return meta outputs
    of the right shapes, the others say that they do not run there."""
    backend, _ = target
    args = make("meta")
    if "meta" not in BACKENDS[backend].devices:
        with pytest.raises(ValueError, match=f"{backend}.*meta"):
            call(args, backend)
        return
    out, stats = call(args, backend)
    assert out.device.type == stats.device.type == "meta"
    assert out.shape == (M, B, N, D) and stats.shape == (M, H, 3 + K)



def test_attention_maps_beyond_the_machines_memory_are_a_value_error_naming_x(monkeypatch):
    """The reference materialises [M,B,H,N,N] maps: 100,000 tokens asked torch's allocator for 80 GB and ended in
    its RuntimeError (a machine with swap would page first). The kernels, which never hold a map, still run."""
    import importlib
    monkeypatch.setattr(importlib.import_module("pe_fast.ops.pe_attention"), "available_bytes", lambda: 24 * 2**30)
    x = torch.randn(1, 1, 1, 16).expand(1, 1, 100_000, 16)
    w_qkv = torch.randn(1, 16, 48)
    with pytest.raises(ValueError, match=r"x \[M,B,N,D\] \[1, 1, 100000, 16\]: the reference's attention maps of "
                                         r"100,000 tokens need about 224 GiB, more than the memory free now "
                                         r"\(24 GiB\)"):
        pe_attention(x, None, w_qkv, None, 2, backend="reference")
    if "cpp" in BACKENDS:
        out, _ = pe_attention(x[:, :, :2000], None, w_qkv, None, 2, backend="cpp")
        assert out.shape == (1, 1, 2000, 16)


def test_attention_maps_beyond_the_memory_free_now_are_a_value_error_naming_x():
    """Under an address-space limit (ulimit -v 6 GiB) the reference's 19 GB of maps passed the check against the
    machine's whole memory and failed in torch's allocator with a traceback: the check takes the memory free now."""
    import subprocess
    import sys
    code = ("import resource, torch; from pe_fast.ops import pe_attention\n"
            "resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, resource.RLIM_INFINITY))\n"
            "try:\n"
            "    pe_attention(torch.randn(1, 1, 40000, 2), None, torch.randn(1, 2, 6), None, 1, backend='reference')\n"
            "except ValueError as error:\n"
            "    print(error)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "more than the memory free now (6 GiB)" in done.stdout, done.stdout + done.stderr


def test_a_table_found_finite_is_checked_again_once_changed_in_place():
    """A fixed table (probes, RoPE's, a mask) is checked at every call: a NaN written into it in place is found,
    through torch, through .data or a NumPy array sharing its memory (neither counts as a change to torch), and in
    inference mode (whose tensors keep no version)."""
    args = make("cpu", torch.float64)
    probes = torch.ones(1, N, N, dtype=torch.float64)
    pe_attention(args["x"], args["pe"], args["w_qkv"], args["b_qkv"], H, probes)
    probes[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="probes holds NaN"):
        pe_attention(args["x"], args["pe"], args["w_qkv"], args["b_qkv"], H, probes)
    shared = np.ones((1, N, N))
    probes = torch.from_numpy(shared)
    pe_attention(args["x"], args["pe"], args["w_qkv"], args["b_qkv"], H, probes)
    shared[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="probes holds NaN"):
        pe_attention(args["x"], args["pe"], args["w_qkv"], args["b_qkv"], H, probes)
    rope = args["rope"]
    pe_attention(args["x"], args["pe"], args["w_qkv"], args["b_qkv"], H, rope=rope)
    rope[0].data[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"rope\[0\] holds NaN"):
        pe_attention(args["x"], args["pe"], args["w_qkv"], args["b_qkv"], H, rope=rope)
    with torch.inference_mode():
        probes = torch.ones(1, N, N, dtype=torch.float64)
        pe_attention(args["x"], args["pe"], args["w_qkv"], args["b_qkv"], H, probes)
        probes[0, 1, 2] = float("nan")
        with pytest.raises(ValueError, match="probes holds NaN"):
            pe_attention(args["x"], args["pe"], args["w_qkv"], args["b_qkv"], H, probes)


@pytest.mark.parametrize("arguments, error, why", [
    ((0, 1), ValueError, "width must be at least 1, got 0"),  # ZeroDivisionError
    ((8, 0), ValueError, "num_heads must be at least 1, got 0"),
    ((8, 2, 0), ValueError, "num_models must be at least 1, got 0"),  # torch.stack's RuntimeError
    ((8, 2, -1), ValueError, "num_models must be at least 1, got -1"),
    ((8.0, 2), TypeError, "width must be an int, got float"),
    # round 16: 'no' is a true value, and built the bias it meant to leave out; a width past memory reached
    # torch's allocator and its RuntimeError
    ((8, 2, 2, "no"), TypeError, "bias must be True or False, got 'no'"),
    ((8, 2, 2, True, "False"), TypeError, "out_proj must be True or False, got 'False'"),
    ((100_000, 2, 2), ValueError, "PEAttention width=100,000 for 2 models: its weights need about"),
])
def test_the_module_s_bad_arguments_are_named(arguments, error, why):
    with pytest.raises(error, match=why):
        PEAttention(*arguments)


def test_a_state_dict_that_does_not_fit_is_named_in_one_error():
    """torch's load_state_dict listed every mismatch over several lines (a RuntimeError) and cast float64 weights
    to float32 without a word (round 16): one error naming the first tensor that does not fit; one that fits
    loads."""
    from pe_fast.nn import StackedLinear
    attention = PEAttention(8, 2, 2)
    state = attention.state_dict()
    bad = [({**state, "w_qkv": torch.zeros(1)}, ValueError, r"state_dict\['w_qkv'\] has shape \[1\], this module's "
            r"\[2, 8, 24\]"),
           ({**state, "b_qkv": state["b_qkv"].double()}, TypeError, r"state_dict\['b_qkv'\] is torch.float64"),
           ({**state, "out.weight": [1.0]}, TypeError, r"state_dict\['out.weight'\] is \[1.0\], not a tensor"),
           ({k: v for k, v in state.items() if k != "w_qkv"}, ValueError, "state_dict lacks 'w_qkv'"),
           ({**state, "extra": torch.zeros(1)}, ValueError, "state_dict holds 'extra', which this module lacks"),
           ([1, 2], TypeError, "state_dict must be a mapping"),
           # round 17: an AttributeError, torch's multi-line RuntimeError, one memory for every model's weights
           ({**state, 5: torch.zeros(1)}, TypeError, "state_dict's keys must be names"),
           ({k: v.to("meta") for k, v in state.items()}, ValueError, "is a meta tensor"),
           ({**state, "w_qkv": state["w_qkv"].to_sparse()}, ValueError, r"is a torch.sparse_coo tensor")]
    for state_dict, error, why in bad:
        with pytest.raises(error, match=why):
            attention.load_state_dict(state_dict)
    linear = StackedLinear([torch.Generator().manual_seed(i) for i in range(2)], 3, 4)
    with pytest.raises(ValueError, match=r"state_dict\['weight'\] has shape \[1\]"):
        linear.load_state_dict({k: torch.zeros(1) for k in linear.state_dict()})
    with pytest.raises(ValueError, match=r"state_dict\['w_qkv'\] has elements that share memory"):
        attention.load_state_dict({**state, "w_qkv": state["w_qkv"][:1].expand_as(state["w_qkv"])}, assign=True)
    with torch.inference_mode():
        frozen = {k: v.clone() for k, v in state.items()}
    with pytest.raises(ValueError, match="is an inference tensor"):
        attention.load_state_dict(frozen, assign=True)
    # round 18: assigned, one tensor under two names (or views of one memory) tied two weights for good
    shared = {k: v.clone() for k, v in state.items()}
    shared["out.bias"] = shared["b_qkv"][:, :8]
    with pytest.raises(ValueError, match=r"state_dict\['out.bias'\] shares memory with state_dict\['b_qkv'\]"):
        attention.load_state_dict(shared, assign=True)
    other = PEAttention(8, 2, 2)
    other.load_state_dict(state)
    for name, tensor in other.state_dict().items():
        torch.testing.assert_close(tensor, state[name], rtol=0, atol=0)


@pytest.mark.parametrize("target", TARGETS)
def test_rope_tables_off_the_unit_circle_are_named(target):
    """rope = (zeros, zeros) passed the range check (within ±1) and zeroed q and k: every row's attention uniform,
    without a word (round 16). Tables whose cos² + sin² is not 1 are refused; half-precision tables of real angles,
    rounded, are taken."""
    backend, device = target
    args = make(device)
    cos, sin = args["rope"]
    for bad, value in (((torch.zeros_like(cos), torch.zeros_like(sin)), "0"), ((cos, cos), None)):
        with pytest.raises(ValueError, match=r"rope: cos² \+ sin² is " + (value or "")):
            call({**args, "rope": bad}, backend)
    angles = torch.linspace(0, 100, cos.numel(), dtype=torch.float64).reshape(cos.shape)
    rounded = tuple(t.to(torch.bfloat16).double().to(device) for t in (angles.cos(), angles.sin()))
    call({**args, "rope": rounded}, backend)


def test_the_module_s_only_token_is_checked_as_an_index():
    """only_token past the tokens returned an empty [M,B,0,D] output; -1, Python's last item, did too."""
    torch.manual_seed(0)
    attention, x = PEAttention(8, 2, 2), torch.randn(2, 3, 4, 8)
    full = attention(x)[0]
    torch.testing.assert_close(attention(x, only_token=-1)[0], full[:, :, 3:4])
    torch.testing.assert_close(attention(x, only_token=1)[0], full[:, :, 1:2])
    for bad, error in ((4, ValueError), (-5, ValueError), (1.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="only_token"):
            attention(x, only_token=bad)


@pytest.mark.parametrize("target", TARGETS)
def test_float64_under_autocast_stays_float64(target):
    """Autocast leaves float64 alone (a float64 matmul stays float64 under it); the op refused such a call with a
    message that contradicted itself (w_qkv is torch.float64 but x is torch.float64 ...)."""
    backend, device = target
    args = make(device, torch.float64)
    expected = call(args, backend)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        out, stats = call(args, backend)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, expected[0])
    torch.testing.assert_close(stats, expected[1])


def test_a_bias_beyond_float16_under_fp16_autocast_is_named():
    """Under fp16 autocast a finite float32 bias of 1e5 is cast to inf: NaN outputs without a word (round 15). bf16
    has float32's range: the same bias runs there."""
    x, w_qkv = torch.randn(1, 1, 4, 8), torch.randn(1, 8, 24)
    bias = torch.full((1, 2, 4, 4), 1e5)
    with torch.autocast("cpu", dtype=torch.float16), pytest.raises(ValueError, match="bias holds 1e\\+05, beyond "
                                                                                       "torch.float16's range"):
        pe_attention(x, None, w_qkv, None, 2, bias=bias)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(pe_attention(x, None, w_qkv, None, 2, bias=bias)[0]).all()


def test_a_bias_that_could_take_a_gradient_is_checked_under_no_grad():
    """A bias with requires_grad (a parameter) skipped the finite check even under no_grad, where no gradient is
    taken: its -inf rows gave NaN statistics without a word."""
    x, w_qkv = torch.randn(1, 2, 4, 8), torch.randn(1, 8, 24)
    bias = torch.zeros(1, 2, 4, 4).masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1), float("-inf"))
    with torch.no_grad(), pytest.raises(ValueError, match="bias holds NaN or ±inf"):
        pe_attention(x, None, w_qkv, None, 2, bias=bias.requires_grad_())


@pytest.mark.parametrize("backend", ["reference", "cpp"])
@pytest.mark.parametrize("offset", [1e8, -1e9])
def test_a_row_of_logits_sharing_a_large_offset_is_a_uniform_softmax(backend, offset):
    """Every logit of a row at 1e8 (or a whole row masked at -1e9): in float32 they are one number, so the row's
    softmax is uniform, its output the mean of V. The reference took p = exp(s − lse), where lse's log Σ had been
    rounded away: every p was 1, the output the sum of V and Σp² 5 (issue 55)."""
    if backend not in BACKENDS:
        pytest.skip("needs pe_fast's C++ extension")
    torch.manual_seed(0)
    x, w_qkv = torch.randn(1, 1, 5, 8), torch.randn(1, 8, 24) / 8 ** 0.5
    out, stats = pe_attention(x, None, w_qkv, None, 1, bias=torch.full((1, 1, 5, 5), offset), backend=backend)
    v = (x @ w_qkv)[..., 16:]
    torch.testing.assert_close(out, v.mean(2, keepdim=True).expand_as(out), atol=1e-6, rtol=0)
    torch.testing.assert_close(stats[0, 0], torch.tensor([math.log(5), 0.2, 0.2]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("spoil", [lambda x: x.fill_(float("nan")), lambda x: x.mul_(1e30)], ids=["nan", "overflow"])
@pytest.mark.parametrize("target", TARGETS)
def test_a_model_whose_x_is_not_finite_leaves_the_other_models_alone(target, spoil):
    """x is not checked (a pass over it at every call of every block): in a pack, a model that diverged carries
    NaN in x while the others train on, so the op must keep it to that model. Model 0's x NaN, or so large that
    its logits pass float32's range: model 1's outputs, statistics and gradients are those of the float64 reference
    of model 1 alone, and model 0's outputs are not finite."""
    backend, device = target
    args = make(device, torch.float32)
    with torch.no_grad():
        spoil(args["x"][0])
    leaves = {k: args[k].detach().clone().requires_grad_() for k in ("x", "pe", "w_qkv", "b_qkv")}
    out, stats = call({**args, **leaves}, backend)
    out.backward(torch.ones_like(out))
    alone = make("cpu")
    alone = {**alone, **{k: alone[k][1:].requires_grad_() for k in leaves}}
    out64, stats64 = call(alone, "reference")
    out64.backward(torch.ones_like(out64))
    close = {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(out[1:].detach().cpu().double(), out64.detach(), **close)
    torch.testing.assert_close(stats[1:].cpu().double(), stats64.double(), **close)
    for k, leaf in leaves.items():
        torch.testing.assert_close(leaf.grad[1:].cpu().double(), alone[k].grad, **close, msg=k)
    assert not torch.isfinite(out[0]).all()


class PythonOnlySubclass(torch.Tensor):
    """A subclass that adds Python behaviour alone: its values are its own."""


@pytest.mark.parametrize("where", ["torch.device", "flop counter", "vmap", "subclass"])
def test_value_checks_hold_wherever_the_call_has_values(where):
    """The value checks ran in plain eager mode alone: under torch.device's function mode, a FLOP counter's
    dispatch mode, vmap or a Python-only subclass, rope (zeros, zeros), NaN probes and a NaN bias passed without a
    word (round 17). The values exist there, and the same calls are refused."""
    from torch.utils.flop_counter import FlopCounterMode
    args = make("cpu", torch.float32)
    zeros = tuple(torch.zeros_like(t) for t in args["rope"])
    nan_probes = torch.full_like(args["probes"], float("nan"), dtype=torch.float32)
    nan_bias = torch.full((M, H, N, N), float("nan"))
    bad = [({**args, "rope": zeros}, r"rope: cos² \+ sin² is 0"), ({**args, "bias": nan_bias}, "bias holds NaN"),
           ({**args, "probes": nan_probes}, "probes holds NaN")]
    for call_args, why in bad:
        with pytest.raises(ValueError, match=why):
            if where == "torch.device":
                with torch.device("cpu"):
                    call(call_args, None)
            elif where == "flop counter":
                with FlopCounterMode(display=False):
                    call(call_args, None)
            elif where == "vmap":
                x = call_args["x"]
                torch.func.vmap(lambda xx: call({**call_args, "x": xx}, None)[0])(torch.stack([x, x]))
            else:
                call({**call_args, **{k: v.as_subclass(PythonOnlySubclass) for k, v in call_args.items()
                                      if k in ("x", "probes", "bias") and isinstance(v, torch.Tensor)}}, None)
