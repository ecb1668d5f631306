"""The reference pe_attention against independent implementations: torch.nn.MultiheadAttention, explicit
per-row loops in float64, autograd's finite differences, and torch.library.opcheck."""
import math

import pytest
import torch

from pe_fast.ops import STAT_NAMES, pe_attention, reference


def random_inputs(M=2, B=3, N=7, D=12, K=2, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)
    return r(M, B, N, D), r(M, N, D), r(M, D, 3 * D) / math.sqrt(D), r(M, 3 * D), (torch.rand(K, N, N, generator=g, dtype=dtype) > 0.5).to(dtype)


@pytest.mark.parametrize("heads", [1, 3])
def test_output_matches_torch_multihead_attention(heads):
    x, pe, w, b, _ = random_inputs()
    out, _ = pe_attention(x, pe, w, b, heads)
    M, B, N, D = x.shape
    for m in range(M):
        mha = torch.nn.MultiheadAttention(D, heads, batch_first=True, dtype=torch.float64)
        with torch.no_grad():
            mha.in_proj_weight.copy_(w[m].T)
            mha.in_proj_bias.copy_(b[m])
            mha.out_proj.weight.copy_(torch.eye(D, dtype=torch.float64))
            mha.out_proj.bias.zero_()
        h = x[m] + pe[m]
        expected, _ = mha(h, h, h, need_weights=False)
        torch.testing.assert_close(out[m], expected, rtol=1e-10, atol=1e-10)


def test_statistics_match_per_row_loops():
    x, pe, w, b, probes = random_inputs(N=5, D=8)
    heads = 2
    _, stats = pe_attention(x, pe, w, b, heads, probes)
    M, B, N, D = x.shape
    dh = D // heads
    assert stats.shape == (M, heads, len(STAT_NAMES) + len(probes))
    for m in range(M):
        qkv = (x[m] + pe[m]) @ w[m] + b[m]
        for h in range(heads):
            totals = torch.zeros(3 + len(probes), dtype=torch.float64)
            for batch in range(B):
                q = qkv[batch, :, h * dh:(h + 1) * dh]
                k = qkv[batch, :, D + h * dh:D + (h + 1) * dh]
                for i in range(N):
                    logits = [float(q[i] @ k[j]) / math.sqrt(dh) for j in range(N)]
                    top = max(logits)
                    weights = [math.exp(v - top) for v in logits]
                    p = [v / sum(weights) for v in weights]
                    row = [-sum(v * math.log(v) for v in p), max(p), sum(v * v for v in p)]
                    row += [sum(p[j] * float(t[i, j]) for j in range(N)) for t in probes]
                    totals += torch.tensor(row, dtype=torch.float64)
            torch.testing.assert_close(stats[m, h].double(), (totals / (B * N)), rtol=1e-6, atol=1e-6)


def test_gradients_pass_gradcheck_with_rope_and_bias():
    x, pe, w, b, probes = random_inputs(M=2, B=2, N=5, D=8)
    heads = 2
    angles = torch.rand(5, 2, dtype=torch.float64) * 6
    bias = torch.randn(2, heads, 5, 5, dtype=torch.float64)
    tensors = [t.clone().requires_grad_() for t in (x, pe, w, b, bias)]
    for rope in (None, (angles.cos(), angles.sin())):
        def f(x, pe, w, b, bias):
            return pe_attention(x, pe, w, b, heads, probes, rope=rope, bias=bias)[0]
        assert torch.autograd.gradcheck(f, tensors)


def test_rope_matches_explicit_rotation_matrices():
    x, _, w, _, _ = random_inputs(M=1, B=1, N=4, D=4)
    angles = torch.rand(4, 2, dtype=torch.float64) * 6
    out, _ = pe_attention(x, None, w, None, 1, rope=(angles.cos(), angles.sin()))
    q, k, v = (x[0, 0] @ w[0]).split(4, dim=-1)

    def rotation(theta):  # block-diagonal 2×2 rotations acting on row vectors
        r = torch.zeros(4, 4, dtype=torch.float64)
        for pair, a in enumerate(theta):
            c, s = math.cos(a), math.sin(a)
            r[2 * pair:2 * pair + 2, 2 * pair:2 * pair + 2] = torch.tensor([[c, s], [-s, c]])
        return r
    q = torch.stack([q[i] @ rotation(angles[i]) for i in range(4)])
    k = torch.stack([k[i] @ rotation(angles[i]) for i in range(4)])
    expected = torch.softmax(q @ k.T / 2.0, dim=-1) @ v
    torch.testing.assert_close(out[0, 0], expected)


def test_statistics_carry_no_gradient_and_pe_none_works():
    x, _, w, b, probes = random_inputs()
    x.requires_grad_()
    out, stats = pe_attention(x, None, w, b, 2, probes)
    assert not stats.requires_grad and out.requires_grad


