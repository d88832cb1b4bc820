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
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

import kernels
from quantize.dense import exact_matmul, stored
from quantize.kv import codes, widen


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


# A compiled CPU step of at most this many query rows per KV head (decode: one token's group of
# query heads) attends through reductions that Inductor fuses into the block's loops, instead
# of the fused SDPA kernel or a matmul: one pass over the keys and one over the values, split
# over the threads, with no per-call setup (docs/PERFORMANCE.md, section 6c).
REDUCE_ROWS = 16
# Split-K decode attention (flash-decoding) for a decode step (one token a row) that would go
# to SDPA with a mask, by device type: the slots cut into chunks of this many, each with its
# own max, sum and weighted values, then combined. SDPA's kernels that take a mask split the
# work only by row, head and block of queries; on an H100 the split decodes Llama-3-8B's shapes
# at 74% of the bandwidth against SDPA's 67% at 1k, 69.5% against 47% at 4k
# (docs/PERFORMANCE.md, sections 7d, 7e). The CPU's
# compiled step reads through reductions instead (REDUCE_ROWS). Read when a step is traced.
SPLIT_SLOTS = {"cuda": 256}
# A CPU without oneDNN's bfloat16 kernels (AVX2 only: no AVX-512 BF16 or AVX-NE-CONVERT) runs a
# bfloat16 matmul through ATen's fallback, 20-35x slower than float32 for attention's shapes
# (docs/PERFORMANCE.md, section 6i): there the explicit softmax reads its values in float32.
CPU_BF16_MATMUL = torch.backends.mkldnn.is_available() and \
    torch.ops.mkldnn._is_mkldnn_bf16_supported()


def reduces(q: Tensor, int8: bool) -> bool:
    """Whether attention reads a stretch as a reduction (compiled only): few-row steps, on any
    device for int8 (no float32 copy of the codes), on the CPU otherwise. A prompt chunk's
    many rows read int8 through one copy a chunk (widened for SDPA, or the codes as floats for
    matmuls), where a reduction (or the decode kernels) would read and widen every code once
    per row, 384 of them in a 128-token chunk (a 4k prompt of `quantized`: 33 s, PERFORMANCE
    6zg)."""
    return torch.compiler.is_compiling() and q.shape[-2] <= REDUCE_ROWS and (
        int8 or q.device.type == "cpu")


def contiguous_scale(scale: Tensor) -> Tensor:
    """An INT8 stretch's scales [B, Hkv, S, 1], stored on their own for a prompt chunk's
    [rows x slots] product on the CPU: read in place, the last word of each INT8 row, Inductor
    scales the product one element at a time (0.8 s of a bfloat16 4k prompt, PERFORMANCE 6zg)."""
    return stored(scale) if scale.device.type == "cpu" else scale


