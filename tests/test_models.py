"""The stacked transformer: a pack trains exactly like its models trained one by one."""
import numpy as np
import pytest
import torch

from pe_fast.models import ModelConfig, StackedTransformer
from pe_fast.train import TrainConfig, make_optimizer

GRID = np.stack(np.divmod(np.arange(16), 4), axis=1).astype(float)


def train(model, inputs, targets, steps=20):
    # the sweep's optimizer (fused AdamW: one multi-tensor update for the whole pack)
    optimizer = make_optimizer(model.parameters(), TrainConfig(steps, lr=1e-3, optimizer="adamw", weight_decay=0.01))
    for _ in range(steps):
        outputs, _ = model(inputs)
        loss = torch.nn.functional.cross_entropy(outputs.flatten(0, 1), targets.flatten(), reduction="none")
        optimizer.zero_grad()
        loss.view(targets.shape).mean(1).sum().backward()
        optimizer.step()
    return model


@pytest.mark.parametrize("pe", ["learned", "relative", "rope2d", "sin2d"])
@pytest.mark.parametrize("pe_at", ["every", "input"])
def test_pack_of_three_trains_like_each_model_alone(pe, pe_at):
    config = ModelConfig(num_tokens=16, token_dim=5, out_dim=4, width=16, depth=2, heads=2, mlp_width=32,
                         pe=pe, pe_at=pe_at, readout_token=15)
    seeds, sigmas = [11, 22, 33], [0.1, 0.5, 2.0]
    g = torch.Generator().manual_seed(0)
    # float64: the key bias gets a zero gradient in exact arithmetic (softmax ignores a per-row shift), and
    # Adam would amplify float32 rounding noise in it to lr-sized steps that differ between pack and alone.
    inputs = torch.randn(3, 8, 16, 5, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 4, (3, 8), generator=g)
    pack = train(StackedTransformer(config, seeds, sigmas, GRID).double(), inputs, targets)
    for m in range(3):
        alone = train(StackedTransformer(config, [seeds[m]], [sigmas[m]], GRID).double(),
                      inputs[m:m + 1], targets[m:m + 1])
        for (name, p_pack), (_, p_alone) in zip(pack.named_parameters(), alone.named_parameters()):
            torch.testing.assert_close(p_pack[m:m + 1], p_alone, rtol=1e-5, atol=1e-5, msg=name)


def test_model_initialisation_depends_only_on_its_seed_and_sigma():
    config = ModelConfig(num_tokens=16, token_dim=5, out_dim=4, width=16, depth=2, mlp_width=32)
    a = StackedTransformer(config, [5, 6], [0.2, 1.0], GRID)
    b = StackedTransformer(config, [6], [1.0], GRID)
    for p_a, p_b in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p_a[1:], p_b, rtol=0, atol=0)


def test_same_seed_shares_weights_across_sigma_and_pe_scales_with_sigma():
    config = ModelConfig(num_tokens=16, token_dim=5, out_dim=4, width=16, depth=2, mlp_width=32)
    model = StackedTransformer(config, [7, 7], [0.1, 2.0], GRID)
    torch.testing.assert_close(model.embed.weight[0], model.embed.weight[1])
    first = model.pe_tables()[0]
    torch.testing.assert_close(first[1], first[0] * 20)  # same draw, σ ratio 20


def test_pe_at_every_block_has_independent_tables_and_input_has_one():
    kwargs = dict(num_tokens=16, token_dim=5, out_dim=4, width=16, depth=3, mlp_width=32)
    every = StackedTransformer(ModelConfig(**kwargs, pe_at="every"), [1], [1.0], GRID)
    assert len(every.pe_tables()) == 3
    assert not torch.allclose(every.pe_tables()[0], every.pe_tables()[1])
    assert len(StackedTransformer(ModelConfig(**kwargs, pe_at="input"), [1], [1.0], GRID).pe_tables()) == 1