def test_backward_fills_no_zero_gradients_for_the_saved_outputs():
    """The op's saved outputs (qkv, lse) and stats carry no gradient; autograd must not fill zero tensors for
    them every step (a qkv-sized one costs a pass over the activations)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Fills(TorchDispatchMode):
        shapes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten.fill_, torch.ops.aten.zeros, torch.ops.aten.zeros_like):
                self.shapes.append(tuple(args[0]) if func.overloadpacket is torch.ops.aten.zeros
                                   else tuple(args[0].shape))
            return func(*args, **(kwargs or {}))

    x, pe, w, b, probes = random_inputs(M=2, B=3, N=5, D=8)
    for t in (x, pe, w, b):
        t.requires_grad_()
    out, _ = pe_attention(x, pe, w, b, 2, probes)
    with Fills() as fills:
        out.backward(torch.ones_like(out))
    M, B, N, D = x.shape
    assert (M, B, N, 3 * D) not in fills.shapes and (M, B, 2, N) not in fills.shapes, fills.shapes
    assert x.grad is not None and pe.grad is not None and w.grad is not None


def test_float32_matches_float64_within_contract():
    x, pe, w, b, probes = random_inputs(N=17, D=16)
    out64, stats64 = pe_attention(x, pe, w, b, 4, probes)
    out32, stats32 = pe_attention(x.float(), pe.float(), w.float(), b.float(), 4, probes.float())
    torch.testing.assert_close(out32.double(), out64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats32.double(), stats64.double(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gap", [10, 18, 30])
def test_the_bias_gradient_of_a_saturated_softmax_matches_float64(gap):
    """Rows whose bias puts one key `gap` above the others (p one-hot to within e^-gap): the bias gradient at that
    key, p·(dp − Σ p·dp), cancelled to float32's rounding of dp, 96 % of the largest true value off at gap 18 and
    all of it at 30 (round 16). Shifting dp by its value at the row's largest p keeps the small terms."""
    M, B, N, D, H = 1, 2, 4, 8, 2

    def bias_gradient(dtype):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(M, B, N, D, generator=g, dtype=torch.float64) * 0.1
        w = torch.randn(M, D, 3 * D, generator=g, dtype=torch.float64) / 3
        bias = -gap * (1 + torch.rand(M, H, N, N, generator=g, dtype=torch.float64))
        bias[..., 0] = 0
        x, w, bias = (t.to(dtype).requires_grad_() for t in (x, w, bias))
        out, _ = pe_attention(x, None, w, None, H, bias=bias, backend="reference")
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
                     .to(dtype))
        return bias.grad.double()

    got, want = bias_gradient(torch.float32), bias_gradient(torch.float64)
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())


@pytest.mark.parametrize("bad", ["x", "pe", "w", "heads", "probes", "backend"])
def test_bad_inputs_raise_clear_errors(bad):
    x, pe, w, b, probes = random_inputs()
    args = dict(x=x, pe=pe, w=w, heads=2, probes=probes, backend=None)
    args[bad] = {"x": x[0], "pe": pe[:, :3], "w": w[..., :5], "heads": 5, "probes": probes[:, :2],
                 "backend": "nonexistent"}[bad]
    with pytest.raises(ValueError):
        pe_attention(args["x"], args["pe"], args["w"], b, args["heads"], args["probes"], backend=args["backend"])


def test_opcheck():
    x, pe, w, b, probes = random_inputs(dtype=torch.float32)
    for t in (x, pe, w, b):
        t.requires_grad_()
    torch.library.opcheck(torch.ops.pe_fast.pe_attention.default,
                          (x, pe, w, b, 2, probes, None, None, None, "reference"))


def test_pe_attention_module_matches_multihead_attention_with_output_projection():
    from pe_fast.nn import PEAttention
    torch.manual_seed(0)
    module = PEAttention(8, 2, num_models=1).double()
    with torch.no_grad():
        module.b_qkv.normal_()
        module.out.bias.normal_()
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(module.w_qkv[0].T)
        mha.in_proj_bias.copy_(module.b_qkv[0])
        mha.out_proj.weight.copy_(module.out.weight[0].T)
        mha.out_proj.bias.copy_(module.out.bias[0])
    x, pe = torch.randn(1, 3, 5, 8, dtype=torch.float64), torch.randn(1, 5, 8, dtype=torch.float64)
    y, stats = module(x, pe)
    h = x[0] + pe[0]
    torch.testing.assert_close(y[0], mha(h, h, h, need_weights=False)[0])
    assert stats.shape == (1, 2, 3)


def test_default_backend_follows_the_preference_not_the_import_order(monkeypatch):
    from pe_fast.ops import backends
    fake = backends.Backend(reference.forward, reference.backward, ("cpu",))
    # registered in the "wrong" order: the reference first, then cpp, then triton claiming the CPU
    monkeypatch.setattr(backends, "BACKENDS", {"reference": backends.BACKENDS["reference"]})
    backends.register_backend("cpp", fake)
    assert backends.resolve_backend(None, torch.device("cpu")) == "cpp"
    backends.register_backend("triton", fake)
    assert backends.resolve_backend(None, torch.device("cpu")) == "triton"
    with pytest.raises(ValueError, match="PREFERENCE"):
        backends.register_backend("mine", fake)