class KVSegment(NamedTuple):
    """A stretch of cache slots attention reads: K/V [B, Hkv, S, D] in the model dtype, or INT8
    codes four to a 32-bit word, [B, Hkv, S, D/4] (quantize/kv.py), with symmetric per-token,
    per-head scales k_scale/v_scale [B, Hkv, S, 1] (a scale marks its K or V as INT8)."""
    k: Tensor
    v: Tensor
    k_scale: Optional[Tensor] = None
    v_scale: Optional[Tensor] = None

    def scores(self, q: Tensor) -> Tensor:
        """q [B, Hkv, M, D] -> unscaled q.k [B, Hkv, M, S] in float32."""
        if self.k_scale is not None:  # INT8 words: the codes as [4, D/4], and so the query
            if reduces(q, True) and kernels.serve_attention(self.k):  # the scale as it is read
                return kernels.scores8(q, self.k, self.k_scale)
            kw = codes(self.k)  # [.., S, 4, D/4]
            if reduces(q, True):
                qf = q.float()
                if q.dtype != torch.float32 and self.k.dtype == torch.float32 and \
                        reduces(q, False):
                    # From a bfloat16 query Inductor vectorizes the keys' loop 16 lanes wide,
                    # and views float words (AVX2) as int32 there one lane at a time, through
                    # the stack; a stored float32 query keeps the loop 8 float lanes wide
                    # (PERFORMANCE 6v). Over int32 words (AVX-512) the copy's 30 calls a step
                    # cost 3% (6zd).
                    qf = stored(qf)
                qw = qf.unflatten(-1, (4, -1))  # [.., M, 4, D/4]
                # The scale inside the sum: its result is the scores' own slice of the cat
                # below, not a buffer of its own scaled into it.
                kw = kw * self.k_scale.unsqueeze(-1)
                return (qw.unsqueeze(-3) * kw.unsqueeze(-4)).sum((-1, -2))
            # The codes in the model dtype hold them exactly (|code| <= 127): with the query
            # as it came, an exact product in float32 (bfloat16 on AMX, not float32 FMAs).
            s = exact_matmul(q, kw.flatten(-2).to(q.dtype).transpose(-1, -2))
            return s * contiguous_scale(self.k_scale).transpose(-1, -2)
        if reduces(q, False):
            if kernels.serve_attention(self.k):  # each key read once for all rows
                return kernels.scores(q.to(self.k.dtype), self.k)
            # The keys are read once and widened in registers; a matmul would pay a call's
            # setup for a few rows.
            return (q.float().unsqueeze(-2) * self.k.unsqueeze(-3).float()).sum(-1)
        return exact_matmul(q, self.k.transpose(-1, -2))

    def fuses(self, q: Tensor, slots: int) -> bool:
        """Whether a compiled few-row CPU step reads this stretch, in a view of `slots` slots in
        all, through the attend kernel (scores, softmax and mix in one call): keys and values
        stored alike, of a kind and in a view the attention kernels take
        (kernels.serve_attention)."""
        int8 = self.k_scale is not None
        return kernels.FUSED and int8 == (self.v_scale is not None) and reduces(q, int8) and \
            kernels.serve_attention(self.k, slots)

    def widened(self, dtype: torch.dtype) -> "KVSegment":
        """The stretch in the model dtype: INT8 codes times their scales, rounded once (what a
        cache in that dtype would hold)."""
        def side(x, scale):
            if scale is None:
                return x
            if torch.compiler.is_compiling() and kernels.serve_widen(x):
                return kernels.widen8(x, scale, dtype)
            return widen(x, scale, dtype)
        return KVSegment(side(self.k, self.k_scale), side(self.v, self.v_scale))

    def mix(self, probs: Tensor) -> Tensor:
        """probs [B, Hkv, M, S] (float32) -> probs @ V [B, Hkv, M, D] in float32."""
        if self.v_scale is not None:  # p.(s v) = (p s).v, over the codes as [4, D/4]
            if reduces(probs, True) and kernels.serve_attention(self.v):
                return kernels.mix8(probs, self.v, self.v_scale)
            vw = codes(self.v)  # [.., S, 4, D/4]
            if reduces(probs, True):
                p = probs * self.v_scale.transpose(-1, -2)
                return (p[..., None, None] * vw.unsqueeze(-4)).sum(-3).flatten(-2)
            return (probs * contiguous_scale(self.v_scale).transpose(-1, -2)) @ vw.flatten(-2)
        if reduces(probs, False):  # as in scores
            if kernels.serve_attention(self.v):
                return kernels.mix(probs, self.v)
            return (probs.unsqueeze(-1) * self.v.unsqueeze(-3).float()).sum(-2)
        if self.v.device.type != "cpu" or CPU_BF16_MATMUL:
            return (probs.to(self.v.dtype) @ self.v).float()
        return probs @ self.v.float()


class KVView(NamedTuple):
    """What a cache hands attention for one step: the rotated query, the stretches of slots to
    attend over (S in all) and the mask [B, Hkv|1, T, S] over them (True = attend). mask None:
    causal, query t attends slots 0..t of one segment of T slots (a prompt from position 0).
    The segments after the first hold only tokens older than the step's first query (a region
    cache's middle): every query sees the same of their slots (`attend_in_parts`)."""
    q: Tensor
    segments: list
    mask: Tensor


