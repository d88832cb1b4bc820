"""Reading a prompt into the caches: whole, in fixed chunks that compress as they go, layer by
layer as a wavefront, or in one shot (a prompt's last queries choose what a layer keeps).

`read_prompt` picks the way each cache reads a prompt; `read_by_layer` runs the wavefront; a
compiled prompt (engine.runtime.generation.compile_prompt) goes through the same functions with its
compiled pieces.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from caches.attention import through_cache
from caches.full import FullCache
from caches.region import RegionCache
from caches.snapkv import PromptCapture, compresses_whole, keep_middle, keeps_all, needs_votes, \
    observation_votes
from engine.runtime.steps import forward, steps
from model import Transformer, block_input, block_output, run_head

MIN_PREFILL_BUCKET = 16
# The most prompt rows a layer reads at once in a wavefront (read_by_layer,
# layer_piece): PREFILL_PIECE where its cache compresses chunk by chunk in one pass (on an AMX
# CPU a GEMM of 1,024 rows pays per call what one of 4,096 does not),
# WAVE_PIECE where it takes token steps; BY_LAYER off: chunk by chunk through every layer.
PREFILL_PIECE = 4096
WAVE_PIECE = 256
BY_LAYER = True
def prefill(model: Transformer, caches, tokens: Tensor, input_pos: Tensor, last: Tensor) -> Tensor:
    """tokens [B, T] at input_pos [B, T] -> the logits [B, V] at index `last` [1]."""
    return forward(model, tokens, input_pos, caches, out_idx=last)[:, -1]


def settle_left(caches, input_pos: Tensor) -> None:
    """The token steps that compiled code left for a chunk at input_pos [B, T > 1]
    (RegionCache.commit), every cache that takes them at once; a compiled single-token step
    takes its own."""
    T = input_pos.shape[1]
    waiting = [c for c in caches if T > 1 and c.takes_token_steps(T)]
    if waiting:
        waiting[0].settle(waiting, input_pos)


def read_prompt(model: Transformer, caches, tokens: Tensor, start: Tensor, max_seq_length: int,
                prefill_fn=prefill, compiled: bool = False, piece: Optional[int] = None
                ) -> Tensor:
    """tokens [B, T] at positions start [B, 1] + 0..T-1 through the caches, as each cache reads
    a prompt (whole, in fixed chunks, or one shot); the logits [B, V] after the last token.
    piece: the rows a layer reads at once where the prompt is read layer by layer (a
    warm-up's; by default `layer_piece` chooses)."""
    dev = tokens.device
    B, T = tokens.shape
    chunk = prefill_chunk(caches)
    if compresses_whole(caches, start, T):  # one-shot prompt compression
        if compiled and prefill_fn is not prefill:
            return prefill_whole(model, caches, tokens, compiled, prefill_fn,
                                 prefill_bucket(T, max_seq_length))
        return prefill_whole(model, caches, tokens, compiled)
    if chunk is None:
        # the caller checked the room: the bucket never falls below T
        T_in = T
        if compiled and int(start.max()) > 0:
            # A later piece attends over the whole static buffer under a mask, which a graph
            # pads to its bucket: slower than eager. A fresh prompt, causal
            # over its own slots, is where the graph wins.
            compiled, prefill_fn = False, prefill
        if compiled:
            T_in = prefill_bucket(T, max_seq_length)
            # The graph cannot read the positions: the caches take the causal path on this
            # word (a layered plan's compiled chunks never set it: their full layers keep the
            # mask).
            for cache in caches:
                cache.fresh = True
        # Padding sits at positions after the prompt: masked from every real query, and
        # overwritten by the steps that reach those positions.
        padded = torch.zeros(B, T_in, dtype=torch.long, device=dev)
        padded[:, :T] = tokens
        span = start + torch.arange(padded.shape[1], device=dev)
        return prefill_fn(model, caches, padded, span, torch.tensor([T - 1], device=dev))
    # Compressing caches take fixed-size chunks (compressing after each), then the remainder
    # one token at a time: two graph shapes for every prompt length.
    n_chunks, whole = T // chunk, T // chunk * chunk
    logits = None
    if BY_LAYER and piece is None:
        piece = layer_piece(caches, chunk, whole, len(model.layers))
    if BY_LAYER and piece is not None and whole > chunk:
        # Layer by layer, the whole prompt as one wavefront: each layer's linears read a
        # piece of rows at once instead of a chunk's (the same values), and the layers at
        # work on their pieces take their chunks as one stack.
        through = steps(model).chunk if compiled and steps(model).chunk else through_cache
        parts = steps(model).pieces if compiled and steps(model).pieces else \
            (block_input, block_output)
        logits = read_by_layer(model, tokens[:, :whole], start + torch.arange(whole, device=dev),
                                     caches, chunk, torch.tensor([whole - 1], device=dev),
                                     through, piece, parts)[:, -1]
    else:
        last = torch.tensor([chunk - 1], device=dev)
        for c in range(n_chunks):
            span = start + torch.arange(c * chunk, (c + 1) * chunk, device=dev)
            # A copy, as for the tokens below: a slice's row stride is the prompt's length, and
            # a compiled chunk's stride guards would recompile it for every prompt length.
            piece = tokens[:, c * chunk:(c + 1) * chunk].clone(
                memory_format=torch.contiguous_format)
            logits = prefill_fn(model, caches, piece, span, last)
    last = torch.tensor([0], device=dev)
    for t in range(whole, T):
        # contiguous like the decode loop's own tokens, so the graph's stride guards hold
        step = tokens[:, t:t + 1].clone(memory_format=torch.contiguous_format)
        logits = prefill(model, caches, step, start + t, last)
    return logits


def layer_piece(caches, chunk: int, rows: int, n_layer: int) -> Optional[int]:
    """The piece of prompt rows that each layer's linears read at once when `rows` rows (whole
    chunks) are read layer by layer as a wavefront (read_by_layer), or None: chunk
    by chunk through every layer. One-pass caches take half the prompt, at most PREFILL_PIECE
    rows: two layers at work from the second wave on halve the chunk steps' calls, and pieces
    of thousands of rows keep the linears' GEMMs large.
    Token-step caches, whose filling and draining add (n_layer - 1) pieces of token steps,
    each a call (the layers at work share it): pieces of up to WAVE_PIECE rows and no more than
    2 rows / (n_layer - 1), so that they at most triple the prompt's own; under two chunks the
    wavefront does not pay, and the chunks go in order."""
    if rows <= chunk:
        return None
    if not any(c.takes_token_steps(chunk) for c in caches):
        half = -(-(rows // chunk) // 2)  # chunks, rounded up
        return min(max(1, PREFILL_PIECE // chunk), half) * chunk
    piece = min(WAVE_PIECE, 2 * rows // max(1, n_layer - 1)) // chunk * chunk
    return piece if piece >= 2 * chunk else None


def prefill_chunk(caches) -> Optional[int]:
    """The prompt chunk the caches take (None: any length); a layered plan mixing full and
    compressing layers takes the compressing layers' chunk."""
    return next((c.prefill_chunk for c in caches if c.prefill_chunk is not None), None)


def prefill_bucket(n: int, max_seq_length: int) -> int:
    bucket = MIN_PREFILL_BUCKET
    while bucket < n:
        bucket *= 2
    return min(bucket, max_seq_length)


def read_by_layer(model: Transformer, idx: Tensor, input_pos: Tensor, caches, chunk: int,
                  out_idx: Optional[Tensor] = None, step: Callable = through_cache,
                  piece: Optional[int] = None,
                  parts: tuple[Callable, Callable] = (block_input, block_output)) -> Tensor:
    """forward for rows that the caches take `chunk` at a time, in order (a compressing
    cache's prompt chunks), layer by layer: each layer's linears run once on a piece of
    `piece` rows (a multiple of `chunk`; all T rows by default), and its cache takes the
    piece's chunks one after another, each through `step` (through_cache, or it compiled:
    engine.runtime.generation.compile_prompt); `parts` are a block's before and after its cache
    (block_input, block_output, or them compiled). A layer reads only its own cache, so
    this is forward called chunk by chunk, up to the GEMMs' rounding, with every weight
    read once a piece instead of once a chunk.

    The pieces go as a wavefront: layer l reads piece p at wave p + l, once layer l - 1 has
    read it. In a wave the layers at work take their chunks in step, as one stack of caches
    where they are alike, each layer's rows at their own positions: a chunk's step and the
    token steps it leaves (RegionCache.commit) are then one call for all of them, as
    chunk by chunk every layer's token steps settle at once."""
    if input_pos.dim() == 1:
        input_pos = input_pos.view(1, -1).expand(idx.shape[0], -1)
    T = idx.shape[1]
    piece = piece or T
    n_piece, n_layer = -(-T // piece), len(model.layers)
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
                x[p] = model.tok_embeddings(idx[:, spans[p][0][0]:spans[p][-1][1]])
            groups.setdefault((caches[i].alike(), tuple(e - s for s, e in spans[p])), []
                              ).append((i, p, parts[0](model.layers[i], x[p])))
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
                    ys.append(run_chunk(stack, len(own) > 1, input_pos, bounds, step,
                                          [(spans[p][c], spans[p][0][0], qkv)
                                           for _, p, qkv in part]))
        for stack, own, part, ys in stacks:
            if len(own) > 1:
                stack.unstack(own)
            y = torch.cat(ys, dim=2).chunk(len(own))
            for (i, p, _), a in zip(part, y):
                x[p] = parts[1](model.layers[i], x[p], a)
                if i == n_layer - 1:
                    last.append(x.pop(p))
    x = torch.cat(last, dim=1)
    if out_idx is not None:
        x = x[:, out_idx]
    return run_head(model.norm, model.output, x)

def run_chunk(cache, stack: bool, input_pos: Tensor, bounds: dict, step: Callable,
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
    elif compiled and steps(model).pieces:
        # Compiled prompts: each layer's linears and MLP through the compiled pieces (any
        # number of rows), its attention as eager chunks take it (causal over the prompt).
        logits = read_by_layer(model, tokens, pos, passes, T, last, piece=T,
                                     parts=steps(model).pieces)[:, -1]
    else:
        logits = forward(model, tokens, pos, passes, out_idx=last)[:, -1]
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
