"""The empirical tangent kernel (pe_fast.metrics.tangent_kernel) against a Jacobian built column by column: the
forward-mode derivative along each parameter of one model taken out of the pack as a plain module (models/single.py, no
model axis, no fused op), in float64; its distance, velocity and alignment against their closed forms."""
import pytest
import torch
from torch.func import functional_call, jacfwd

from pe_fast.metrics.tangent_kernel import (TangentKernelProbe, kernel_distance, output_projection, target_alignment,
                                            target_direction, tangent_kernels)
from pe_fast.models import ModelConfig, StackedTransformer
from pe_fast.models.single import SingleTransformer
from pe_fast.tasks.base import per_model_cross_entropy

CONFIG = ModelConfig(num_tokens=5, token_dim=3, out_dim=2, width=8, depth=2, heads=2, mlp_width=12, pe="learned",
                     backend="reference")


def pack_and_items(config=CONFIG, seeds=(1, 2), sigmas=(0.05, 2.0)):
    model = StackedTransformer(config, list(seeds), list(sigmas)).double()
    tokens = torch.randn(3, config.num_tokens, config.token_dim, generator=torch.Generator().manual_seed(7),
                         dtype=torch.float64)
    return model, tokens


def jacobian_column_by_column(pack, index: int, tokens, projection):
    """Model `index`'s J [items·O, parameters] in forward mode (a column per parameter: jacfwd's tangents are the
    parameters' unit vectors), and which columns are the PE's."""
    single = SingleTransformer(pack, index).double()
    params = {name: p.detach() for name, p in single.named_parameters()}

    def projected(values):
        outputs = functional_call(single, values, (tokens,))
        return (outputs.reshape(len(tokens), -1) @ projection.T).reshape(-1)

    per_tensor = jacfwd(projected)(params)
    jacobian = torch.cat([per_tensor[name].reshape(-1, value.numel()) for name, value in params.items()], dim=1)
    is_pe = torch.cat([torch.full((value.numel(),), name.startswith("pos_embed.")) for name, value in params.items()])
    return jacobian, is_pe


@pytest.mark.parametrize("config", [CONFIG, ModelConfig(num_tokens=5, token_dim=3, out_dim=4, width=8, depth=1,
                                                        heads=1, mlp_width=8, pe="learned", pe_at="input",
                                                        readout_token=0, backend="reference")],
                         ids=["every-token", "read-out"])
def test_the_packed_kernel_equals_a_jacobian_built_column_by_column(config):
    model, tokens = pack_and_items(config)
    out_size = config.out_dim * (1 if config.readout_token is not None else config.num_tokens)
    projection = output_projection(out_size, torch.float64, tokens.device)
    kernels = tangent_kernels(model, tokens, None, projection)
    for m in range(model.num_models):
        jacobian, is_pe = jacobian_column_by_column(model, m, tokens, projection)
        assert is_pe.sum() == sum(p[m].numel() for p in model.absolute.parameters()) > 0
        for kind, columns in (("all", slice(None)), ("pe", is_pe)):
            expected = jacobian[:, columns] @ jacobian[:, columns].T
            assert kernels[kind][m].shape == expected.shape == (len(tokens) * 4,) * 2
            torch.testing.assert_close(kernels[kind][m], expected, rtol=1e-10, atol=1e-10 * expected.abs().max())


def test_kernel_distance_is_zero_for_an_untrained_model_and_grows_with_training():
    readout = ModelConfig(**{**CONFIG.__dict__, "readout_token": 0})  # [M, items, 2] logits: a classification
    model, tokens = pack_and_items(readout)
    targets = torch.tensor([0, 1, 1]).expand(2, -1)

    class Task:
        loss = staticmethod(per_model_cross_entropy)

    probe = TangentKernelProbe(model, Task, tokens, targets, None)
    # a second pack from the same seeds has the same kernel: distance 0, and no velocity yet
    twin, _ = pack_and_items(readout)
    rows = probe.measure(twin, step=0)
    # 0 up to float64 rounding of 1 − cos: the sums' order, and so their last bit, follows the CPU's vector width
    assert all(abs(row["ntk_distance"]) < 1e-12 and abs(row["ntk_pe_distance"]) < 1e-12 for row in rows)
    assert all(row["ntk_velocity"] != row["ntk_velocity"] for row in rows)  # NaN
    optimizer = torch.optim.SGD(twin.parameters(), lr=0.5)
    for _ in range(5):
        optimizer.zero_grad()
        per_model_cross_entropy(twin(tokens.expand(2, *tokens.shape))[0], targets).sum().backward()
        optimizer.step()
    later = probe.measure(twin, step=5)
    assert all(row["ntk_distance"] > 1e-6 and row["ntk_pe_distance"] > 1e-10 for row in later)
    # the velocity from step 0 to 5 is the distance from the step-0 kernel, per 1,000 steps
    for row in later:
        assert row["ntk_velocity"] == pytest.approx(row["ntk_distance"] * 1000 / 5, rel=1e-9)


def test_distance_and_alignment_against_their_closed_forms():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 6, 6, generator=g, dtype=torch.float64)
    a = a @ a.transpose(1, 2)
    # the same kernel scaled is distance 0; orthogonal (in the Frobenius sense) kernels are distance 1
    assert kernel_distance(a, 3.0 * a).tolist() == pytest.approx([0.0, 0.0], abs=1e-12)
    e1, e2 = torch.zeros(1, 2, 2, dtype=torch.float64), torch.zeros(1, 2, 2, dtype=torch.float64)
    e1[0, 0, 0], e2[0, 1, 1] = 1.0, 1.0
    assert kernel_distance(e1, e2).item() == pytest.approx(1.0)
    # Θ = y yᵀ aligns perfectly with y; written out for a generic kernel
    y = torch.randn(2, 6, generator=g, dtype=torch.float64)
    assert target_alignment(y[:, :, None] * y[:, None, :], y).tolist() == pytest.approx([1.0, 1.0], rel=1e-12)
    expected = [float(y[m] @ a[m] @ y[m] / (torch.linalg.matrix_norm(a[m]) * (y[m] ** 2).sum())) for m in range(2)]
    assert target_alignment(a, y).tolist() == pytest.approx(expected, rel=1e-12)


def test_the_target_direction_is_the_masked_values_and_the_centred_one_hot():
    from pe_fast.tasks.masked_regions import MaskedRegionTask
    values = torch.randn(2, 3, 4, 1, dtype=torch.float64)
    mask = torch.tensor([[True, False, False, True]] * 3).expand(2, 3, 4)
    masked = type("Task", (), {"loss": staticmethod(lambda outputs, t: MaskedRegionTask.loss(None, outputs, t))})
    direction = target_direction(masked, (2, 3, 4, 1), (values, mask), torch.float64, values.device)
    # the squared error's gradient at zero: 2 · values on the masked tokens / the masked count, 0 elsewhere
    torch.testing.assert_close(direction, 2 * values * mask[..., None] / 6)
    labels = torch.tensor([[0, 2], [1, 1]])
    direction = target_direction(type("Task", (), {"loss": staticmethod(per_model_cross_entropy)}), (2, 2, 3),
                                 labels, torch.float64, labels.device)
    torch.testing.assert_close(direction, (torch.nn.functional.one_hot(labels, 3).double() - 1 / 3) / 2)
