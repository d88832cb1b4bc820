"""The contract between attention and a KV cache.

Each step, for one layer:

    cache.before_step(first, last)                   # host side, `scheduled` caches only
    view = cache.update(input_pos, q, k, v)          # rotate, store, say what to attend over
    y, probs = attend(view, need_probs=cache.wants_probs)
    cache.commit(input_pos, probs)                   # statistics and compression happen here
    cache.after_step()                               # host side, `scheduled` caches only

An eager step may leave its compression for later: the engine (engine/runtime/steps.py) sets
`cache.waiting` to a list, a cache that waits appends itself in `commit`, and after the last
layer the engine calls `waiting[0].settle(waiting, input_pos)`, which compresses every cache in
the list (a layer's cache is read by that layer only, so waiting until every layer has attended
changes nothing; caches alike then compress together, RegionCache.settle). A traced prompt chunk leaves it too,
with no list: whoever calls the chunk's graph settles, after it, the caches whose
`takes_token_steps(T)` holds.

`update` takes this step's un-rotated q [B, H, T, D] and k/v [B, Hkv, T, D] at positions
input_pos [B, T] (each row at its own position), applies RoPE at the positions it chooses,
writes K/V into its static buffers (allocated once, in __init__) and returns a KVView
(caches/attention.py).
Only policies that score tokens by attention set `wants_probs`; the others get probs = None and
their attention goes through fused SDPA when their slots are one stretch in the model dtype.
Stretches stored in int8 come back as int8 with their scales; attention folds the scales into
the scores and the probabilities instead of materialising a dequantized copy.

Every tensor a cache allocates lives in a registered buffer, so `nbytes` is exact, `.to()`
moves it, and `state()` is everything a saved session needs.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
from torch import Tensor

from caches.attention import KVSegment, KVView, attend  # noqa: F401  (KVSegment: for policies)
from core.errors import UserError
from model import apply_rope  # noqa: F401


@dataclass(frozen=True)
class Option:
    """A policy's option, declared once in its policy's file: every tool's command-line flag
    (--NAME), the sweep's key, --list_caches and the range check are made from it. default None:
    derived from the cache's regions, as `help` says."""
    name: str
    type: type  # int or float
    default: object
    help: str
    min: Optional[float] = None    # lowest value allowed
    above: Optional[float] = None  # a bound the value must exceed
    max: Optional[float] = None    # highest value allowed

    def check(self, value) -> None:
        """Raise UserError for a value of the wrong type or outside the declared range (NaN
        included)."""
        if self.type is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise UserError(f"`{self.name}` must be an integer, got {value!r}")
        if self.type is float and (isinstance(value, bool) or not isinstance(value, (int, float))
                                   or not math.isfinite(value)):
            raise UserError(f"`{self.name}` must be a finite number, got {value!r}")
        ok = (self.min is None or value >= self.min) and \
            (self.above is None or value > self.above) and (self.max is None or value <= self.max)
        if not ok:
            raise UserError(f"`{self.name}` must be {self.range()} ({self.help}), got {value}")

    def range(self) -> str:
        low = "[" if self.min is not None else "("
        lo = self.min if self.min is not None else self.above
        if lo is not None and self.max is not None:
            return f"in {low}{lo:g}, {self.max:g}]"
        if lo is not None:
            return f"{'>=' if self.min is not None else '>'} {lo:g}"
        return f"<= {self.max:g}" if self.max is not None else "any value"


def take_slots(buf: Tensor, slots: Tensor) -> Tensor:
    """buf [B, H, S, ...] at slots [B, T] of each row -> [B, H, T, ...] (a copy)."""
    return buf.gather(2, slot_index(buf, slots))


def put_back(buf: Tensor, slots: Tensor, old: Tensor) -> None:
    """The inverse of take_slots: buf at slots [B, T] <- old [B, H, T, ...]."""
    buf.scatter_(2, slot_index(buf, slots), old)


def slot_index(buf: Tensor, slots: Tensor) -> Tensor:
    B, T = slots.shape
    shape = (B, buf.shape[1], T, *buf.shape[3:])
    return slots.view(B, 1, T, *[1] * (buf.dim() - 3)).expand(shape)