def test_post_ln_block_output_is_normalised():
    config = ModelConfig(num_tokens=16, token_dim=5, out_dim=4, width=16, depth=1, mlp_width=32)
    model = StackedTransformer(config, [1, 2], [1.0, 1.0], GRID)
    hidden = model.blocks[0](model.embed(torch.randn(2, 4, 16, 5)), model.pe_tables()[0], None, None, None)[0]
    torch.testing.assert_close(hidden.mean(-1), torch.zeros(2, 4, 16), atol=1e-5, rtol=0)
    torch.testing.assert_close(hidden.var(-1, unbiased=False), torch.ones(2, 4, 16), atol=1e-3, rtol=0)


def test_readout_equals_full_computation_then_selecting_the_token():
    config = ModelConfig(num_tokens=16, token_dim=5, out_dim=4, width=16, depth=2, mlp_width=32, readout_token=15)
    model = StackedTransformer(config, [3, 4], [0.5, 0.5], GRID)
    tokens = torch.randn(2, 6, 16, 5)
    outputs, _ = model(tokens)
    h = model.embed(tokens)
    for index, block in enumerate(model.blocks):
        h, _ = block(h, model.pe_tables()[index], None, None, None)  # every token, no shortcut
    torch.testing.assert_close(outputs, model.head(h[:, :, 15]))


def test_the_compute_path_is_chosen_once_from_the_config(monkeypatch):
    """ModelConfig.backend reaches every block's attention when the model is built; no environment variable is read
    on a forward (a leftover PE_FAST_BACKEND changes nothing), and an unknown path is refused by name."""
    from pe_fast.ops import backends
    config = ModelConfig(num_tokens=5, token_dim=3, out_dim=2, width=8, depth=2, mlp_width=16, backend="reference")
    model = StackedTransformer(config, seeds=[1, 2], sigmas=[0.1, 1.0]).double()
    assert all(block.attention.backend == "reference" and block.fused_attention is None and block.fused_mlp is None for block in model.blocks)
    ran = []
    reference = backends.BACKENDS["reference"]
    monkeypatch.setitem(backends.BACKENDS, "reference", backends.Backend(
        lambda *a, **k: ran.append(1) or reference.forward(*a, **k), reference.backward, reference.devices))
    monkeypatch.setenv("PE_FAST_BACKEND", "no-such-backend")
    tokens = torch.randn(2, 3, 5, 3, dtype=torch.float64)
    outputs, _ = model(tokens)
    assert len(ran) == config.depth  # every block's attention ran the configured backend
    default = StackedTransformer(ModelConfig(**{**config.__dict__, "backend": None}), [1, 2], [0.1, 1.0]).double()
    torch.testing.assert_close(default(tokens)[0], outputs)  # the same model on the device's default backend
    with pytest.raises(ValueError, match="backend must be one of"):
        ModelConfig(num_tokens=5, token_dim=3, out_dim=2, backend="no-such-backend")


TINY_CONFIG = dict(num_tokens=4, token_dim=3, out_dim=2, width=8, depth=1, heads=2, mlp_width=8)


@pytest.mark.parametrize("change, error, why", [
    (dict(heads=0), ValueError, "heads must be at least 1"),  # ZeroDivisionError
    (dict(depth=0), ValueError, "depth must be at least 1"),  # torch.stack of no blocks
    (dict(token_dim=0), ValueError, "token_dim must be at least 1"),
    (dict(width=8.0), TypeError, "width must be an int"),
    # accepted, then an empty slice of the last block's tokens failed naming an internal `add`
    (dict(readout_token=-1), ValueError, "readout_token must be None or a token index from 0 to"),
    (dict(readout_token=4), ValueError, "readout_token must be None or a token index"),
])
def test_a_model_configuration_names_its_bad_field(change, error, why):
    with pytest.raises(error, match=why):
        ModelConfig(**{**TINY_CONFIG, **change})


