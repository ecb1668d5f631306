"""The stacked transformer: a pack of M models with one architecture, different seeds, σ and PE values.

Post-LN blocks as in the authors' LST model: h = LN0(Attn(x + pe) + x + pe); out = LN1(MLP(h) + h), with the
MLP Linear -> GELU -> Linear -> GELU (their GELU after both linears). The PE is added at the input of every
block (a separate learned PE per block) or of the first block only.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import numbers
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from pe_fast.data.regions import MAX_COORDINATE_MM
from pe_fast.models.absolute_pe import ADDITIVE_PES, AbsolutePE
from pe_fast.nn import (CheckedModule, PEAttention, StackedLayerNorm, StackedLinear, check_fits, check_sizes,
                        scale_to_fan_in_power)
from pe_fast.ops import sublayer_ends
from pe_fast.ops.backends import BACKENDS
from pe_fast.ops.transforms import is_traced
from pe_fast.models.relative_pe import RelativePE
from pe_fast.models.rotary_pe import RotaryPE
from pe_fast.seeds import PE_SEED_OFFSET

ABSOLUTE_PES = ("learned", "random", "sin1d", "sin2d", "sinnd", "none")
ROTARY_PES = ("rope", "rope2d")
PE_KINDS = ABSOLUTE_PES + ROTARY_PES + ("relative",)
# The compute path "fused": each block's attention and MLP sublayer one Triton kernel where it can
# (pe_fast.ops.fused_attention_sublayer and fused_mlp_sublayer), the attention op's "triton" backend where it cannot
FUSED = "fused"


def compute_paths() -> tuple[str, ...]:
    """The compute paths a model can take here: the pe_attention backends registered, and "fused" with Triton."""
    return (*BACKENDS, *((FUSED,) if importlib.util.find_spec("triton") is not None else ()))


def compute_path_problem(path: str, device_type: str) -> str | None:
    """Why a model on this kind of device cannot take the compute path (one of compute_paths()), or None. FUSED
    runs where the op's triton backend does (its fallback)."""
    devices = BACKENDS["triton" if path == FUSED else path].devices
    if device_type not in devices:
        return f"runs on {' and '.join(devices)} tensors only, not {device_type}"
    return None


SIZES = ("num_tokens", "token_dim", "out_dim", "width", "depth", "heads", "mlp_width")  # each a whole number ≥ 1


MIN_SIGMA = 1e-15     # σ² well above float32's smallest normal number: the PE's geometry stays measurable
MAX_SIGMA = 1e6       # σ·N(0,1) stays far inside float32, and its square too
MAX_INIT_GAMMA = 4.0  # std fan_in^-4: past the phase diagram of Zhang et al. (γ ≤ 1.5), still a float32 normal


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    num_tokens: int
    token_dim: int
    out_dim: int
    width: int = 160
    depth: int = 4
    heads: int = 1
    mlp_width: int = 640
    pe: str = "learned"
    pe_at: str = "every"  # "every" block or the "input" of the first block only
    readout_token: int | None = None  # classify from this token; None: predict at every token
    pe_dropout: float = 0.0  # dropout on x + PE at each block while training (the authors' sinusoidal PEs')
    # the compute path (compute_paths): a pe_attention backend for every block, or FUSED; None: the op's default
    # for the device the model runs on (cpp on the CPU once built, triton on CUDA)
    backend: str | None = None

    def __post_init__(self):
        check_sizes(**{name: getattr(self, name) for name in SIZES})
        if self.readout_token is not None and not (
                isinstance(self.readout_token, numbers.Integral) and not isinstance(self.readout_token, bool)
                and 0 <= self.readout_token < self.num_tokens):
            raise ValueError(f"readout_token must be None or a token index from 0 to num_tokens - 1 = "
                             f"{self.num_tokens - 1}, got {self.readout_token!r}")
        if self.pe not in PE_KINDS:
            raise ValueError(f"unknown PE {self.pe!r}; choose from {', '.join(PE_KINDS)}")
        if self.pe_at not in ("every", "input"):
            raise ValueError(f"pe_at must be 'every' or 'input', got {self.pe_at!r}")
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not divisible by heads {self.heads}")
        if not (isinstance(self.pe_dropout, numbers.Real) and not isinstance(self.pe_dropout, bool)
                and 0 <= self.pe_dropout < 1):
            raise ValueError(f"pe_dropout must be a number in [0, 1), got {self.pe_dropout!r:.40}")
        if self.pe_dropout and self.pe not in ADDITIVE_PES:
            raise ValueError(f"pe_dropout applies to the PEs added to x ({', '.join(ADDITIVE_PES)}), "
                             f"not to {self.pe!r}")
        if self.backend is not None and self.backend not in compute_paths():
            raise ValueError(f"backend must be one of {', '.join(compute_paths())} or None, got {self.backend!r}")


