"""The fused sublayer ends (pe_fast.ops.sublayer_ends, kernels/sublayer.h) against torch's own ops in float64: the
linear layer + GELU and the residual + layer norm, forward and every gradient; float32 within rounding of the
float64 result; GELU's tails against erfc (torch's 1 + erf cancels there); the whole model's training step
fused and unfused; what does not fuse runs torch's ops."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pe_fast.models.transformer import ModelConfig, StackedTransformer
from pe_fast.ops import sublayer_ends

pytestmark = pytest.mark.skipif(not sublayer_ends.BUILT, reason="needs pe_fast's C++ extension")


def leaves(*shapes, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=dtype).requires_grad_() for s in shapes]


def as_float64(tensors):
    return [t.detach().double().requires_grad_() for t in tensors]


def gelu_reference(x):
    """Exact GELU in float64 through erfc: accurate where GELU is tiny (x ≪ 0)."""
    return x * 0.5 * torch.special.erfc(-x / 2 ** 0.5)


def linear_gelu_reference(x, w, b):
    M, D = x.shape[0], x.shape[-1]
    return gelu_reference(torch.baddbmm(b[:, None], x.reshape(M, -1, D), w)).reshape(*x.shape[:-1], w.shape[-1])


def layer_norm_reference(a, b, w, beta, add):
    x = a + b
    if add is not None:
        M, T, D = add.shape
        x = (x.reshape(M, -1, T, D) + add[:, None]).reshape(a.shape)
    extra = (1,) * (a.dim() - 2)
    M, D = w.shape
    return F.layer_norm(x, (D,)) * w.view(M, *extra, D) + beta.view(M, *extra, D)


def compare(fused, reference, inputs, grad_seed=1):
    """Max |difference| of the outputs and of every input's gradient, fused vs reference (float64)."""
    y = fused(*inputs)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(grad_seed), dtype=torch.float64)
    grads = torch.autograd.grad(y, [t for t in inputs if t is not None], g.to(y.dtype))
    ref_inputs = [None if t is None else t.detach().double().requires_grad_() for t in inputs]
    y_ref = reference(*ref_inputs)
    ref_grads = torch.autograd.grad(y_ref, [t for t in ref_inputs if t is not None], g)
    return [(y.double() - y_ref).abs().max().item()] + [(a.double() - b).abs().max().item()
                                                        for a, b in zip(grads, ref_grads)]


@pytest.mark.parametrize("shape", [(3, 4, 5, 8, 16), (2, 1, 300, 8, 3), (1, 2, 7, 5, 1)])
def test_linear_gelu_equals_torch_in_float64(shape):
    M, B, N, D, F_out = shape
    x, w, b = leaves((M, B, N, D), (M, D, F_out), (M, F_out))
    assert sublayer_ends.fusable(x, w, b)
    errors = compare(sublayer_ends.linear_gelu, linear_gelu_reference, [x, w, b])
    assert max(errors) < 1e-12, errors


@pytest.mark.parametrize("tokens,with_add", [(5, True), (5, False), (1, True), (300, True)])
def test_residual_layer_norm_equals_torch_in_float64(tokens, with_add):
    """rows in several chunks (300 tokens × 2), one token per sequence (a readout block), add or none"""
    M, B, D = 3, 2, 8
    a, b, add, w, beta = leaves((M, B, tokens, D), (M, B, tokens, D), (M, tokens, D), (M, D), (M, D))
    add = add if with_add else None
    fused = lambda a, b, w, beta, add: sublayer_ends.residual_layer_norm(a, b, w, beta, add)  # noqa: E731
    errors = compare(fused, layer_norm_reference, [a, b, w, beta, add])
    assert max(errors) < 1e-12, errors