@pytest.mark.parametrize("seeds, sigmas, why", [
    ([], [], "at least one model"),
    ([1.5], [0.1], "seeds: 1.5 is not a whole number"),  # int() took it as seed 1's model
    ([0], [float("nan")], r"sigmas: nan is not a σ in \[1e-15, 1e\+06\]"),  # accepted: every output NaN
    # round 17: compared in float16, 1e6 was inf and 1e-8 was 0, inside the bounds: a PE of inf, or of zeros
    ([0], np.array([np.inf], np.float16), r"sigmas: np.float16\(inf\) is not a σ"),
    ([0], [np.float16(1e-8)], r"sigmas: np.float16\(0.0\) is not a σ"),
])
def test_a_pack_names_its_bad_seeds_and_sigmas(seeds, sigmas, why):
    with pytest.raises(ValueError, match=why):
        StackedTransformer(ModelConfig(**TINY_CONFIG), seeds, sigmas)


def test_output_tokens_are_each_item_s_own_tokens_or_refused():
    """The outputs at some tokens equal the full outputs there; an index past an item's tokens (or -1) read the
    next (or previous) item's token, another model's at a model's last item, without a word."""
    torch.manual_seed(0)
    model = StackedTransformer(ModelConfig(**TINY_CONFIG), [1, 2], [0.5, 0.5])
    tokens = torch.randn(2, 3, 4, 3)
    full, _ = model(tokens)
    rows = torch.tensor([3, 0, 2]).repeat(2, 3, 1)
    torch.testing.assert_close(model(tokens, output_tokens=rows)[0], full[:, :, [3, 0, 2]])
    for bad, error, why in ((torch.full((2, 3, 1), 4), ValueError, "outside the 4 tokens"),
                            (torch.full((2, 3, 1), -1), ValueError, "outside the 4 tokens"),
                            (torch.zeros(2, 3, 1), TypeError, "int64 or int32 tensor"),
                            (torch.zeros(2, 3, dtype=torch.long), ValueError, r"\[M, B, K\] = \[2, 3, K\]")):
        with pytest.raises(error, match=f"output_tokens.*{why}"):
            model(tokens, output_tokens=bad)


def test_seeds_and_sigmas_as_arrays_or_tensors_are_the_same_models():
    """The checks of seeds and sigmas once refused a NumPy array or a tensor of them (an array's truth value)."""
    config = ModelConfig(**TINY_CONFIG)
    expected = StackedTransformer(config, [0, 1], [1.0, 2.0]).state_dict()
    for seeds, sigmas in ((np.arange(2), np.array([1.0, 2.0])), (torch.arange(2), torch.tensor([1.0, 2.0])),
                          (range(2), (1.0, 2.0))):
        got = StackedTransformer(config, seeds, sigmas).state_dict()
        assert all(torch.equal(got[name], tensor) for name, tensor in expected.items())


@pytest.mark.parametrize("arguments, error, why", [
    (dict(seeds=None, sigmas=[1.0]), TypeError, "seeds must be a sequence"),
    (dict(seeds=3, sigmas=[1.0]), TypeError, "seeds must be a sequence"),
    (dict(seeds=[0], sigmas=[1.0], init_gammas=[float("nan")]), ValueError, r"init_gammas: one γ in \[0, 4\]"),
    # the sweep's ranges, which the model did not hold (issue 55): an inf PE table, an all-zero one, all-zero weights,
    # an OverflowError
    (dict(seeds=[0], sigmas=[1e39]), ValueError, r"sigmas: 1e\+39 is not a σ in \[1e-15, 1e\+06\]"),
    (dict(seeds=[0], sigmas=[1e-50]), ValueError, r"sigmas: 1e-50 is not a σ in \[1e-15, 1e\+06\]"),
    (dict(seeds=[0], sigmas=[1.0], init_gammas=[1e6]), ValueError, r"init_gammas: one γ in \[0, 4\]"),
    (dict(seeds=[0], sigmas=[1.0], init_gammas=[-1e3]), ValueError, r"init_gammas: one γ in \[0, 4\]"),
    # NaN coordinates made every output NaN; a row count of another task's failed at the first forward
    (dict(seeds=[0], sigmas=[1.0], coordinates=np.full((4, 2), np.nan)), ValueError, "coordinates hold NaN"),
    (dict(seeds=[0], sigmas=[1.0], coordinates=np.zeros((5, 2))), ValueError,
     r"coordinates must be \[num_tokens, k\] = \[4, k ≥ 1\], got \[5, 2\]"),
    (dict(seeds=[0], sigmas=[1.0], coordinates=np.zeros((4, 0))), ValueError, "coordinates must be"),
    # round 15: complex ones lost their imaginary part with numpy's warning; 1e19 overflowed the relative PE's int64
    # offsets, 1e39 the rotary tables (NaN at the first forward, naming rope[0])
    (dict(seeds=[0], sigmas=[1.0], coordinates=np.zeros((4, 2)) + 1j), ValueError, "coordinates must be real"),
    (dict(seeds=[0], sigmas=[1.0], coordinates=np.arange(4.0)[:, None] * 1e19), ValueError,
     "coordinates hold values beyond ±1,000,000"),
])
def test_a_pack_names_its_bad_sequences(arguments, error, why):
    with pytest.raises(error, match=why):
        StackedTransformer(ModelConfig(**TINY_CONFIG), **arguments)