def split_attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, chunk: int) -> Tensor:
    """softmax(q.k / sqrt(D), masked) @ v, chunk by chunk: q [B, Hkv, M, D], k/v [B, Hkv, S, D],
    mask [B, Hkv|1, M, S] -> [B, Hkv, M, D] float32. Chunk c (the last may be shorter) yields
    its max m_c, sum l_c and values o_c; the result is sum_c w_c o_c / sum_c w_c l_c with
    w_c = exp(m_c - max_c m_c), the same softmax in pieces that run side by side."""
    B, Hkv, M, D = q.shape
    S = k.shape[2]
    C, whole = S // chunk, S // chunk * chunk
    s = ((q @ k.transpose(-1, -2)).float() / math.sqrt(D)).masked_fill(~mask, float("-inf"))

    def part(s, v):  # s [..., M, n] over n slots, v [..., n, D] -> m, l [..., M], o [..., M, D]
        m = s.amax(-1, keepdim=True).clamp_min(-1e30)  # a chunk with nothing to attend: l = 0
        e = torch.exp(s - m)
        return m.squeeze(-1), e.sum(-1), (e.to(v.dtype) @ v).float()
    parts = []
    if C:  # the whole chunks, one batch of matmuls over [B, Hkv, C]
        parts.append(part(s[..., :whole].view(B, Hkv, M, C, chunk).transpose(2, 3),
                          v[:, :, :whole].view(B, Hkv, C, chunk, D)))
    if whole < S:  # the rest, as one more chunk
        parts.append(part(s[..., whole:].unsqueeze(2), v[:, :, whole:].unsqueeze(2)))
    m, l, o = (torch.cat(x, dim=2) for x in zip(*parts))  # [B, Hkv, chunks, M(, D)]
    w = torch.exp(m - m.amax(2, keepdim=True))
    return (w.unsqueeze(-1) * o).sum(2) / (w * l).sum(2).unsqueeze(-1)


def attend_in_parts(qg: Tensor, segments: list, mask: Tensor, scale: float) -> Tensor:
    """softmax(q.k * scale, masked) @ v over all the segments, by the fused CPU kernel over each
    on its own, merged by their log-sum-exps: no copy that joins them (a prompt chunk of
    `quantized` over its fast slots and its widened INT8 middle: PERFORMANCE 6zv). qg [B, Hkv,
    M, D] (a KV head's queries folded), segments in qg's dtype, mask [B, Hkv|1, T, S] (M = G *
    T) -> [B, Hkv, M, D] in qg's dtype. A later segment is masked by the first query's row,
    broadcast over the rows (KVView: every query sees the same of its slots)."""
    T = mask.shape[2]
    lses, outs, at = [], [], 0
    for i, seg in enumerate(segments):
        n = seg.k.shape[2]
        seen = mask.narrow(-1, at, n)
        seen = fold(seen, qg.shape[2] // T) if i == 0 else seen[:, :, :1]
        at += n
        bias = torch.zeros((), dtype=qg.dtype, device=qg.device).masked_fill(~seen, -math.inf)
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            qg, seg.k, seg.v, 0.0, False, attn_mask=bias, scale=scale)
        # A row that sees none of the slots gets a log-sum-exp of 0 from the kernel: no weight.
        lses.append(lse.masked_fill(~seen.any(-1), -math.inf))
        outs.append(o)
    lse = torch.stack(lses)
    w = torch.exp(lse - lse.amax(0)).unsqueeze(-1)  # [parts, B, Hkv, M, 1]
    y = sum(wi * o.float() for wi, o in zip(w, outs)) / w.sum(0)
    return y.to(qg.dtype)


def fold(mask: Tensor, G: int) -> Tensor:
    """mask [B, Hkv|1, T, S] -> [B, Hkv|1, G * T, S]: the rows of a KV head's folded queries."""
    return mask.unsqueeze(2).expand(-1, -1, G, -1, -1).flatten(2, 3)


