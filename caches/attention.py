"""Attention over what a cache keeps: the stretches of slots it hands over (KVView), in the
model dtype or INT8, through fused SDPA, explicit softmax (when a policy needs the
probabilities), split-K on CUDA, or the engine's CPU kernels in a compiled few-row step.
A cache calls `attend` from KVCache.attend; the model never sees which path ran."""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from core import kernels
from quantize.dense import exact_matmul, stored
from quantize.kv import codes, widen


def contiguous_scale(scale: Tensor) -> Tensor:
    """An INT8 stretch's scales [B, Hkv, S, 1], stored on their own for a prompt chunk's
    [rows x slots] product on the CPU: read in place, the last word of each INT8 row, Inductor
    scales the product one element at a time (0.8 s of a bfloat16 4k prompt)."""
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
            if kernels.reduces(q, True) and kernels.serve_attention(self.k):  # the scale as it is read
                return kernels.scores8(q, self.k, self.k_scale)
            kw = codes(self.k)  # [.., S, 4, D/4]
            if kernels.reduces(q, True):
                qf = q.float()
                if q.dtype != torch.float32 and self.k.dtype == torch.float32 and \
                        kernels.reduces(q, False):
                    # From a bfloat16 query Inductor vectorizes the keys' loop 16 lanes wide,
                    # and views float words (AVX2) as int32 there one lane at a time, through
                    # the stack; a stored float32 query keeps the loop 8 float lanes wide
                    # Over int32 words (AVX-512) the copy's 30 calls a step
                    # cost 3%.
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
        if kernels.reduces(q, False):
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
        return kernels.FUSED and int8 == (self.v_scale is not None) and kernels.reduces(q, int8) and \
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
            if kernels.reduces(probs, True) and kernels.serve_attention(self.v):
                return kernels.mix8(probs, self.v, self.v_scale)
            vw = codes(self.v)  # [.., S, 4, D/4]
            if kernels.reduces(probs, True):
                p = probs * self.v_scale.transpose(-1, -2)
                return (p[..., None, None] * vw.unsqueeze(-4)).sum(-3).flatten(-2)
            return (probs * contiguous_scale(self.v_scale).transpose(-1, -2)) @ vw.flatten(-2)
        if kernels.reduces(probs, False):  # as in scores
            if kernels.serve_attention(self.v):
                return kernels.mix(probs, self.v)
            return (probs.unsqueeze(-1) * self.v.unsqueeze(-3).float()).sum(-2)
        if self.v.device.type != "cpu" or kernels.CPU_BF16_MATMUL:
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
    `quantized` over its fast slots and its widened INT8 middle). qg [B, Hkv,
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
    if not need_probs and not kernels.reduces(qg, True) and \
            any(seg.k_scale is not None or seg.v_scale is not None for seg in segments):
        # A prompt chunk over INT8 stretches, no probabilities wanted: each stretch widened to
        # the model dtype once a chunk, then the fused kernel, as for a float cache (on the CPU
        # over each stretch on its own; elsewhere over one copy of them all). Read by matmuls
        # with the probabilities materialized, a 4k prompt of `quantized` took 7x `full`'s
        # time.
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
            not kernels.reduces(qg, False):
        k, v = segments[0].k, segments[0].v
        mask = fold(mask, G)
        split = kernels.SPLIT_SLOTS.get(q.device.type, 0)
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
    """One layer's step through its cache (KVCache.attend) as a function of the cache, which
    the engine compiles once for every layer: q [B, H, T, D], k/v [B, Hkv, T, D] un-rotated at
    positions input_pos [B, T] -> y [B, H, T, D]."""
    return cache.attend(input_pos, q, k, v)