def test_float32_is_float64_rounded():
    M, B, N, D, H = 2, 3, 10, 32, 64
    x, w, b = leaves((M, B, N, D), (M, D, H), (M, H), dtype=torch.float32)
    assert max(compare(sublayer_ends.linear_gelu, linear_gelu_reference, [x, w, b])) < 2e-5
    a, r, add, g, beta = leaves((M, B, N, D), (M, B, N, D), (M, N, D), (M, D), (M, D), dtype=torch.float32)
    fused = lambda a, b, w, beta, add: sublayer_ends.residual_layer_norm(a, b, w, beta, add)  # noqa: E731
    assert max(compare(fused, layer_norm_reference, [a, r, g, beta, add])) < 2e-5


@pytest.mark.parametrize("scale", [1e19, 1e20, 1e30, 1e37, 1e38])
def test_float32_layer_norm_of_huge_finite_values_equals_float64(scale):
    """Rows of |x| beyond about 1e19, whose squares overflow float: the layer norm returned β for all of them, and
    a zero input gradient (issue 55); torch's own float32 layer norm returns NaN there. Now: float64's numbers,
    forward and gradients, to float32's rounding relative to each one's largest."""
    M, B, N, D = 2, 2, 5, 32
    a, r, add, g, beta = leaves((M, B, N, D), (M, B, N, D), (M, N, D), (M, D), (M, D), dtype=torch.float32)
    with torch.no_grad():
        for t in (a, r, add):
            t.mul_(scale / 3)
    fused = lambda a, b, w, beta, add: sublayer_ends.residual_layer_norm(a, b, w, beta, add)  # noqa: E731
    inputs = [a, r, g, beta, add]
    y = fused(*inputs)
    seed = torch.Generator().manual_seed(1)
    dy = torch.randn(y.shape, generator=seed, dtype=torch.float64)
    grads = torch.autograd.grad(y, inputs, dy.float())
    exact_inputs = as_float64(inputs)
    exact = layer_norm_reference(*exact_inputs)
    exact_grads = torch.autograd.grad(exact, exact_inputs, dy)
    for got, want in zip([y, *grads], [exact, *exact_grads]):
        assert torch.isfinite(got).all()
        assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()


def test_float32_gelu_and_its_derivative_over_the_whole_range():
    """Both branches of the erf fit, its switch at |x| = 0.9·√2, the far tails where torch's float32 GELU is 0,
    and exp(−x²/2)'s underflow: within 5e-7 absolutely of the exact values (torch's float32: 1.2e-6)."""
    xs = torch.linspace(-16, 16, 320_001)
    x = xs.view(1, -1, 1).clone().requires_grad_()
    y = sublayer_ends.linear_gelu(x, torch.ones(1, 1, 1), torch.zeros(1, 1)).flatten()
    dy, = torch.autograd.grad(y.sum(), x)
    exact_x = xs.double().requires_grad_()
    exact = gelu_reference(exact_x)
    exact_dy, = torch.autograd.grad(exact.sum(), exact_x)
    assert (y.double() - exact).abs().max() < 5e-7
    assert (dy.flatten().double() - exact_dy).abs().max() < 5e-7
    tail = (exact.abs() > 1e-30) & (xs < -4)  # where GELU is tiny, its relative error
    assert ((y.double() - exact).abs() / exact.abs())[tail].max() < 1e-4


def test_results_do_not_depend_on_the_thread_count():
    x, w, b = leaves((4, 8, 100, 32), (4, 32, 64), (4, 64), dtype=torch.float32)
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            y = sublayer_ends.linear_gelu(x, w, b)
            results.append([y, *torch.autograd.grad(y, (x, w, b), torch.ones_like(y))])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(p, q) for p, q in zip(*results))