def attend(view: KVView, need_probs: bool = False) -> tuple[Tensor, Optional[Tensor]]:
    """Attention of view.q [B, H, T, D] over its KV segments (Hkv heads).

    Returns (y [B, H, T, D], probs): probs [B, Hkv, G, T, S] (float32) when `need_probs`, else
    None. Without probabilities, one segment in the model dtype goes through fused SDPA, and so
    do INT8 segments, widened to one, but in a compiled few-row step (`reduces`), where a view
    the attention kernels take goes through the attend kernel (`KVSegment.fuses`).
    """
    q, segments, mask = view
    B, H, T, D = q.shape
    Hkv = segments[0].k.shape[1]
    if mask is None:  # causal over the prompt's own slots: the fused kernel skips the future
        assert len(segments) == 1 and segments[0].k_scale is None and not need_probs
        y = F.scaled_dot_product_attention(q, segments[0].k, segments[0].v, is_causal=True,
                                           enable_gqa=Hkv != H)
        return y, None
    G = H // Hkv
    # GQA without repeating K/V: fold each KV group's query heads into the query axis (and the
    # mask with them, below).
    qg = q.reshape(B, Hkv, G * T, D)
    if not need_probs and not reduces(qg, True) and \
            any(seg.k_scale is not None or seg.v_scale is not None for seg in segments):
        # A prompt chunk over INT8 stretches, no probabilities wanted: each stretch widened to
        # the model dtype once a chunk, then the fused kernel, as for a float cache (on the CPU
        # over each stretch on its own; elsewhere over one copy of them all). Read by matmuls
        # with the probabilities materialized, a 4k prompt of `quantized` took 7x `full`'s
        # time (PERFORMANCE 6zh).
        wide = [seg.widened(q.dtype) for seg in segments]
        if q.device.type == "cpu":
            y = attend_in_parts(qg, wide, mask, 1 / math.sqrt(D))
            return y.view(B, H, T, D), None
        segments = [KVSegment(torch.cat([w.k for w in wide], dim=2),
                              torch.cat([w.v for w in wide], dim=2))]
    if not need_probs and all(seg.fuses(qg, mask.shape[-1]) for seg in segments):
        # A compiled few-row CPU step over a long view: the softmax over all its stretches (a
        # region cache's fast slots and INT8 middle) in one call of the attend kernel; no
        # probabilities over the slots are stored.
        y, _ = kernels.attend_over(qg, segments, mask, 1 / math.sqrt(D))
        return y.to(q.dtype).view(B, H, T, D), None
    if len(segments) == 1 and segments[0].k_scale is None and not need_probs and \
            not reduces(qg, False):
        k, v = segments[0].k, segments[0].v
        mask = fold(mask, G)
        split = SPLIT_SLOTS.get(q.device.type, 0)
        if split and T == 1 and k.shape[2] > split:
            y = split_attend(qg, k, v, mask, split).to(q.dtype)
        else:
            y = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask)
        return y.view(B, H, T, D), None
    # Explicit softmax: policies that score tokens need the probabilities (SDPA hides them),
    # and a compiled few-row step's int8 stretches are dequantized here, by their per-token
    # scales, on the fly: q.(s k) = s (q.k) and p.(s v) = (p s).v, never a dequantized copy.
    scores = torch.cat([seg.scores(qg) for seg in segments], dim=-1) / math.sqrt(D)
    probs = torch.softmax(scores.masked_fill(~fold(mask, G), float("-inf")), dim=-1)
    y = sum(seg.mix(p) for seg, p in
            zip(segments, probs.split([seg.k.shape[2] for seg in segments], dim=-1)))
    y = y.to(q.dtype).view(B, H, T, D)
    return y, (probs.view(B, Hkv, G, T, -1) if need_probs else None)