class Block(CheckedModule):
    def __init__(self, generators: Sequence[torch.Generator], config: ModelConfig):
        super().__init__()
        M, D = len(generators), config.width
        # the fused sublayer ops on the compute path FUSED, chosen here once
        self.fused_attention = self.fused_mlp = None
        if config.backend == FUSED:
            from pe_fast.ops import fused_attention_sublayer, fused_mlp_sublayer  # need triton (compute_paths)
            self.fused_attention, self.fused_mlp = fused_attention_sublayer, fused_mlp_sublayer
        self.attention = PEAttention(D, config.heads, M, generators=generators,
                                     backend="triton" if config.backend == FUSED else config.backend)
        self.norm_attn = StackedLayerNorm(M, D)
        self.mlp_in = StackedLinear(generators, D, config.mlp_width)
        self.mlp_out = StackedLinear(generators, config.mlp_width, D)
        self.norm_mlp = StackedLayerNorm(M, D)

    def forward(self, h, pe, probes, rope, bias, only_token: int | None = None, pe_dropout_mask=None,
                rows: Tensor | None = None):
        """only_token: compute the block's output at this token alone (the last block of a model that reads
        out one token: every token still serves as a key, but the other tokens' outputs are never used).
        rows [M,B,K]: the block's output at these tokens of each item alone, [M,B,K,D]: the attention at every
        query (every token is a key, and the statistics cover every query), the output projection, its layer norm
        and the MLP sublayer at these tokens only.
        pe_dropout_mask [M,B,N,D]: the block works on (h + pe) · mask, as the authors' sinusoidal PE modules do
        (it then goes through the attention as one input, without the op's separate PE path)."""
        fused_attention, fused_mlp = self.fused_attention, self.fused_mlp
        attention, norm_attn, norm_mlp = self.attention, self.norm_attn, self.norm_mlp
        if fused_attention is not None and fused_attention.takes_attention(h, rope, bias, pe_dropout_mask):
            h, stats = fused_attention.attention_forward(
                h, pe, probes, only_token, attention.w_qkv, attention.b_qkv, attention.out.weight,
                attention.out.bias, norm_attn.weight, norm_attn.bias, attention.num_heads, norm_attn.eps)
            if rows is not None:
                h = at_tokens(h, rows)
        else:
            h, stats = self.attention_sublayer(h, pe, probes, rope, bias, only_token, pe_dropout_mask, rows)
        if fused_mlp is not None and fused_mlp.takes_mlp(h):
            return fused_mlp.mlp_forward(h, self.mlp_in.weight, self.mlp_in.bias, self.mlp_out.weight,
                                     self.mlp_out.bias, norm_mlp.weight, norm_mlp.bias, norm_mlp.eps), stats
        h = self.norm_mlp(self.mlp_out(self.mlp_in(h, gelu=True), gelu=True), residual=h)
        return h, stats

    def attention_sublayer(self, h, pe, probes, rope, bias, only_token, pe_dropout_mask, rows=None):
        """LN0(Attn(h + pe) + h + pe) and the attention statistics, through the fused op (and on the CPU, the C++
        sublayer end for the rest); with rows, the output projection and layer norm at those tokens alone."""
        if pe_dropout_mask is not None:
            h, pe = (h + pe[:, None]) * pe_dropout_mask, None
        out, stats = self.attention.attend(h, pe, probes, rope=rope, bias=bias, only_token=only_token)
        if only_token is not None:
            h = h[:, :, only_token:only_token + 1]
            pe = None if pe is None else pe[:, only_token:only_token + 1]
        if rows is not None:  # the residual h + pe gathered whole: each item has its own tokens
            out = at_tokens(out, rows)
            h, pe = at_tokens(h if pe is None else h + pe[:, None], rows), None
        projection = self.attention.out
        if sublayer_ends.fusable(out, h, pe, projection.bias):
            # one pass for the projection's bias, the residual, the PE, the layer norm and its scale
            add = projection.bias[:, None] if pe is None else pe + projection.bias[:, None]
            return self.norm_attn(projection(out, add_bias=False), residual=h, add=add), stats
        # CUDA, bf16, traced: torch's ops
        return self.norm_attn(projection(out) + (h if pe is None else h + pe[:, None])), stats