def test_bad_tokens_and_no_output_tokens_are_named():
    """A wrong model count or width reached torch's RuntimeErrors; K = 0 output tokens passed the check, then
    failed inside."""
    model = StackedTransformer(ModelConfig(**TINY_CONFIG), [1, 2], [0.5, 0.5])
    for tokens in (torch.randn(3, 2, 4, 3), torch.randn(2, 4, 3), torch.randn(2, 2, 4, 5)):
        with pytest.raises(ValueError, match=r"tokens must be \[M, B, N, token_dim\] = \[2, B, 4, 3\]"):
            model(tokens)
    with pytest.raises(ValueError, match="output_tokens names no token"):
        model(torch.randn(2, 3, 4, 3), output_tokens=torch.zeros(2, 3, 0, dtype=torch.long))


def test_a_relative_pe_takes_coordinates_as_integers_only_when_they_are():
    """Coordinates 1e-9 apart passed allclose as integers and all rounded to 0: every token one position. Exact
    integers index the offsets; others, as before, the token order."""
    from pe_fast.models.relative_pe import RelativePE
    near_zero = RelativePE(1, 1, 1, 4, np.arange(4.0)[:, None] * 1e-9)
    in_order = RelativePE(1, 1, 1, 4, None)
    assert torch.equal(near_zero.index, in_order.index)


def test_pe_dropout_masks_of_another_shape_dtype_or_model_are_named():
    """Masks of too few blocks gave an IndexError, of another batch a broadcast error, float64 ones a TypeError
    blaming w_qkv, and masks given to a model without PE dropout were ignored without a word (issue 55)."""
    config = ModelConfig(**{**TINY_CONFIG, "depth": 2}, pe="sin1d", pe_dropout=0.1)
    model = StackedTransformer(config, [1, 2], [None, None])
    tokens = torch.randn(2, 3, 4, 3)
    good = torch.ones(2, 2, 3, 4, 8)
    assert model(tokens, pe_dropout_masks=good)[0].shape == model(tokens)[0].shape
    for masks, error, why in ((good[:1], ValueError, r"\[blocks, M, B, N, width\] = \[2, 2, 3, 4, 8\]"),
                              (good[:, :, :2], ValueError, r"= \[2, 2, 3, 4, 8\], got \[2, 2, 2, 4, 8\]"),
                              (good.double(), TypeError, "pe_dropout_masks are torch.float64 on cpu: give "
                                                         "torch.float32")):
        with pytest.raises(error, match=why):
            model(tokens, pe_dropout_masks=masks)
    plain = StackedTransformer(ModelConfig(**TINY_CONFIG, pe="sin1d"), [1, 2], [None, None])
    with pytest.raises(ValueError, match="pe_dropout_masks given to a model without PE dropout"):
        plain(tokens, pe_dropout_masks=torch.ones(1, 2, 3, 4, 8))