def put_slots(buf: Tensor, index: Tensor, src) -> None:
    """buf.scatter_(2, index, src), written as index_put_: buf[i, j, index[i, j, k, ...], ...]
    = src[i, j, k, ...] (src a tensor of index's shape, or a number). In a compiled step
    Inductor updates the buffer in place this way; its scatter_ copies the whole buffer out and
    back, which costs as much as reading the cache on every write."""
    if not torch.compiler.is_compiling():
        # Eager, scatter_ is one call, where index_put_ takes an index grid per dimension
        # (four aranges, their views and a broadcast: ~30 us a write, eight writes a step).
        index = index.long()
        buf.scatter_(2, index, src.expand(index.shape) if isinstance(src, Tensor) else src)
        return
    idx = [torch.arange(n, device=index.device).view([n if d == i else 1
                                                       for d in range(index.dim())])
           for i, n in enumerate(index.shape)]
    idx[2] = index
    idx = torch.broadcast_tensors(*idx)
    buf.index_put_(tuple(idx), src if isinstance(src, Tensor) else
                   torch.tensor(src, dtype=buf.dtype, device=buf.device))


class KVCache(nn.Module):
    wants_probs = False
    has_middle = False
    prefill_chunk = None  # None: any prompt length in one call; N: feed prompts N tokens at a time
    unbounded = False     # True: positions never run out (keys rotate by rank in the cache)
    keeps_every_token = False  # True: no token budget (full, quantized): bytes follow the stream
    ahead_is_harmless = False  # True: a step at a position the stream has not reached yet
    #                            changes nothing the stream reads (continuous batching relies on it)
    description = ""      # one line for --list_caches
    options: tuple = ()   # the policy's options (Option), each declared once
    waiting = None        # set by the model around an eager step's block (above)
    fresh = False         # set on the host before a compiled prompt graph: every row starts at 0
    interval = 1          # compression_interval (> 1: compress in one pass every k positions)

    @classmethod
    def check_options(cls, window: int, **options) -> None:
        """Raise UserError for option values the policy cannot run with."""

    def __init__(self, rope: Tensor, layer_id: int = 0):
        super().__init__()
        self.layer_id = layer_id
        # Set by build_caches under tensor parallelism (engine/runtime/tp.py): this rank holds KV
        # heads [shard.offset, shard.offset + Hkv) of shard.total; shard.all_reduce sums over ranks.
        self.shard = None
        # An attribute of its own from the start: a compiled step guards on where it finds it.
        self.verifying = False
        self.register_buffer("rope", rope, persistent=False)  # [max_len, D // 2, 2] float32

    def attend(self, input_pos: Tensor, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """What the model's attention asks of its cache for one layer's step: q [B, H, T, D],
        k/v [B, Hkv, T, D] un-rotated at positions input_pos [B, T] -> y [B, H, T, D]."""
        view = self.update(input_pos, q, k, v)
        y, probs = attend(view, need_probs=self.wants_probs)
        self.commit(input_pos, probs)
        return y

    def update(self, input_pos: Tensor, q: Tensor, k: Tensor, v: Tensor) -> KVView:
        """q [B, H, T, D], k/v [B, Hkv, T, D] (un-rotated) at positions input_pos [B, T]."""
        raise NotImplementedError

    def commit(self, input_pos: Tensor, probs) -> None:
        """After attention: probs [B, Hkv, G, T, S] (float32) if `wants_probs`, else None."""

    def takes_token_steps(self, T: int) -> bool:
        """Whether `commit` of a T-token step leaves work for `settle` (in an eager step or a
        traced prompt chunk, above)."""
        return False

    # ---- speculative verification (engine/runtime/speculative.py) -----------------------------
    # A verify step reads a pending token and k drafted ones as one T-token step: each attends
    # over the cache and the block's earlier tokens, as k + 1 single steps would, provided the
    # cache compresses nothing in between (the engine never lets a block cross a compression
    # pass). `commit` then keeps nothing but the attention it was given; `accept(n)` keeps the
    # first n tokens as if they had been read one by one and removes the rest without a trace:
    # the slots they were written to get back what they held.
    verifying = False
    slot_buffers: tuple = ("k", "v", "pos")  # buffers a token's write touches, slots on dim 2

    def written_slots(self, input_pos: Tensor) -> Tensor:
        """The slots [B, T] (third dim of each `slot_buffers` buffer) a step at input_pos writes."""
        return input_pos

    def begin_verify(self, input_pos: Tensor) -> None:
        """Before a verify step at input_pos [B, T]: keep what its writes will overwrite."""
        slots = self.written_slots(input_pos).long()
        saved = {name: take_slots(getattr(self, name), slots) for name in self.slot_buffers}
        self.verified = (input_pos, slots, saved, None)
        self.verifying = True

    def accept(self, n: int) -> None:
        """After the verify step: keep its first n tokens (read, then compressed where a
        compression falls on the last of them, as single steps would have), and put back
        what the others overwrote."""
        input_pos, slots, saved, held = self.verified
        del self.verified
        self.verifying = False
        if n < input_pos.shape[1]:
            for name, old in saved.items():
                put_back(getattr(self, name), slots[:, n:], old[:, :, n:])
        if n:
            self.settle_accepted(input_pos[:, :n], held)

    def settle_accepted(self, input_pos: Tensor, held) -> None:
        """The work `commit` left for the accepted tokens at input_pos [B, n] (their attention
        `held`, what a verifying commit kept); nothing for a cache that only stores."""

    def settle(self, waiting: list, input_pos: Tensor) -> None:
        """Do the work that the caches in `waiting` (this one among them) left in `commit` for
        the step at input_pos [B, T]."""
        raise NotImplementedError

    @property
    def scheduled(self) -> bool:
        """Whether some of this cache's work falls on some positions only (a compression
        interval), so that the host tells it each step's positions (`before_step`) and the
        compiled step has a variant without that work."""
        return self.interval > 1

    def before_step(self, first: list, last: list) -> None:
        """Host side, before a step whose rows run from positions `first` to `last` (called
        by engine.runtime.steps.forward for `scheduled` caches): choose the step's work by
        position."""

    def after_step(self) -> None:
        """Host side, after the step: back to doing every position's work, which is what a
        graph compiled around the whole step (it never calls the host hooks) must do."""

    def before_chunk(self, first: list) -> None:
        """Host side, before a prompt chunk that Transformer.read_by_layer hands this cache (or
        a stack of caches), whose rows start at positions `first`."""

    def after_chunk(self) -> None:
        """Host side, after that chunk and the token steps it left."""

    def warmup_positions(self) -> tuple:
        """Positions, beyond 0 and 1, at which a step first takes another variant of the
        compiled step (a warm-up steps through them so that no compile lands in a timing)."""
        return ()

    def reset(self) -> None:
        raise NotImplementedError

    def mean_over_heads(self, x: Tensor) -> Tensor:
        """x [B, Hkv, ...] -> the mean over every KV head of the layer [B, 1, ...] (all ranks'
        heads under tensor parallelism)."""
        total = x.sum(dim=1, keepdim=True)
        if self.shard is None:
            return total / x.shape[1]
        return self.shard.all_reduce(total) / self.shard.total

    @property
    def head_offset(self) -> int:
        """Global index of this cache's first KV head."""
        return 0 if self.shard is None else self.shard.offset

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """x [B, H, T, D] rotated at positions [B, T]."""
        return apply_rope(x, self.rope[positions].unsqueeze(1))

    # The most caches alike that go as one (a policy that stacks them: RegionCache.stacked).
    stack_limit = 1

    @property
    def wave_limit(self) -> int:
        """The most caches alike that go as one in a prompt's wavefront, whose layers at work
        each read a different piece (Transformer.read_by_layer): one for a cache that keeps
        every token, whose chunk attends over the slots in use (RegionCache.live_slots): in a
        stack the rows of an earlier piece would attend over as many as the latest's (a 4k
        prompt of `quantized`: half again the attention)."""
        return 1 if self.keeps_every_token else self.stack_limit

    def alike(self) -> tuple:
        """What caches must share to go as one cache, a row per layer and row (a policy that
        can: RegionCache.stacked); by default a cache is alike only itself."""
        return (id(self),)

    def with_buffers(self, buffers: dict) -> "KVCache":
        """This cache with other buffers (name -> tensor, every name of its own): a shallow
        copy, the same settings, reading and writing `buffers` (a row's view, a stack of
        layers)."""
        other = copy.copy(self)
        other._buffers = dict(buffers)
        other.waiting = None
        return other

    def state(self) -> dict:
        """The buffers that hold the stream (the shared RoPE table excluded)."""
        return {name: b for name, b in self.named_buffers() if name != "rope"}

    # Buffers every row of a batch shares: the RoPE table and a layer's random key (CaM's
    # draws); all others hold one row per stream on dim 0.
    shared_buffers = ("rope", "rng_key")

    def row_buffers(self) -> dict:
        """The buffers that hold a row per stream (dim 0), by name."""
        return {name: b for name, b in self._buffers.items()
                if b is not None and name not in self.shared_buffers}

    @property
    def nbytes(self) -> int:
        """Exact bytes of the K/V storage and index maps (the shared RoPE table excluded)."""
        return sum(b.numel() * b.element_size() for b in self.state().values())
