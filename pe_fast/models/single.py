"""One model of a pack as a plain torch module, to read and to probe: nn.Linear, nn.LayerNorm and an attention
written out in a few lines, no model axis, no fused op. Its forward is the stacked transformer's for that model
(transformer.py: post-LN blocks, h = LN(Attn(x + pe) + x + pe), out = LN(GELU(GELU(h W1) W2) + h)), and it has
hook points named in TransformerLens's convention, so that a value can be read (run_with_cache) or replaced
(run_with_hooks) on the way:

    hook_embed                      [B, N, D]  the embedded tokens
    blocks.{l}.hook_resid_pre       [B, N, D]  the block's input
    blocks.{l}.hook_pos_embed       [B, N, D]  the PE added at this block (blocks that add one)
    blocks.{l}.attn.hook_q / _k / _v  [B, N, H, dh]  before RoPE, where the PE is rotary
    blocks.{l}.attn.hook_attn_scores  [B, H, N, N]  the logits, PE bias included
    blocks.{l}.attn.hook_pattern    [B, H, N, N]  the attention probabilities (query, key)
    blocks.{l}.attn.hook_z          [B, N, H, dh]  each head's output, before the output projection
    blocks.{l}.hook_attn_out        [B, N, D]  the attention sublayer's output
    blocks.{l}.hook_resid_mid       [B, N, D]  after the attention's residual add and layer norm
    blocks.{l}.mlp.hook_pre / hook_post  [B, N, mlp]  the first linear layer, before / after its GELU
    blocks.{l}.hook_mlp_out         [B, N, D]  the MLP's output
    blocks.{l}.hook_resid_post      [B, N, D]  the block's output (after the MLP's residual add and layer norm)

Unlike TransformerLens's pre-LN models, the residual stream here is normalised after each sublayer (the authors'
architecture): resid_mid and resid_post are the layer norms' outputs.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_fast.models.absolute_pe import SINUSOIDAL_PES
from pe_fast.models.transformer import ModelConfig, StackedTransformer
from pe_fast.nn import CheckedModule

HookFunction = Callable[[Tensor, "HookPoint"], Tensor | None]


class HookPoint(nn.Module):
    """A named place in the forward: returns its input, or what a hook put in its place. A hooked point hands its
    hooks a copy, which they may edit in place (`value[..., 0] = 0`) with gradients on: the input itself may be a
    view (of q, k, v split, of a parameter broadcast) or saved for the backward (the softmax's output)."""

    def __init__(self):
        super().__init__()
        self.name = ""

    def forward(self, x: Tensor) -> Tensor:
        return x.clone() if self._forward_hooks else x


def rotate_pairs(t: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on [B, N, H, dh]: each pair (2i, 2i+1) of a token turned by its angle (cos, sin: [N, dh/2])."""
    cos, sin = cos[:, None], sin[:, None]
    even, odd = t[..., 0::2], t[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class Attention(CheckedModule):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)  # output columns: q, k, v, each heads × head dim
        self.out = nn.Linear(width, width)
        for name in ("q", "k", "v", "attn_scores", "pattern", "z"):
            setattr(self, f"hook_{name}", HookPoint())

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None, bias: Tensor | None) -> Tensor:
        B, N, D = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, D // self.heads).unbind(2)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        if rope is not None:
            q, k = rotate_pairs(q, *rope), rotate_pairs(k, *rope)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D // self.heads)
        if bias is not None:
            scores = scores + bias
        pattern = self.hook_pattern(torch.softmax(self.hook_attn_scores(scores), dim=-1))
        z = self.hook_z(torch.einsum("bhqk,bkhd->bqhd", pattern, v))
        return self.out(z.reshape(B, N, D))


class MLP(CheckedModule):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc_in, self.fc_out = nn.Linear(width, hidden), nn.Linear(hidden, width)
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.fc_out(self.hook_post(F.gelu(self.hook_pre(self.fc_in(x))))))


class Block(CheckedModule):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn, self.mlp = Attention(config.width, config.heads), MLP(config.width, config.mlp_width)
        self.ln_attn, self.ln_mlp = nn.LayerNorm(config.width), nn.LayerNorm(config.width)
        for name in ("resid_pre", "pos_embed", "attn_out", "resid_mid", "mlp_out", "resid_post"):
            setattr(self, f"hook_{name}", HookPoint())

    def forward(self, h: Tensor, pe: Tensor | None, rope, bias) -> Tensor:
        h = self.hook_resid_pre(h)
        if pe is not None:
            h = h + self.hook_pos_embed(pe.expand_as(h))
        mid = self.hook_resid_mid(self.ln_attn(self.hook_attn_out(self.attn(h, rope, bias)) + h))
        return self.hook_resid_post(self.ln_mlp(self.hook_mlp_out(self.mlp(mid)) + mid))


class SingleTransformer(CheckedModule):
    """Model `index` of a StackedTransformer, alone: forward(tokens [B, N, token_dim]) -> [B, out_dim] (a task that
    reads out one token) or [B, N, out_dim]. Its PE: `pos_embed.{l}` [N, D] (learned: parameters; fixed PEs:
    buffers), `rope_cos` / `rope_sin`, or `relative_bias[l]` [H, offsets] with `relative_index` [N, N]."""

    def __init__(self, pack: StackedTransformer, index: int):
        super().__init__()
        config = self.config = pack.config
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):  # True, 1.0, "0": which model?
            raise TypeError(f"index: a model's place in the pack, an int, got {index!r:.40}")
        if not 0 <= index < pack.num_models:
            raise ValueError(f"index {index}: not a model of a pack of {pack.num_models} (0 to "
                             f"{pack.num_models - 1})")
        index = int(index)
        self.seed, self.sigma = pack.seeds[index], pack.sigmas[index]
        self.embed, self.head = nn.Linear(config.token_dim, config.width), nn.Linear(config.width, config.out_dim)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.depth))
        self.hook_embed = HookPoint()
        self.pe_blocks, self.relative_bias, self.pe_off = 0, None, False
        with torch.no_grad():
            copy_linear(self.embed, pack.embed, index)
            copy_linear(self.head, pack.head, index)
            for mine, theirs in zip(self.blocks, pack.blocks):
                mine.attn.qkv.weight.copy_(theirs.attention.w_qkv[index].T)
                mine.attn.qkv.bias.copy_(theirs.attention.b_qkv[index])
                copy_linear(mine.attn.out, theirs.attention.out, index)
                copy_linear(mine.mlp.fc_in, theirs.mlp_in, index)
                copy_linear(mine.mlp.fc_out, theirs.mlp_out, index)
                for norm, stacked in ((mine.ln_attn, theirs.norm_attn), (mine.ln_mlp, theirs.norm_mlp)):
                    norm.weight.copy_(stacked.weight[index])
                    norm.bias.copy_(stacked.bias[index])
                    norm.eps = stacked.eps
        if pack.absolute is not None:
            tables = [t[index].detach().clone() for t in pack.absolute.values()]
            self.pe_blocks = len(tables)
            if config.pe == "learned":
                self.pos_embed = nn.ParameterList(nn.Parameter(t) for t in tables)
            else:  # fixed: buffers under the same names, pos_embed.{l}
                self.pos_embed = nn.Module()
                for block, table in enumerate(tables):
                    self.pos_embed.register_buffer(str(block), table)
        cos, sin = pack.rotary.tables() if pack.rotary is not None else (None, None)
        self.register_buffer("rope_cos", None if cos is None else cos.detach().clone())
        self.register_buffer("rope_sin", None if sin is None else sin.detach().clone())
        if pack.relative is not None:
            self.relative_bias = nn.ParameterList(nn.Parameter(t[index].detach().clone())
                                                  for t in pack.relative.tables)
            self.register_buffer("relative_index", pack.relative.index.clone())
        # the tables the pack computed from its configuration, not drawn: a state dict must hold them as they are
        self.DERIVED = (*(f"pos_embed.{block}" for block in range(self.pe_blocks) if config.pe in SINUSOIDAL_PES),
                        "rope_cos", "rope_sin", "relative_index")
        for name, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = name

    def without_pe(self, tokens: Tensor) -> Tensor:
        """The output with the PE taken out: no vector added (learned, random, sinusoidal), no logit bias
        (relative), no rotation (RoPE)."""
        self.pe_off = True
        try:
            return self(tokens)
        finally:
            self.pe_off = False

    def as_tokens(self, tokens, name: str = "tokens") -> Tensor:
        """tokens as the model takes them: a tensor (or array, or nested list) of real numbers [items, N, token_dim]
        (floating point or integer, not bool), in the model's dtype on its device; else a TypeError or ValueError
        naming the argument (`name`: the caller's)."""
        if not isinstance(tokens, Tensor):
            if isinstance(tokens, np.ndarray) and not tokens.dtype.isnative:  # big-endian: torch takes native only
                tokens = tokens.astype(tokens.dtype.newbyteorder("="))
            try:
                tokens = torch.as_tensor(tokens)
            except (TypeError, ValueError, RuntimeError) as error:  # a str, a ragged list, an object array
                raise TypeError(f"{name}: not a tensor or array of numbers ({str(error).splitlines()[0][:120]})") \
                    from None
        if tokens.layout != torch.strided or tokens.is_nested:  # the blocks' reshapes fail inside the model
            layout = "nested" if tokens.is_nested else str(tokens.layout).removeprefix("torch.")
            raise TypeError(f"{name}: a {layout} tensor; pass a dense one (tokens.to_dense())")
        if tokens.is_quantized:  # its integers mean values only with its scale: dequantize() gives them
            raise TypeError(f"{name}: a quantized tensor ({tokens.dtype}); pass tokens.dequantize()")
        if tokens.dtype == torch.bool:  # a mask (x > 0), which a cast would turn into 0 / 1 values without a word
            raise TypeError(f"{name}: torch.bool values are a mask, the model takes numbers; pass the tokens "
                            f"themselves (integers are taken as the numbers they are)")
        if tokens.is_complex():  # a cast would drop the imaginary part with a warning only
            raise TypeError(f"{name}: {tokens.dtype} values are complex, the model takes real ones")
        if tokens.device.type == "meta":
            raise ValueError(f"{name} on the meta device: they hold no values to run the model on")
        if tokens.dim() != 3 or tokens.shape[1:] != (self.config.num_tokens, self.config.token_dim):
            raise ValueError(f"{name} must be [items, {self.config.num_tokens}, {self.config.token_dim}], got "
                             f"{list(tokens.shape)}")
        weight = self.embed.weight
        if tokens.is_floating_point() and torch.finfo(tokens.dtype).max > torch.finfo(weight.dtype).max and bool(
                (tokens.isfinite() & (tokens.abs() > torch.finfo(weight.dtype).max)).any()):
            # the cast would make them inf, and the caller then read that they held Inf
            raise ValueError(f"{name}: values beyond {weight.dtype}'s range (±{torch.finfo(weight.dtype).max:.3g}), "
                             f"in which the model computes")
        return tokens.to(weight.device, weight.dtype)

    def forward(self, tokens: Tensor) -> Tensor:
        h = self.hook_embed(self.embed(self.as_tokens(tokens)))
        rope = None if self.rope_cos is None or self.pe_off else (self.rope_cos, self.rope_sin)
        for index, block in enumerate(self.blocks):
            pe = getattr(self.pos_embed, str(index)) if index < self.pe_blocks and not self.pe_off else None
            bias = None
            if self.relative_bias is not None and index < len(self.relative_bias) and not self.pe_off:
                bias = self.relative_bias[index][:, self.relative_index]
            h = block(h, pe, rope, bias)
        if self.config.readout_token is not None:
            h = h[:, self.config.readout_token]
        return self.head(h)

    def hook_points(self) -> dict[str, HookPoint]:
        return {module.name: module for module in self.modules() if isinstance(module, HookPoint)}

    def run_with_hooks(self, tokens: Tensor, fwd_hooks: Iterable[tuple[str | Callable[[str], bool], HookFunction]]
                       ) -> Tensor:
        """forward with hooks: each (name, or a test of the name; fn(value, hook) -> the value to use instead, or
        None to keep it), as TransformerLens's run_with_hooks takes them."""
        points, handles = self.hook_points(), []
        if isinstance(fwd_hooks, (str, bytes)) or not isinstance(fwd_hooks, Iterable):
            raise TypeError(f"fwd_hooks: a list of (hook name or test, function) pairs, got {fwd_hooks!r:.60}")
        try:
            for pair in fwd_hooks:
                if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and callable(pair[1])):
                    raise TypeError(f"fwd_hooks: each item must be (hook name or test, function), got {pair!r:.80}")
                chosen, function = pair
                names = [n for n in points if (chosen(n) if callable(chosen) else n == chosen)]
                if not names and not callable(chosen):  # a test may select none, as TransformerLens's may
                    raise ValueError(f"fwd_hooks: no hook point {chosen!r}; the hook points: {', '.join(points)}")
                for name in names:
                    handles.append(points[name].register_forward_hook(
                        lambda module, inputs, output, function=function: checked(function(output, module),
                                                                                  output, module.name)))
            return self(tokens)
        finally:
            for handle in handles:
                handle.remove()

    def run_with_cache(self, tokens: Tensor, names_filter: Callable[[str], bool] | str | Iterable[str] | None = None
                       ) -> tuple[Tensor, dict[str, Tensor]]:
        """(the output, every hook point's value by name), detached, as TransformerLens's run_with_cache: of the
        hook points names_filter names (a name, names, or a test of a name; None: all)."""
        cache = {}

        def keep(value: Tensor, hook: HookPoint):
            cache[hook.name] = value.detach()

        points = self.hook_points()
        if isinstance(names_filter, str):
            names_filter = [names_filter]
        if names_filter is not None and not callable(names_filter):
            if isinstance(names_filter, Iterable) and not isinstance(names_filter, (bytes, dict)):
                names_filter = list(names_filter)  # a generator, a set, a dict's keys: any iterable of names
            if not (isinstance(names_filter, list) and all(isinstance(n, str) for n in names_filter)):
                raise TypeError(f"names_filter: a hook point's name, names, or a test of a name, got "
                                f"{names_filter!r:.80}")
            if (unknown := next((n for n in names_filter if n not in points), None)) is not None:
                raise ValueError(f"names_filter: no hook point {unknown!r}; the hook points: {', '.join(points)}")
            names_filter = set(names_filter).__contains__
        with torch.no_grad():
            out = self.run_with_hooks(tokens, [(names_filter or (lambda name: True), keep)])
        return out, cache

    def attention(self, tokens: Tensor) -> Tensor:
        """The attention probabilities of every block: [L, B, H, N, N] (query, key)."""
        _, cache = self.run_with_cache(tokens, lambda name: name.endswith("attn.hook_pattern"))
        return torch.stack([cache[f"blocks.{l}.attn.hook_pattern"] for l in range(len(self.blocks))])


def checked(new, value: Tensor, name: str):
    """What a hook returned: None (keep the value) or a tensor of the value's shape, dtype and device, which takes
    its place; else an error naming the hook point (a wrong one broadcast silently, or failed deep in the forward)."""
    if new is None:
        return None
    if not isinstance(new, Tensor):
        raise TypeError(f"fwd_hooks: the hook at {name} returned {type(new).__name__}; return a tensor of the value's "
                        f"shape {list(value.shape)} and dtype {value.dtype}, or None to keep it")
    if new.is_nested or new.layout != torch.strided:  # sparse or nested: failed deep inside the forward
        raise TypeError(f"fwd_hooks: the hook at {name} returned a {'nested' if new.is_nested else new.layout} "
                        f"tensor; return a dense one")
    if (new.shape, new.dtype, new.device) != (value.shape, value.dtype, value.device):
        raise ValueError(f"fwd_hooks: the hook at {name} returned {list(new.shape)} {new.dtype} on {new.device}, "
                         f"where the value is {list(value.shape)} {value.dtype} on {value.device}")
    return new


def copy_linear(linear: nn.Linear, stacked, index: int):
    """A StackedLinear's model `index` (x @ W + b, W [in, out]) into an nn.Linear (x @ Wᵀ + b)."""
    linear.weight.copy_(stacked.weight[index].T)
    linear.bias.copy_(stacked.bias[index])