def check_output_tokens(rows, tokens: Tensor, config: ModelConfig):
    """output_tokens [M,B,K] of token indices in [0, N): at_tokens adds each item's offset, so token N was the next
    item's first (another model's, at an item's end) and -1 the previous item's last, without a word."""
    if config.readout_token is not None:
        raise ValueError("output_tokens: a model that reads out one token (readout_token) has one output")
    if not isinstance(rows, Tensor) or rows.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"output_tokens must be an int64 or int32 tensor of token indices, got "
                        f"{rows.dtype if isinstance(rows, Tensor) else type(rows).__name__}")
    M, B, N = tokens.shape[:3]
    if rows.dim() != 3 or tuple(rows.shape[:2]) != (M, B) or rows.device != tokens.device:
        raise ValueError(f"output_tokens must be [M, B, K] = [{M}, {B}, K] on {tokens.device}, got "
                         f"{list(rows.shape)} on {rows.device}")
    if rows.shape[2] == 0:
        raise ValueError("output_tokens names no token (K = 0): name at least one per item, or leave it None")
    if not is_traced(rows) and not bool(((rows >= 0) & (rows < N)).all()):
        raise ValueError(f"output_tokens holds an index outside the {N} tokens (0 to {N - 1})")


def check_coordinates(coordinates, num_tokens: int) -> None:
    """The tokens' coordinates [num_tokens, k ≥ 1], finite real numbers, or a ValueError naming them (NaN ones made
    every output NaN; a wrong row count failed at the first forward, naming the PE)."""
    if np.iscomplexobj(coordinates):  # float64 would drop the imaginary part, with numpy's warning
        raise ValueError("coordinates must be real numbers, got complex ones")
    try:
        values = np.asarray(coordinates, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"coordinates must be an array of numbers [num_tokens, k], got {coordinates!r:.40}") from None
    if values.ndim != 2 or values.shape[0] != num_tokens or values.shape[1] < 1:
        raise ValueError(f"coordinates must be [num_tokens, k] = [{num_tokens}, k ≥ 1], got {list(values.shape)}")
    if not np.isfinite(values).all():
        raise ValueError("coordinates hold NaN or ±inf: give each token's finite position")
    # as a regions table's: beyond, the rotary tables' angles pass float32 (NaN tables) and the relative PE's
    # integer offsets int64
    if np.abs(values).max() > MAX_COORDINATE_MM:
        raise ValueError(f"coordinates hold values beyond ±{MAX_COORDINATE_MM:,.0f}: give positions in tokens' units "
                         f"(grid steps, mm)")


def as_items(name: str, values) -> list:
    """A sequence argument as a list of Python or NumPy numbers (a tensor's as Python numbers), or TypeError."""
    if isinstance(values, Tensor):
        values = values.tolist()
    elif isinstance(values, np.ndarray):
        values = list(values)
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence (one per model), got {type(values).__name__}")
    return list(values)


def at_tokens(x: Tensor, rows: Tensor) -> Tensor:
    """x [M,B,N,D] at the tokens rows [M,B,K] of each item: [M,B,K,D]. Whole rows of x seen as [M·B·N, D]: on the
    CPU index_select copies a row per index, 2.5× faster forward and backward than gather's index per element."""
    M, B, N, D = x.shape
    offsets = torch.arange(0, M * B * N, N, device=rows.device).view(M, B, 1)  # item (m, b)'s first row
    return x.reshape(M * B * N, D).index_select(0, (rows + offsets).reshape(-1)).view(*rows.shape, D)