def training_step_gradients(fused: bool, monkeypatch, readout_token=None):
    monkeypatch.setattr(sublayer_ends, "BUILT", fused)
    config = ModelConfig(num_tokens=6, token_dim=3, out_dim=2, width=8, depth=2, heads=2, mlp_width=16,
                         readout_token=readout_token)
    model = StackedTransformer(config, seeds=[0, 1, 2], sigmas=[0.1, 0.5, 1.0]).double()
    tokens = torch.randn(3, 4, 6, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    probes = torch.rand(1, 6, 6, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    out, stats = model(tokens, probes)
    out.square().sum().backward()
    return out, stats, {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("readout_token", [None, 0])
def test_model_training_step_fused_equals_unfused(monkeypatch, readout_token):
    """The whole stacked transformer in float64: outputs, attention statistics and every parameter's gradient (the
    PE tables', the projection biases folded into the layer norm's addend) equal with and without the kernels."""
    out, stats, grads = training_step_gradients(True, monkeypatch, readout_token)
    ref_out, ref_stats, ref_grads = training_step_gradients(False, monkeypatch, readout_token)
    assert torch.allclose(out, ref_out, rtol=0, atol=1e-12) and torch.allclose(stats, ref_stats, atol=1e-12)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        assert torch.allclose(grads[name], ref_grads[name], rtol=0, atol=1e-11), name


def test_what_does_not_fuse_runs_torch(monkeypatch):
    """bf16 under autocast or not, mixed dtypes, or tracing: torch's ops (the kernels are never called)."""
    def refuse(*args):
        raise AssertionError("a fused kernel ran")
    monkeypatch.setattr(sublayer_ends._LinearGelu, "apply", refuse)
    monkeypatch.setattr(sublayer_ends._ResidualLayerNorm, "apply", refuse)
    x, w, b = leaves((2, 3, 4, 8), (2, 8, 8), (2, 8), dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert sublayer_ends.linear_gelu(x, w, b).dtype == torch.bfloat16
    sublayer_ends.linear_gelu(*(t.to(torch.bfloat16) for t in (x, w, b)))
    torch.func.vmap(lambda t: sublayer_ends.linear_gelu(t, w, b))(x[None])
    g, beta = leaves((2, 8), (2, 8), dtype=torch.float32)
    assert sublayer_ends.residual_layer_norm(x.half(), x, g, beta).dtype == torch.float32


def test_a_bad_addend_is_refused():
    a, b, w, beta = leaves((2, 3, 4, 8), (2, 3, 4, 8), (2, 8), (2, 8))
    with pytest.raises(ValueError, match="add must be"):
        sublayer_ends.residual_layer_norm(a, b, w, beta, torch.zeros(2, 2, 8, dtype=torch.float64))


def test_strided_parameters_are_taken_as_their_values():
    """A bias, weight or beta that is a view with strides (a slice of a larger pack's, as functional_call passes
    them) went to the C++ kernels as given, which refused it ("must be contiguous"); shapes that do not fit are a
    ValueError naming the argument, not the kernels' RuntimeError."""
    x, weight = torch.randn(2, 5, 4, dtype=torch.float64), torch.randn(2, 4, 6, dtype=torch.float64)
    bias = torch.randn(2, 12, dtype=torch.float64)[:, ::2]
    torch.testing.assert_close(sublayer_ends.linear_gelu(x, weight, bias), F.gelu(x @ weight + bias[:, None]))
    a = torch.randn(2, 3, 6, dtype=torch.float64)
    scale, beta = (torch.randn(2, 12, dtype=torch.float64)[:, ::2] for _ in range(2))
    torch.testing.assert_close(sublayer_ends.residual_layer_norm(a, torch.zeros_like(a), scale, beta),
                               F.layer_norm(a, (6,)) * scale[:, None] + beta[:, None])
    with pytest.raises(ValueError, match=r"bias must be \[M, out\] = \[2, 6\]"):
        sublayer_ends.linear_gelu(x, weight, bias[:, :4])
    with pytest.raises(ValueError, match=r"beta must be \[M, D\] = \[2, 6\]"):
        sublayer_ends.residual_layer_norm(a, a, scale, beta[:, :3])


def test_a_linear_layer_s_gelu_without_its_bias_leaves_the_bias_out():
    """StackedLinear(x, gelu=True, add_bias=False) added the bias anyway."""
    from pe_fast.nn import StackedLinear
    layer = StackedLinear([torch.Generator().manual_seed(i) for i in range(2)], 4, 3).double()
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    torch.testing.assert_close(layer(x, gelu=True, add_bias=False), F.gelu(x @ layer.weight))
    torch.testing.assert_close(layer(x, gelu=True), F.gelu(x @ layer.weight + layer.bias[:, None]))


@pytest.mark.parametrize("build, error, why", [
    (lambda nn: nn.StackedLinear([torch.Generator()], 0, 3), ValueError, "d_in must be at least 1"),
    (lambda nn: nn.StackedLinear([], 4, 3), TypeError, "generators must be a non-empty sequence"),
    (lambda nn: nn.StackedLayerNorm(2, -1), ValueError, "width must be at least 1"),
    (lambda nn: nn.StackedLayerNorm(1, 4, eps=float("nan")), ValueError, "eps must be a positive finite number"),
    (lambda nn: nn.PEAttention(8, 2, generators=[1]), TypeError, "generators must be a non-empty sequence"),
    # refused at the first forward only
    (lambda nn: nn.PEAttention(8, 2, backend=5), TypeError, "backend must be a str or None"),
    (lambda nn: nn.PEAttention(8, 2, backend="nope"), ValueError, "unknown pe_attention backend 'nope'"),
])
def test_the_stacked_layers_name_their_bad_arguments(build, error, why):
    import pe_fast.nn
    with pytest.raises(error, match=why):
        build(pe_fast.nn)


def test_the_sublayer_ends_name_their_bad_arguments():
    """A NaN or negative eps gave NaN outputs without a word; non-tensors reached torch's AttributeErrors."""
    a, scale, beta = torch.randn(2, 5, 6), torch.ones(2, 6), torch.zeros(2, 6)
    for eps in (float("nan"), -1.0, True):
        with pytest.raises(ValueError, match="eps must be a positive finite number"):
            sublayer_ends.residual_layer_norm(a, a, scale, beta, eps=eps)
    with pytest.raises(ValueError, match=r"b must have a's shape \[2, 5, 6\]"):
        sublayer_ends.residual_layer_norm(a, torch.randn(2, 4, 6), scale, beta)
    with pytest.raises(TypeError, match="weight must be a floating tensor"):
        sublayer_ends.residual_layer_norm(a, a, [[1.0] * 6] * 2, beta)
    with pytest.raises(TypeError, match="bias must be a floating tensor, got NoneType"):
        sublayer_ends.linear_gelu(a, torch.randn(2, 6, 3), None)


def test_a_layer_s_input_of_another_shape_names_x():
    """A wrong model count or width reached torch's RuntimeErrors (StackedLinear), or blamed the layer's own
    w_qkv, which the caller never passed (PEAttention)."""
    from pe_fast.nn import PEAttention, StackedLinear
    layer = StackedLinear([torch.Generator().manual_seed(i) for i in range(2)], 4, 3)
    for x in (torch.randn(3, 5, 4), torch.randn(2, 5, 5)):
        for gelu in (False, True):
            with pytest.raises(ValueError, match=r"x must be \[M, \.\.\., width\] = \[2, \.\.\., 4\]"):
                layer(x, gelu=gelu)
    attention = PEAttention(8, 2, 2)
    for x in (torch.randn(3, 3, 5, 8), torch.randn(2, 3, 5, 6)):
        with pytest.raises(ValueError, match=r"x must be \[M, B, N, D\] = \[2, B, N, 8\] for this layer"):
            attention(x)


def test_a_layer_s_input_of_another_model_count_device_or_dtype_names_x():
    """StackedLayerNorm broadcast model 0's parameters over an x of two models; a meta x through StackedLinear gave
    a CPU tensor of uninitialised memory; float64 or integer tokens reached torch's RuntimeErrors (issue 55)."""
    from pe_fast.nn import StackedLayerNorm, StackedLinear
    norm = StackedLayerNorm(1, 4)
    for residual in (None, torch.randn(2, 3, 4)):
        with pytest.raises(ValueError, match=r"x must be \[M, \.\.\., width\] = \[1, \.\.\., 4\]"):
            norm(torch.randn(2, 3, 4), residual)
    linear = StackedLinear([torch.Generator()], 3, 4)
    with pytest.raises(ValueError, match="x is on meta, the layer's weights on cpu"):
        linear(torch.zeros(1, 2, 3, device="meta"))
    with pytest.raises(TypeError, match="x is torch.float64, the layer's weights torch.float32"):
        linear(torch.zeros(1, 2, 3, dtype=torch.float64))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast's mix of dtypes is its own to reconcile
        assert linear(torch.zeros(1, 2, 3, dtype=torch.bfloat16)).dtype == torch.bfloat16
    model = StackedTransformer(ModelConfig(num_tokens=4, token_dim=3, out_dim=2, width=8, depth=1, heads=2,
                                           mlp_width=8, pe="none"), [1], [None])
    for tokens in (torch.randn(1, 2, 4, 3, dtype=torch.float64), torch.ones(1, 2, 4, 3, dtype=torch.long)):
        with pytest.raises(TypeError, match=f"tokens are {tokens.dtype}, the model's weights torch.float32"):
            model(tokens)


def test_the_sublayer_ends_name_mixed_dtypes_and_empty_axes_and_take_empty_batches():
    """Mixed dtypes reached "expected scalar type Float", a pack of no models "cannot reshape", a 1-D input an
    IndexError; a batch of no rows reached the C++ kernels' RuntimeError. Now the first three name the argument
    and the last returns the empty result torch's ops give."""
    x, w, b = torch.randn(2, 5, 3), torch.randn(2, 3, 4), torch.randn(2, 4)
    with pytest.raises(TypeError, match="weight is torch.float64 but x is torch.float32"):
        sublayer_ends.linear_gelu(x, w.double(), b)
    with pytest.raises(ValueError, match=r"x must be \[M, \.\.\., width\] with M and width at least 1, got "
                                         r"\[0, 5, 3\]"):
        sublayer_ends.linear_gelu(x[:0], w[:0], b[:0])
    with pytest.raises(ValueError, match=r"a must be \[M, \.\.\., width\] with M and width at least 1, got \[3\]"):
        sublayer_ends.residual_layer_norm(torch.randn(3), torch.randn(3), torch.ones(3, 3), torch.zeros(3, 3))
    empty = torch.randn(2, 0, 3)
    assert sublayer_ends.linear_gelu(empty, w, b).shape == (2, 0, 4)
    assert sublayer_ends.residual_layer_norm(empty, empty, torch.ones(2, 3), torch.zeros(2, 3)).shape == (2, 0, 3)


@pytest.mark.parametrize("eps", [1e-300, 1e-46, 1e39])
def test_an_eps_float32_cannot_hold_is_refused(eps):
    """eps = 1e-300 is 0 in float32 (a constant row's 0/0: NaN), 1e39 inf (every output β) (issue 55)."""
    from pe_fast.nn import StackedLayerNorm
    with pytest.raises(ValueError, match="eps must be a positive finite number from"):
        StackedLayerNorm(1, 4, eps=eps)
    a = torch.ones(1, 2, 4)
    with pytest.raises(ValueError, match="eps must be a positive finite number from"):
        sublayer_ends.residual_layer_norm(a, a, torch.ones(1, 4), torch.zeros(1, 4), eps=eps)


def test_a_layer_norm_without_a_residual_takes_the_kernel_s_range_too():
    """StackedLayerNorm(x) without a residual ran torch's float32 layer norm: NaN for rows beyond 1e19, where the
    fused one gives float64's numbers (issue 55)."""
    from pe_fast.nn import StackedLayerNorm
    x = torch.tensor([[[1e20, -1e20, 3e20, 0.0]]])
    torch.testing.assert_close(StackedLayerNorm(1, 4)(x).double(), F.layer_norm(x.double(), (4,)), atol=1e-6, rtol=0)
