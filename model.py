"""A Llama-family transformer in one file.

Covers Llama 1/2/3/3.1, Mistral-style GQA models, SmolLM2 and Qwen2-style q/k/v bias. The model
owns no KV cache: forward takes one cache object per layer (caches/base.py states the contract),
so any number of independent sessions run on one model.

Q/K use the half-split RoPE layout (rotate the first half of each head against the second);
convert_hf.py permutes Meta-interleaved checkpoints (GGUF, consolidated.pth) into it.
"""
from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor



def _positive(**kw):
    return field(metadata={"min": 1}, **kw)


@dataclass
class ModelArgs:
    """The model's shape, read from the checkpoint's config.json. Each field's type and range is
    its schema (`from_dict` checks a config against them)."""
    vocab_size: int = _positive()
    n_layer: int = _positive()
    dim: int = _positive()
    n_head: int = _positive()
    n_kv_heads: int = _positive()
    head_dim: int = _positive()
    intermediate_size: int = _positive()
    norm_eps: float = field(default=1e-5, metadata={"above": 0, "max": 1})
    rope_base: float = field(default=10000.0, metadata={"above": 0})
    # Llama-3.1 style frequency scaling: {"factor", "low_freq_factor", "high_freq_factor",
    # "original_max_position_embeddings"}; None for plain RoPE.
    rope_scaling: Optional[dict] = None
    tie_embeddings: bool = False
    attention_bias: bool = False
    max_position_embeddings: int = _positive(default=2048)

    ROPE_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings")

    def __post_init__(self):
        for f in fields(self):
            _check_field(f, getattr(self, f.name))
        if self.rope_scaling is not None:
            if not isinstance(self.rope_scaling, dict) or \
                    sorted(self.rope_scaling) != sorted(self.ROPE_SCALING_KEYS):
                raise ValueError(f"model config: rope_scaling must be null or an object with "
                                 f"{', '.join(self.ROPE_SCALING_KEYS)}, got {self.rope_scaling!r}")
            for key, value in self.rope_scaling.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                        not math.isfinite(value) or value <= 0:
                    raise ValueError(f"model config: rope_scaling.{key} must be a positive "
                                     f"number, got {value!r}")
            if self.rope_scaling["high_freq_factor"] <= self.rope_scaling["low_freq_factor"]:
                raise ValueError("model config: rope_scaling.high_freq_factor must exceed "
                                 "low_freq_factor")
        if self.n_head % self.n_kv_heads:
            raise ValueError(f"model config: n_head={self.n_head} is not a multiple of "
                             f"n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"model config: head_dim={self.head_dim} must be even for RoPE")

    @classmethod
    def from_dict(cls, d: dict) -> "ModelArgs":
        if not isinstance(d, dict):
            raise ValueError(f"model config must be an object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"model config: unknown fields {unknown}")
        missing = sorted(f.name for f in fields(cls) if f.name not in d
                         and f.default is MISSING and f.default_factory is MISSING)
        if missing:
            raise ValueError(f"model config: missing fields {missing}")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)


# The schema's vocabulary: what each annotation accepts, and the bounds metadata may set.
_KINDS = {
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "float": ("a finite number", lambda v: isinstance(v, (int, float))
              and not isinstance(v, bool) and math.isfinite(v)),
    "bool": ("a boolean", lambda v: isinstance(v, bool)),
}
_BOUNDS = {"min": (">=", lambda v, b: v >= b), "above": (">", lambda v, b: v > b),
           "max": ("<=", lambda v, b: v <= b)}


def _check_field(f, value) -> None:
    """Type and range of one ModelArgs field (its annotation and metadata are the schema)."""
    kind = _KINDS.get(str(f.type))
    if kind is None:
        return  # rope_scaling: checked as a whole
    what, accepts = kind
    if not accepts(value):
        raise ValueError(f"model config: {f.name} must be {what}, got {value!r}")
    bounds = [(text, bound, holds) for key, (text, holds) in _BOUNDS.items()
              if (bound := f.metadata.get(key)) is not None]
    if not all(holds(value, bound) for _, bound, holds in bounds):
        limits = " and ".join(f"{text} {bound}" for text, bound, _ in bounds)
        raise ValueError(f"model config: {f.name} must be {limits}, got {value!r}")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # Normalize in float32 like the reference; cast back before the weight, as HF Llama does.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.type_as(x)


def rope_frequencies(head_dim: int, base: float, scaling: Optional[dict]) -> Tensor:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling:
        # Llama-3.1: keep high frequencies, divide low ones by `factor`, blend in between.
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = torch.where(wavelen > old_len / low, inv_freq / factor,
                               torch.where(wavelen < old_len / high, inv_freq, blended))
    return inv_freq.float()


def rope_table(max_len: int, head_dim: int, base: float, scaling: Optional[dict]) -> Tensor:
    """cos/sin of every position, float32, shape [max_len, head_dim // 2, 2]."""
    inv_freq = rope_frequencies(head_dim, base, scaling)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


def apply_rope(x: Tensor, cos_sin: Tensor) -> Tensor:
    """Rotate x [..., T, D] (half-split layout) by cos_sin [..., T, D // 2, 2], in float32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    cos, sin = cos_sin.unbind(-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_head, self.n_kv_heads, self.head_dim = args.n_head, args.n_kv_heads, args.head_dim
        qkv_dim = (args.n_head + 2 * args.n_kv_heads) * args.head_dim
        self.wqkv = nn.Linear(args.dim, qkv_dim, bias=args.attention_bias)
        self.wo = nn.Linear(args.n_head * args.head_dim, args.dim, bias=False)

    def forward(self, x: Tensor, input_pos: Tensor, cache, through: Optional[Callable] = None
                ) -> Tensor:
        # The cache attends (caches/base.py): it applies RoPE (it owns the position map),
        # stores K/V with n_kv_heads, attends over what it keeps and compresses. `through`, if
        # given, calls the cache instead (the engine's compiled region for one layer's step).
        q, k, v = self.qkv(x)
        y = through(cache, input_pos, q, k, v) if through else cache.attend(input_pos, q, k, v)
        return self.out(y)

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, T, dim] -> q [B, H, T, D], k/v [B, Hkv, T, D], un-rotated."""
        B, T, _ = x.shape
        H, Hkv, D = self.n_head, self.n_kv_heads, self.head_dim
        q, k, v = self.wqkv(x).split([H * D, Hkv * D, Hkv * D], dim=-1)
        return (q.view(B, T, H, D).transpose(1, 2), k.view(B, T, Hkv, D).transpose(1, 2),
                v.view(B, T, Hkv, D).transpose(1, 2))

    def out(self, y: Tensor) -> Tensor:
        """Attention's output y [B, H, T, D] -> [B, T, dim]."""
        B, H, T, D = y.shape
        return self.wo(y.transpose(1, 2).reshape(B, T, H * D))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.intermediate_size, bias=False)
        self.w3 = nn.Linear(args.dim, args.intermediate_size, bias=False)
        self.w2 = nn.Linear(args.intermediate_size, args.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)

    def forward(self, x: Tensor, input_pos: Tensor, cache, through: Optional[Callable] = None
                ) -> Tensor:
        return self.after_attention(x, self.attention(self.attention_norm(x), input_pos, cache,
                                                      through))

    def after_attention(self, x: Tensor, a: Tensor) -> Tensor:
        """The rest of the block once attention gave a [B, T, dim] for its input x."""
        h = x + a
        return h + self.feed_forward(self.ffn_norm(h))


