"""One-shot prompt compression (SnapKV, Li et al., 2024), for every region policy.

A prompt longer than the budget is read whole, as the full cache reads it (causal attention over
the prompt's own slots, so its logits are exact); then each layer keeps, per KV head:
    the sink (first `sink` tokens) and the window (last `window` tokens), as always;
    of the rest, the `middle` tokens with the most attention from the last W prompt tokens (the
    observation window), summed over those queries and the head's query group, then averaged
    over a 7-token neighbourhood (SnapKV's pooling: a chosen token keeps its context).
The survivors enter their regions in position order; the policy's statistics start from the
observation window's attention (`RegionCache.load_prompt`) and the policy takes over from the
first token after the prompt. Prompts that fit the budget, and prompts appended to a stream that
already holds tokens, go chunk by chunk as before. A cache that keeps every token (quantized)
keeps them all here too: one shot reads its prompt in the model dtype, then stores every token
older than the window in int8, at the full cache's pace (with compiled prompts, through the full
cache's own compiled prompt graph: engine.runtime.prefill.through_graph).

Paper: SnapKV: LLM Knows What You are Looking for Before Generation,
https://arxiv.org/abs/2404.14469; implements the observation-window voting and pooling of its
method section.
"""
from __future__ import annotations

import math
import torch
import torch.nn.functional as F
from torch import Tensor

from caches.full import FullCache
from caches.region import RegionCache
from quantize.dense import exact_matmul

POOL = 7  # SnapKV's pooling kernel


class PromptCapture(FullCache):
    """Reads a whole prompt like `full`, keeping what one-shot compression needs: the
    un-rotated keys (a cache under rank positions stores them so; an eager read's only) and the
    rotated queries of the observation window, the prompt's last `observe` of its T tokens.
    The queries go to a buffer, so that a compiled prompt graph writes them as it writes the
    keys: one read of the prompt, in any route."""

    def __init__(self, *args, observe: int, n_tokens: int, n_heads: int, **kw):
        super().__init__(*args, **kw)
        B, _, _, D = self.k.shape
        self.register_buffer("q_obs", torch.zeros(B, n_heads, observe, D, dtype=self.k.dtype),
                             persistent=False)
        # Their rows in the read's queries (every read here starts at 0): a tensor, so that
        # prompts of one length bucket share a graph.
        self.register_buffer("obs", torch.arange(n_tokens - observe, n_tokens),
                             persistent=False)
        self.observe, self.raw_k = observe, None

    def update(self, input_pos, q, k, v):
        view = super().update(input_pos, q, k, v)
        self.q_obs.copy_(view.q.index_select(2, self.obs))
        if not torch.compiler.is_compiling():
            self.raw_k = k
        return view


def observation_votes(q_obs: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """q_obs [B, H, W, D] (the prompt's last W queries, rotated), k [B, Hkv, T, D] (rotated) ->
    (probs [B, Hkv, W, T]: each KV head's attention, the mean over its query group; votes
    [B, Hkv, T]: summed over the W queries and pooled)."""
    B, H, W, D = q_obs.shape
    Hkv, T = k.shape[1], k.shape[2]
    G = H // Hkv
    # One product per KV head over its whole query group: the keys are read once, not copied
    # once per query head of the group (a broadcast matmul's expand).
    scores = exact_matmul(q_obs.reshape(B, Hkv, G * W, D).to(k.dtype), k.transpose(-1, -2))
    scores = scores.view(B, Hkv, G, W, T)
    query_pos = torch.arange(T - W, T, device=k.device).view(W, 1)
    future = torch.arange(T, device=k.device).view(1, T) > query_pos
    probs = torch.softmax((scores / math.sqrt(D)).masked_fill(future, float("-inf")), dim=-1)
    probs = probs.mean(dim=2)
    votes = F.avg_pool1d(probs.sum(dim=2).flatten(0, 1), POOL, stride=1, padding=POOL // 2,
                         count_include_pad=False).view(B, Hkv, T)
    return probs, votes


def keep_middle(votes: Tensor, sink: int, window: int, middle: int) -> Tensor:
    """votes [B, Hkv, T] -> bool [B, Hkv, T]: the `middle` best-voted tokens between the sink and
    the window (all of them when fewer)."""
    T = votes.shape[-1]
    t = torch.arange(T, device=votes.device)
    candidate = (t >= sink) & (t < T - window)
    n = min(middle, int(candidate.sum()))
    top = torch.where(candidate, votes, float("-inf")).topk(n, dim=-1).indices
    return torch.zeros_like(votes, dtype=torch.bool).scatter(-1, top, True)


def compresses_whole(caches, start: Tensor, n_tokens: int) -> bool:
    """Whether a prompt of n_tokens from positions `start` goes one-shot: some layer asks for it,
    every row starts empty, and the prompt is longer than a layer holds as read: its budget,
    or its sink and window for a cache that keeps every token (quantized: the rest is stored in
    int8, so one shot means the prompt is read in the model dtype, then quantized)."""
    region = [c for c in caches if isinstance(c, RegionCache) and c.one_shot]
    return bool(region) and bool((start == 0).all()) and \
        n_tokens > min(c.sink + c.window + (0 if c.keeps_every_token else c.middle)
                       for c in region)


def keeps_all(c: RegionCache, T: int) -> bool:
    """The middle holds every token of a T-token prompt between sink and window (quantized's):
    nothing to choose."""
    return T - c.sink - c.window <= c.middle


def needs_votes(c: RegionCache, T: int) -> bool:
    """Whether a one-shot layer needs the last queries' attention: a middle to choose, or
    statistics that start from it (a cache without a middle, streaming's, chooses nothing)."""
    return c.wants_probs or (c.middle > 0 and not keeps_all(c, T))