class StackedTransformer(CheckedModule):
    """M models in one module. forward(tokens [M,B,N,token_dim]) -> (outputs, stats [L,M,H,S])."""

    def __init__(self, config: ModelConfig, seeds: Sequence[int], sigmas: Sequence[float | None],
                 coordinates: np.ndarray | None = None, init_gammas: Sequence[float | None] | None = None):
        """sigmas: each model's σ of its N(0, σ²) PE (learned and random PEs); None for a PE without one.
        init_gammas: each model's γ (None: the default initialisation), whose embedding, attention and MLP weights
        then start with std fan_in^-γ; the readout head, biases, norms and the PE (σ) keep theirs."""
        super().__init__()
        # a list, tuple, range, NumPy array or tensor of them: each item a number of its own
        seeds, sigmas = (as_items(name, value) for name, value in (("seeds", seeds), ("sigmas", sigmas)))
        if not seeds or len(sigmas) != len(seeds):
            raise ValueError(f"seeds and sigmas: one seed and one σ per model, at least one model; got {len(seeds)} "
                             f"seeds and {len(sigmas)} σ")
        # int() would take 1.5 as 1: another model's weights; below 2**63, so that with its streams' offsets
        # (pe_fast.seeds) it stays a torch seed
        for seed in seeds:
            if not isinstance(seed, numbers.Integral) or isinstance(seed, (bool, np.bool_)) or not 0 <= seed < 2**63:
                raise ValueError(f"seeds: {seed!r} is not a whole number from 0 to 2**63 - 1")
        # beyond, the PE table is inf, or 0 and without geometry; compared as a Python float: in float16, 1e6 was
        # inf and 1e-8 was 0, and the bounds passed
        for sigma in sigmas:
            if sigma is not None and not (isinstance(sigma, numbers.Real) and not isinstance(sigma, (bool, np.bool_))
                                          and MIN_SIGMA <= float(sigma) <= MAX_SIGMA):
                raise ValueError(f"sigmas: {sigma!r} is not a σ in [{MIN_SIGMA:g}, {MAX_SIGMA:g}] (or None)")
        if coordinates is not None:
            check_coordinates(coordinates, config.num_tokens)
        D, F = config.width, config.mlp_width  # the pack's weights, before any is drawn
        per_model = (config.token_dim + 1) * D + config.depth * (4 * D * D + 2 * D * F + F + 9 * D) \
            + (D + 1) * config.out_dim + config.depth * config.num_tokens * D
        check_fits(f"ModelConfig width={D:,}, mlp_width={F:,}, depth={config.depth:,}, num_tokens="
                   f"{config.num_tokens:,}", len(seeds) * per_model)
        self.config, self.seeds = config, list(seeds)
        self.sigmas = [None if s is None else float(s) for s in sigmas]
        generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.embed = StackedLinear(generators, config.token_dim, config.width)
        self.blocks = nn.ModuleList(Block(generators, config) for _ in range(config.depth))
        self.head = StackedLinear(generators, config.width, config.out_dim)
        if init_gammas is not None:
            init_gammas = as_items("init_gammas", init_gammas)
            # beyond, fan_in^-γ overflows (γ = -1000) or its weights are all 0 (γ = 1e6)
            if len(init_gammas) != len(seeds) or not all(
                    gamma is None or (isinstance(gamma, numbers.Real) and not isinstance(gamma, (bool, np.bool_))
                                      and 0 <= gamma <= MAX_INIT_GAMMA) for gamma in init_gammas):
                raise ValueError(f"init_gammas: one γ in [0, {MAX_INIT_GAMMA:g}] (or None) per model, got "
                                 f"{init_gammas!r:.60}")
            for weight, drawn_std in self.gamma_scaled_weights():
                scale_to_fan_in_power(weight, drawn_std, init_gammas)
        M, head_dim = len(seeds), config.width // config.heads
        pe_blocks = config.depth if config.pe_at == "every" else 1
        self.absolute = self.rotary = self.relative = None
        if config.pe in ABSOLUTE_PES:
            pe_generators = [torch.Generator().manual_seed(int(s) + PE_SEED_OFFSET) for s in seeds]
            self.absolute = AbsolutePE(config.pe, pe_generators, self.sigmas, config.num_tokens, config.width,
                                       pe_blocks, coordinates)
        elif config.pe in ROTARY_PES:
            self.rotary = RotaryPE(config.pe, config.num_tokens, head_dim, coordinates)
        else:
            self.relative = RelativePE(M, pe_blocks, config.heads, config.num_tokens, coordinates)

    def gamma_scaled_weights(self) -> list[tuple[Tensor, float]]:
        """The weights init_gammas rescales, each with the std it was drawn with: the embedding, and every
        block's QKV, attention output and MLP matrices."""
        weights = [(self.embed.weight, self.embed.drawn_std)]
        for block in self.blocks:
            weights.append((block.attention.w_qkv, block.attention.qkv_drawn_std))
            weights.extend((layer.weight, layer.drawn_std)
                           for layer in (block.attention.out, block.mlp_in, block.mlp_out) if layer is not None)
        return weights

    @property
    def num_models(self) -> int:
        return len(self.seeds)

    def pe_tables(self) -> list[Tensor]:
        """The additive PE tables [M,N,D] in block order (empty for rotary, relative and none)."""
        return [] if self.absolute is None else self.absolute.values()

    def check_pe_dropout_masks(self, masks, tokens: Tensor) -> None:
        """PE dropout's keep masks [blocks with a PE, M, B, N, width] (PEDropout.masks), for a model that drops its PE
        out, on the tokens' device in the weights' dtype; a ValueError / TypeError naming them otherwise (they were
        indexed as given: an IndexError, a broadcast, or ignored without a word). Their values are PEDropout's."""
        c = self.config
        if not (c.pe_dropout and self.absolute is not None):
            raise ValueError(f"pe_dropout_masks given to a model without PE dropout (pe {c.pe!r}, pe_dropout "
                             f"{c.pe_dropout}): give None")
        wanted = (self.absolute.num_blocks, len(self.seeds), tokens.shape[1], c.num_tokens, c.width)
        if not isinstance(masks, Tensor) or tuple(masks.shape) != wanted:
            raise ValueError(f"pe_dropout_masks must be [blocks, M, B, N, width] = {list(wanted)}, got "
                             f"{list(masks.shape) if isinstance(masks, Tensor) else type(masks).__name__}")
        if masks.device != tokens.device or masks.dtype != self.embed.weight.dtype:
            raise TypeError(f"pe_dropout_masks are {masks.dtype} on {masks.device}: give "
                            f"{self.embed.weight.dtype} on {tokens.device}, as the model's weights and the tokens")

    def forward(self, tokens: Tensor, probes: Tensor | None = None, pe_dropout_masks: Tensor | None = None,
                output_tokens: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """pe_dropout_masks [blocks with a PE, M, B, N, D]: training with config.pe_dropout (PEDropout.masks).
        output_tokens [M,B,K] (models that predict at every token): the outputs at these tokens alone,
        [M,B,K,out], the last block's MLP sublayer and the head computed there only: a training loss that reads K
        of the N tokens (the masked-token tasks) needs no more."""
        c, M = self.config, len(self.seeds)
        if not isinstance(tokens, Tensor) or tokens.dim() != 4 or tokens.shape[0] != M or tuple(tokens.shape[2:]) != (
                c.num_tokens, c.token_dim):
            raise ValueError(f"tokens must be [M, B, N, token_dim] = [{M}, B, {c.num_tokens}, {c.token_dim}], got "
                             f"{list(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__}")
        weight = self.embed.weight
        if tokens.device != weight.device:
            raise ValueError(f"tokens are on {tokens.device}, the model on {weight.device}: move one to the other")
        if tokens.dtype != weight.dtype and not sublayer_ends.autocasting(tokens.device):
            raise TypeError(f"tokens are {tokens.dtype}, the model's weights {weight.dtype}: give tokens in their "
                            f"dtype (or run under torch.autocast)")
        if output_tokens is not None:
            check_output_tokens(output_tokens, tokens, self.config)
        if pe_dropout_masks is not None:
            self.check_pe_dropout_masks(pe_dropout_masks, tokens)
        h = self.embed(tokens)
        rope = self.rotary.tables() if self.rotary is not None else None
        all_stats = []
        for index, block in enumerate(self.blocks):
            pe = self.absolute.at_block(index) if self.absolute is not None else None
            bias = None
            if self.relative is not None and (index == 0 or self.config.pe_at == "every"):
                bias = self.relative.bias(index)
            last = index == len(self.blocks) - 1
            mask = pe_dropout_masks[index] if pe_dropout_masks is not None and pe is not None else None
            h, stats = block(h, pe, probes, rope, bias, self.config.readout_token if last else None, mask,
                             output_tokens if last else None)
            all_stats.append(stats)
        if self.config.readout_token is not None:
            h = h[:, :, 0]  # the last block kept the readout token only
        return self.head(h), torch.stack(all_stats)