def block_input(layer: TransformerBlock, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """What a block's attention reads of its input x [B, T, dim]: its un-rotated q, k, v."""
    return layer.attention.qkv(layer.attention_norm(x))


def block_output(layer: TransformerBlock, x: Tensor, y: Tensor) -> Tensor:
    """A block's output for its input x once attention gave y [B, H, T, D]."""
    return layer.after_attention(x, layer.attention.out(y))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layer))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    # Device and activation dtype come from the final norm: a quantized linear holds no float
    # weight to ask.
    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

    def rope(self, max_len: int) -> Tensor:
        """The RoPE table [max_len, head_dim // 2, 2] (float32) that caches rotate keys with."""
        a = self.args
        return rope_table(max_len, a.head_dim, a.rope_base, a.rope_scaling).to(self.device)

    def forward(self, idx: Tensor, input_pos: Tensor, caches, out_idx: Optional[Tensor] = None,
                block: Optional[Callable] = None) -> Tensor:
        """idx [B, T] token ids at positions input_pos [B, T] (or [T], shared by the rows), with
        one cache per layer (the model owns none: a session does); logits [B, T, vocab] in
        float32. out_idx selects which of the T positions get logits (prefill needs the last).
        block(layer, x, input_pos, cache), if given, runs each layer instead (the engine's
        compiled region for one block, engine/runtime/steps.py)."""
        if input_pos.dim() == 1:
            input_pos = input_pos.view(1, -1).expand(idx.shape[0], -1)
        x = self.tok_embeddings(idx)
        for layer, cache in zip(self.layers, caches):
            x = block(layer, x, input_pos, cache) if block else layer(x, input_pos, cache)
        if out_idx is not None:
            x = x[:, out_idx]
        return run_head(self.norm, self.output, x)


def run_head(norm: nn.Module, output: nn.Module, x: Tensor) -> Tensor:
    """The final norm and the head: logits in float32."""
    return output(norm(x)).float()