def test_a_model_beyond_the_memory_free_now_is_named_before_any_weight_is_drawn(monkeypatch):
    """ModelConfig(width=2**40) and a StackedLinear of 2**30 × 2**30 reached torch's allocator and its RuntimeError
    ("can't allocate ...") (issue 55): the weights' size is checked against the memory free now first."""
    import pe_fast.nn
    from pe_fast.nn import StackedLinear
    monkeypatch.setattr(pe_fast.nn, "available_bytes", lambda: 2**30)
    with pytest.raises(ValueError, match="ModelConfig width=65,536, .*more than the memory free now \\(1 GiB\\)"):
        StackedTransformer(ModelConfig(**{**TINY_CONFIG, "width": 2**16, "heads": 1}), [1], [0.1])
    with pytest.raises(ValueError, match="StackedLinear d_in=65,536, d_out=65,536 for 1 models"):
        StackedLinear([torch.Generator()], 2**16, 2**16)
    StackedTransformer(ModelConfig(**TINY_CONFIG), [1], [0.1])  # a small one fits


def test_a_state_dict_of_another_pe_kind_or_positions_is_refused():
    """A sin1d model's state dict loaded into a sinnd model without a word and made it the sin1d model (round 17):
    the tables a model computes from its configuration must be its own; its own state dict loads."""
    coordinates = np.random.default_rng(0).random((TINY_CONFIG["num_tokens"], 3)) * 50
    sinnd = StackedTransformer(ModelConfig(**{**TINY_CONFIG, "pe": "sinnd"}), [0], [None], coordinates)
    sin1d = StackedTransformer(ModelConfig(**{**TINY_CONFIG, "pe": "sin1d"}), [0], [None], coordinates)
    with pytest.raises(ValueError, match=r"state_dict\['absolute.fixed'\] is not this module's"):
        sinnd.load_state_dict(sin1d.state_dict())
    moved = StackedTransformer(ModelConfig(**{**TINY_CONFIG, "pe": "sinnd"}), [0], [None], coordinates + 10)
    with pytest.raises(ValueError, match="other token positions"):
        sinnd.load_state_dict(moved.state_dict())
    sinnd.load_state_dict(StackedTransformer(ModelConfig(**{**TINY_CONFIG, "pe": "sinnd"}), [1], [None],
                                             coordinates).state_dict())


def test_fixed_tables_stay_fixed_and_every_load_is_checked():
    """Round 18: a parameter assigned in place of a fixed table became a trained weight; a model built on meta (to
    be assigned) failed on its tables' comparison; a load into a submodule (model.absolute) or into the single
    model (pe_fast.models.single) skipped every check."""
    from pe_fast.models.single import SingleTransformer
    coordinates = np.random.default_rng(0).random((TINY_CONFIG["num_tokens"], 3)) * 50
    config = ModelConfig(**{**TINY_CONFIG, "pe": "sin1d"})
    model = StackedTransformer(config, [0], [None], coordinates)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"state_dict\['absolute.fixed'\] is a parameter, where this module holds"):
        model.load_state_dict({**state, "absolute.fixed": torch.nn.Parameter(state["absolute.fixed"])}, assign=True)
    with torch.device("meta"):
        on_meta = StackedTransformer(config, [0], [None], coordinates)
    on_meta.load_state_dict(state, assign=True)
    torch.testing.assert_close(on_meta.absolute.fixed, model.absolute.fixed, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"state_dict\['fixed'\] is not this module's"):
        model.absolute.load_state_dict({"fixed": torch.zeros_like(state["absolute.fixed"])})
    single = SingleTransformer(model, 0)
    mine = single.state_dict()
    with pytest.raises(ValueError, match=r"state_dict\['pos_embed.0'\] is not this module's"):
        single.load_state_dict({**mine, "pos_embed.0": torch.zeros_like(mine["pos_embed.0"])})
    with pytest.raises(TypeError, match=r"state_dict\['embed.weight'\] is torch.float64"):
        single.load_state_dict({**mine, "embed.weight": mine["embed.weight"].double()})
    single.load_state_dict(mine)
