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
cache's own compiled prompt graph: `through_graph`).
"""
from __future__ import annotations

import math
from typing import Optional

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


@torch.inference_mode()
def prefill_whole(model, caches, tokens: Tensor, compiled: bool = False,
                  graph=None, bucket: Optional[int] = None) -> Tensor:
    """tokens [B, T] from position 0 -> the logits [B, V] after the last: read whole, then each
    one-shot layer keeps its survivors (the other layers read the prompt as they always do).
    compiled: the caller's prompts are compiled (read_prompt's word), so the model's compiled
    pieces serve the layers' linears and MLP. graph: the compiled prompt graph, with the
    prompt's length bucket: under original positions the prompt goes through it, as `full`'s
    fresh prompt does (`through_graph`)."""
    B, T = tokens.shape
    a = model.args
    one_shot = [isinstance(c, RegionCache) and c.one_shot for c in caches]
    # Under rank positions the layers load un-rotated keys, which the graph's caches do not hold.
    by_graph = graph is not None and bucket is not None and bucket >= T and all(
        c.positions == "original" if o else type(c) is FullCache
        for c, o in zip(caches, one_shot))
    length = bucket if by_graph else T
    rope = model.rope(length)
    with torch.device(model.device):  # a rank's caches hold its share of the KV heads
        passes = [PromptCapture(B, c.k.shape[1], a.head_dim, length, model.dtype, rope,
                                c.layer_id, observe=min(c.observe, T), n_tokens=T,
                                n_heads=c.k.shape[1] * (a.n_head // a.n_kv_heads))
                  if o else c for c, o in zip(caches, one_shot)]
    for p, c in zip(passes, caches):
        p.shard = c.shard
    pos = torch.arange(T, device=tokens.device)
    last = torch.tensor([T - 1], device=tokens.device)
    if by_graph:
        logits = through_graph(model, caches, passes, tokens, graph)
    elif compiled and model.piece_steps:
        # Compiled prompts: each layer's linears and MLP through the compiled pieces (any
        # number of rows), its attention as eager chunks take it (causal over the prompt).
        logits = model.read_by_layer(tokens, pos, passes, T, last, piece=T,
                                     parts=model.piece_steps)[:, -1]
    else:
        logits = model(tokens, pos, passes, out_idx=last)[:, -1]
    for p, c in zip(passes, caches):
        if p is c:
            continue
        # The middle may hold every token between sink and window (quantized's), or none
        # (streaming's): nothing to choose, and no votes unless the policy's statistics read
        # attention.
        every = keeps_all(c, T)
        probs = votes = None
        if needs_votes(c, T):
            probs, votes = observation_votes(p.q_obs, p.k[:, :, :T])
        if every:
            keep = None
        elif votes is None:  # no middle: none of them
            keep = torch.zeros(B, p.k.shape[1], T, dtype=torch.bool, device=tokens.device)
        else:
            keep = keep_middle(votes, c.sink, c.window, c.middle)
        c.load_prompt(p.k[:, :, :T] if by_graph else p.raw_k, p.v[:, :, :T], keep, probs,
                      rotated=by_graph)
    return logits


def through_graph(model, caches, passes: list, tokens: Tensor, graph) -> Tensor:
    """A fresh prompt through the compiled prompt graph, as `full`'s: padded to the passes'
    length (its bucket; the padding after the prompt, which no real query sees), causal over
    the passes' own slots, which then hold every token's rotated key and value, and the
    capturing passes the observation window's queries. Returns the logits [B, V] after the last
    token."""
    B, T = tokens.shape
    dev, length = tokens.device, passes[0].k.shape[2]
    for p in passes:
        p.fresh = True  # causal over the prompt's own slots
    padded = torch.zeros(B, length, dtype=torch.long, device=dev)
    padded[:, :T] = tokens
    return graph(model, passes, padded, torch.arange(length, device=dev).expand(B, -1),
                 torch.tensor([T - 1], device=dev))