def through_cache(cache, input_pos: Tensor, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """One layer's step through its cache (the contract in caches/base.py): q [B, H, T, D],
    k/v [B, Hkv, T, D] un-rotated at positions input_pos [B, T] -> y [B, H, T, D]."""
    view = cache.update(input_pos, q, k, v)
    y, probs = attend(view, need_probs=cache.wants_probs)
    cache.commit(input_pos, probs)
    return y


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_head, self.n_kv_heads, self.head_dim = args.n_head, args.n_kv_heads, args.head_dim
        qkv_dim = (args.n_head + 2 * args.n_kv_heads) * args.head_dim
        self.wqkv = nn.Linear(args.dim, qkv_dim, bias=args.attention_bias)
        self.wo = nn.Linear(args.n_head * args.head_dim, args.dim, bias=False)

    def forward(self, x: Tensor, input_pos: Tensor, cache, through: Callable = through_cache
                ) -> Tensor:
        # The cache contract (caches/base.py): update applies RoPE (the cache owns the position
        # map), stores K/V with n_kv_heads and returns what to attend over; commit receives the
        # probabilities (only if the policy scores by attention) and compresses. `through`
        # may take the rows through the cache in pieces (Transformer.read_by_layer).
        return self.out(through(cache, input_pos, *self.qkv(x)))

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

    def forward(self, x: Tensor, input_pos: Tensor, cache, through: Callable = through_cache
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
        # Set by engine.generation.compile_decode: in a compiled single-token step every block
        # goes through one nested compiled region (`block_step`: compiled once, stamped out per
        # layer). On CPU that step is `step_graph`, one graph a step; on CUDA the whole step,
        # sampling included, is compiled around `forward`. Prompt chunks stay eager.
        self.step_graph: Optional[Callable] = None
        self.block_step: Optional[Callable] = None
        # Set by engine.generation.compile_prompt: a layer's step through its cache over one
        # prompt chunk (through_cache), compiled, for prompts read layer by layer; and the
        # block's parts before and after its cache (block_input, block_output) over a piece
        # of rows, compiled for any number of rows.
        self.chunk_step: Optional[Callable] = None
        self.piece_steps: Optional[tuple[Callable, Callable]] = None

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

    def forward(self, idx: Tensor, input_pos: Tensor, caches, out_idx: Optional[Tensor] = None
                ) -> Tensor:
        """idx [B, T] token ids at positions input_pos [B, T] (or [T], shared by the rows), with
        one cache per layer (the model owns none: a session does); logits [B, T, vocab] in
        float32. out_idx selects which of the T positions get logits (prefill needs the last).
        """
        if input_pos.dim() == 1:
            input_pos = input_pos.view(1, -1).expand(idx.shape[0], -1)
        if torch.compiler.is_compiling():
            return self.run(idx, input_pos, caches, out_idx)
        # Caches whose work falls on some positions only pick the step's variant on the host.
        scheduled = [c for c in caches if c.scheduled]
        if scheduled:
            first, last = input_pos[:, 0].tolist(), input_pos[:, -1].tolist()  # one host read
            for cache in scheduled:
                cache.before_step(first, last)
        try:
            if idx.shape[1] == 1 and self.step_graph is not None:
                # One position: out_idx is moot. Fresh strides: a slice of a longer id tensor
                # would fail the graph's stride guards and compile it again.
                idx = idx.clone(memory_format=torch.contiguous_format)
                return self.step_graph(self, idx, input_pos, caches)
            return self.run(idx, input_pos, caches, out_idx)
        finally:
            for cache in scheduled:
                cache.after_step()

    def run(self, idx: Tensor, input_pos: Tensor, caches, out_idx: Optional[Tensor] = None,
            block: Optional[Callable] = None) -> Tensor:
        """forward's work: idx [B, T] at input_pos [B, T] -> logits [B, T', vocab]. block, if
        given, runs each block instead of block_step (a compiled step that inlines them)."""
        x = self.tok_embeddings(idx)
        # The nested block region serves compiled graphs and the single-token step; eager
        # prompt chunks call the blocks directly.
        step = block or (self.block_step if idx.shape[1] == 1 or torch.compiler.is_compiling()
                         else None)
        # Eager: a cache may leave its compression for after the last layer (a layer reads
        # only its own cache), so that caches alike compress together (`settle`).
        waiting = [] if step is None else None
        for layer, cache in zip(self.layers, caches):
            if step is not None:
                x = step(layer, x, input_pos, cache)
                continue
            cache.waiting = waiting
            try:
                x = layer(x, input_pos, cache)
            finally:
                cache.waiting = None
        if waiting:
            waiting[0].settle(waiting, input_pos)
        if out_idx is not None:
            x = x[:, out_idx]
        return run_head(self.norm, self.output, x)

    def read_by_layer(self, idx: Tensor, input_pos: Tensor, caches, chunk: int,
                      out_idx: Optional[Tensor] = None, step: Callable = through_cache,
                      piece: Optional[int] = None,
                      parts: tuple[Callable, Callable] = (block_input, block_output)) -> Tensor:
        """forward for rows that the caches take `chunk` at a time, in order (a compressing
        cache's prompt chunks), layer by layer: each layer's linears run once on a piece of
        `piece` rows (a multiple of `chunk`; all T rows by default), and its cache takes the
        piece's chunks one after another, each through `step` (through_cache, or it compiled:
        engine.generation.compile_prompt); `parts` are a block's before and after its cache
        (block_input, block_output, or them compiled). A layer reads only its own cache, so
        this is forward called chunk by chunk, up to the GEMMs' rounding, with every weight
        read once a piece instead of once a chunk (docs/PERFORMANCE.md, sections 6o, 6y).

        The pieces go as a wavefront: layer l reads piece p at wave p + l, once layer l - 1 has
        read it. In a wave the layers at work take their chunks in step, as one stack of caches
        where they are alike, each layer's rows at their own positions: a chunk's step and the
        token steps it leaves (RegionCache.commit) are then one call for all of them, as
        chunk by chunk every layer's token steps settle at once (section 6s)."""
        if input_pos.dim() == 1:
            input_pos = input_pos.view(1, -1).expand(idx.shape[0], -1)
        T = idx.shape[1]
        piece = piece or T
        n_piece, n_layer = -(-T // piece), len(self.layers)
        # Each piece's chunks, as (start, end) over the T rows.
        spans = [[(c, min(c + chunk, T)) for c in range(s, min(s + piece, T), chunk)]
                 for s in range(0, T, piece)]
        # Each chunk's first and last position per row, for the caches' host hooks.
        pos = input_pos.tolist()  # one host read
        bounds = {(s, e): ([p[s] for p in pos], [p[e - 1] for p in pos])
                  for piece_spans in spans for s, e in piece_spans}

        x = {}  # a piece's activations, as the last layer to read it left them
        last = []  # the last layer's, piece by piece
        for wave in range(n_piece + n_layer - 1):
            # The layers at work, each on its piece. Those whose caches are alike, with pieces
            # of as many chunks, go as one stack (RegionCache.stacked: a cache whose rows are
            # every layer's, copied in once a wave and back after it), so that a chunk's update,
            # attention and commit, and then its token steps, are one call for all of them.
            groups: dict = {}
            for i in range(max(0, wave - n_piece + 1), min(n_layer, wave + 1)):
                p = wave - i
                if i == 0:
                    x[p] = self.tok_embeddings(idx[:, spans[p][0][0]:spans[p][-1][1]])
                groups.setdefault((caches[i].alike(), tuple(e - s for s, e in spans[p])), []
                                  ).append((i, p, parts[0](self.layers[i], x[p])))
            stacks = []  # (the stack, its caches, their layers' (i, p, qkv), its output by chunk)
            for members in groups.values():
                n = caches[members[0][0]].wave_limit
                for part in (members[j:j + n] for j in range(0, len(members), n)):
                    own = [caches[i] for i, _, _ in part]
                    stacks.append((own[0] if len(own) == 1 else own[0].stacked(own), own, part,
                                   []))
            for c in range(max(len(spans[part[0][1]]) for _, _, part, _ in stacks)):
                for stack, own, part, ys in stacks:
                    if c < len(spans[part[0][1]]):
                        ys.append(self._chunk(stack, len(own) > 1, input_pos, bounds, step,
                                              [(spans[p][c], spans[p][0][0], qkv)
                                               for _, p, qkv in part]))
            for stack, own, part, ys in stacks:
                if len(own) > 1:
                    stack.unstack(own)
                y = torch.cat(ys, dim=2).chunk(len(own))
                for (i, p, _), a in zip(part, y):
                    x[p] = parts[1](self.layers[i], x[p], a)
                    if i == n_layer - 1:
                        last.append(x.pop(p))
        x = torch.cat(last, dim=1)
        if out_idx is not None:
            x = x[:, out_idx]
        return run_head(self.norm, self.output, x)

    @staticmethod
    def _chunk(cache, stack: bool, input_pos: Tensor, bounds: dict, step: Callable,
               rows: list) -> Tensor:
        """One chunk through a cache (or a stack of caches, a layer's rows after another's):
        rows holds each layer's chunk (start, end) over the prompt, its piece's start and its
        piece's q/k/v; then the token steps the cache left. -> y [B (x layers), H, T, D]."""
        # Copies: a compiled step guards its inputs' strides, which a slice takes from the
        # piece's length.
        pos = torch.cat([input_pos[:, s:e] for (s, e), _, _ in rows])
        q, k, v = (torch.cat([qkv[j][:, :, s - at:e - at] for (s, e), at, qkv in rows])
                   for j in range(3))
        if stack:  # one compiled step for a stack of any height (RegionCache.stacked)
            for t in (pos, q, k, v):
                torch._dynamo.maybe_mark_dynamic(t, 0)
        first, last = (sum((bounds[r][j] for r, _, _ in rows), []) for j in range(2))
        if cache.scheduled:
            cache.before_step(first, last)
        cache.before_chunk(first)
        # An eager commit leaves its token steps on its list, a traced chunk with no list
        # (caches/base.py); both settle here.
        left = cache.waiting = []
        try:
            y = step(cache, pos, q, k, v)
            if left or pos.shape[1] > 1 and cache.takes_token_steps(pos.shape[1]):
                cache.settle([cache], pos)
        finally:
            cache.waiting = None
            cache.after_chunk()
            if cache.scheduled:
                cache.after_step()
        return y


def run_head(norm: nn.Module, output: nn.Module, x: Tensor) -> Tensor:
    """The final norm and the head: logits in float32."""
    return output(norm(x)).float()
