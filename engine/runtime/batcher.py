"""Continuous batching: one decode loop steps every active stream together, over caches of any
policy, in constant memory.

The Batcher owns `slots` batch rows of caches and a thread that repeats:

    admit    the next waiting request takes a free row; a prompt that extends a row's kept
             history (a chat's next turn) reads only the new suffix
    prefill  the one row reading a prompt reads up to `prefill_tokens` more of it, alone (a
             batch-1 view of the caches): whole chunks of a compressing cache, pieces of the
             full cache; a fresh row's prompt that one-shot compression takes, all at once
    decode   one step of the fixed [slots, 1] batch: every other busy row reads one token (its
             last sampled one, or the remainder of its prompt, token by token); free rows are
             masked rows (a dummy token at position 0, output ignored), never a smaller shape
    sample   each row with its own parameters and generator; emit; finish rows at an EOS,
             max_tokens, the cache's positions, or a cancel

A row reads a prompt exactly as Session.append does (one shot, or whole chunks then token by
token; compiled or not, through the same `read_prompt`), so a stream's tokens equal the same
prompt run alone, whatever the other rows do. A long prompt is
read a piece per iteration while the other streams keep decoding; in their steps its row runs
a dummy token ahead of its stream and, for a cache whose commit compresses, is restored from a
scratch row after the step. A finished row keeps its history ("held") until a step would
touch it; then its state is copied into a preallocated pool of parked rows (least recently
used replaced), so conversations survive other traffic with no allocation.

Requests come from any thread (`submit`, `cancel`); rows and caches belong to the loop thread.
"""
from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from caches import CacheFactory, build_caches, make_cache_factory
from caches.snapkv import compresses_whole
from engine.runtime.generation import (check_prompt, compile_decode, compile_prompt, prefill,
                               prefill_chunk, read_prompt, row_view, warmup_positions)
from engine.runtime.sampling import distribution
from engine.runtime.steps import forward, reset_steps

DEFAULT_PREFILL_TOKENS = 512


class QueueFull(Exception):
    """Every slot is busy and the waiting queue is full."""


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0   # 0: greedy
    top_p: float = 1.0
    top_k: Optional[int] = None
    seed: Optional[int] = None


def sample_row(logits: Tensor, p: SamplingParams, generator: torch.Generator) -> int:
    """One token from logits [V] under temperature, top-k and nucleus (top-p) truncation."""
    if p.temperature <= 0:
        return int(logits.argmax())
    probs = distribution(logits, p.temperature, p.top_k, p.top_p)
    return int(torch.multinomial(probs, 1, generator=generator))


class Request:
    """One stream. Events go to `listener(kind, value)` (called on the loop thread) or, without
    one, to a queue that iterating the request reads:

        ("token", id)      a new token
        ("done", reason)   "stop" (an EOS), "length", "cancelled" or "error"
    """

    _ids = itertools.count()

    def __init__(self, prompt: list, params: SamplingParams, eos_ids=(),
                 listener: Optional[Callable[[str, object], None]] = None, device="cpu"):
        self.id = next(Request._ids)
        self.prompt = [int(t) for t in prompt]
        self.params = params
        self.eos = set(eos_ids)
        self.generator = torch.Generator(device=device)
        if params.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(params.seed)
        self.tokens: list = []         # generated so far
        self.cached_tokens = 0         # prompt tokens found in a kept history (not read again)
        self.finish_reason: Optional[str] = None
        self.error: Optional[str] = None
        self.cancelled = False
        self.submitted = time.perf_counter()
        self._listener = listener
        self._events: Optional[queue.Queue] = queue.Queue() if listener is None else None

    def emit(self, kind: str, value) -> None:
        if kind == "done":
            self.finish_reason = value
        if self._listener is not None:
            try:
                self._listener(kind, value)
            except RuntimeError:  # the listener's event loop closed (server shutting down)
                pass
        else:
            self._events.put((kind, value))

    def __iter__(self):
        """The new token ids as they come (blocking); ends when the request finishes."""
        while True:
            kind, value = self._events.get()
            if kind == "token":
                yield value
            else:
                if value == "error":
                    raise RuntimeError(self.error)
                return

    def result(self) -> list:
        """Wait for the end; the generated token ids."""
        for _ in self:
            pass
        return self.tokens


class _Row:
    """A batch row (or a parked row): batch-1 views of its caches and the tokens they hold."""

    def __init__(self, index: int, caches: list):
        self.index, self.caches = index, caches
        self.read: list = []          # tokens the caches have read, in order
        self.todo: list = []          # prompt tokens still to read
        self.next: Optional[int] = None   # sampled, read at the next step
        self.request: Optional[Request] = None
        self.dirty = False            # written by masked steps: reset before use
        self.used = 0.0               # when its history was last used (LRU)

    @property
    def held(self) -> bool:
        return self.request is None and bool(self.read)


def decode_logits(model, caches, token: Tensor, input_pos: Tensor) -> Tensor:
    """token [B, 1] at input_pos [B, 1] -> logits [B, V] (sampling is per row, outside)."""
    return forward(model, token, input_pos, caches)[:, -1]


def copy_row(src: list, dst: list) -> None:
    for a, b in zip(src, dst):
        for t, u in zip(a.row_buffers().values(), b.row_buffers().values()):
            u.copy_(t)


class Batcher:
    def __init__(self, model, make_cache: Optional[CacheFactory] = None, slots: int = 4,
                 max_seq_length: Optional[int] = None, max_queue: int = 16,
                 parked: Optional[int] = None, prefill_tokens: int = DEFAULT_PREFILL_TOKENS,
                 compile_backend=None, compile_prefill: bool = False,
                 bake_weights: bool = False):
        """
        Args:
            slots: streams decoded together (the batch of the one decode graph).
            max_queue: requests that may wait for a slot; beyond it `submit` raises QueueFull.
            parked: kept histories beyond the slots (preallocated rows; default: slots).
            prefill_tokens: the full cache reads a prompt in pieces of this many tokens
                (compressing caches: their chunk), which bounds attention's scratch memory.
            compile_backend: torch.compile the decode step with this backend (None: eager).
            compile_prefill: also compile prompt reads (as Session's): one graph for every row.
            bake_weights: the decode step with the weights baked in (as Session's).
        """
        self.model = model
        self.device = model.device
        self.make_cache = make_cache or make_cache_factory("full")
        self.slots, self.max_queue = slots, max_queue
        self.max_seq_length = max_seq_length or model.args.max_position_embeddings
        self.caches = build_caches(model, slots, self.max_seq_length, self.make_cache)
        self.unbounded = all(c.unbounded for c in self.caches)
        self.chunk = prefill_chunk(self.caches)  # None: the full cache, any piece length
        self.prefill_tokens = max(prefill_tokens, self.chunk or 2)
        self.step = decode_logits
        reset_steps(model)
        if compile_backend is not None:
            self.step = compile_decode(decode_logits, model, compile_backend, self.caches, slots,
                                       bake_weights=bake_weights)
        self.compiled_prefill = compile_prefill
        self.prefill_fn = compile_prompt(model, compile_backend or "inductor") \
            if compile_prefill else prefill
        self.origin = torch.zeros(1, 1, dtype=torch.long, device=self.device)  # a fresh row
        self.rows = [_Row(b, [row_view(c, b) for c in self.caches]) for b in range(slots)]
        n_parked = slots if parked is None else parked
        self.pool_caches = build_caches(model, n_parked, self.max_seq_length, self.make_cache) \
            if n_parked else []
        self.pool = [_Row(j, [row_view(c, j) for c in self.pool_caches]) for j in range(n_parked)]
        # where a row reading a prompt waits out a decode step (only caches that need it have
        # one: its presence is the test in _iteration)
        self.scratch_caches = [] if all(c.ahead_is_harmless for c in self.caches) else \
            build_caches(model, 1, self.max_seq_length, self.make_cache)
        self.scratch = _Row(0, list(self.scratch_caches))
        self.waiting: collections.deque = collections.deque()
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.stats = collections.Counter()
        self._stopping = False
        self._thread: Optional[threading.Thread] = None

    # ---- the public side (any thread) ----------------------------------------------------
    @property
    def cache_bytes(self) -> int:
        return sum(c.nbytes for c in (*self.caches, *self.pool_caches, *self.scratch_caches))

    @property
    def active(self) -> int:
        return sum(r.request is not None for r in self.rows)

    @property
    def queued(self) -> int:
        return len(self.waiting)

    def submit(self, prompt: list, params: SamplingParams, eos_ids=(),
               listener: Optional[Callable] = None) -> Request:
        """Queue a request. Raises UserError (a prompt that cannot be served) or QueueFull."""
        check_prompt(len(prompt), self.max_seq_length, self.unbounded)
        request = Request(prompt, params, eos_ids, listener, self.device)
        with self.lock:
            free = sum(r.request is None for r in self.rows)
            if len(self.waiting) >= self.max_queue + free:
                self.stats["rejected"] += 1
                raise QueueFull(f"all {self.slots} slots are busy and {self.max_queue} requests "
                                f"are waiting; retry later")
            self.waiting.append(request)
            self.stats["requests"] += 1
            self.wake.notify()
        return request

    def cancel(self, request: Request) -> None:
        """Stop a request; its row is freed at the next step (it keeps what it read)."""
        with self.lock:
            request.cancelled = True
            self.wake.notify()

    def start(self) -> "Batcher":
        """Run the loop in a thread of its own."""
        self._thread = threading.Thread(target=self._loop, name="batcher", daemon=True)
        self._thread.start()
        return self

    def run(self) -> None:
        """Run the loop in this thread until `stop` (from another thread). The main thread is
        the fastest place for it: on this project's CPUs a step run from a second thread took
        1.5x as long (OpenMP teams of a non-main thread)."""
        self._loop()

    def stop(self) -> None:
        self.stop_soon()
        if self._thread is not None:
            self._thread.join()

    def stop_soon(self) -> None:
        """Ask the loop to end after the step in progress (safe from a signal handler)."""
        self._stopping = True
        if self.lock.acquire(blocking=False):
            try:
                self.wake.notify()
            finally:
                self.lock.release()

    @torch.inference_mode()
    def warmup(self) -> float:
        """Compile (or just run) the decode step and a prompt chunk; returns the seconds."""
        t0 = time.perf_counter()
        token = torch.zeros(self.slots, 1, dtype=torch.long, device=self.device)
        for t in warmup_positions(self.caches):
            self.step(self.model, self.caches, token,
                      torch.full((self.slots, 1), t, device=self.device))
        if self.chunk is not None:
            row = self.rows[0]
            # two chunks where they fit: a piece read layer by layer compiles its chunk step
            twice = 2 * self.chunk < self.max_seq_length and 2 * self.chunk <= self.prefill_tokens
            self._read_prompt(row, [0] * (2 * self.chunk if twice else self.chunk), 0)
        for row in self.rows:
            self._reset(row)
        self.stats.clear()
        return time.perf_counter() - t0

    # ---- the loop thread -------------------------------------------------------------------
    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                with self.lock:
                    while not self._stopping and not self.waiting and not self.active:
                        self.wake.wait()
                    if self._stopping:
                        return
                    admitted = self._take_waiting()
                try:
                    for request in admitted:
                        self._admit(request)
                    self._iteration()
                except Exception as e:  # an engine failure ends the running streams, not the loop
                    for row in self.rows:
                        if row.request is not None:
                            row.request.error = f"{type(e).__name__}: {e}"
                            self._finish(row, "error")
                        self._reset(row)
                    for request in admitted:  # failed before it had a row
                        if request.finish_reason is None:
                            request.error = f"{type(e).__name__}: {e}"
                            request.emit("done", "error")

    def _take_waiting(self) -> list:
        """Under the lock: drop cancelled waiting requests; hand out the next one if a row is
        free and no row is reading a prompt in chunks (one at a time: it is the row that decode
        steps must leave untouched)."""
        for request in [r for r in self.waiting if r.cancelled]:
            self.waiting.remove(request)
            request.emit("done", "cancelled")
        free = any(r.request is None for r in self.rows)
        if not (free and self.waiting) or self._prompt_row() is not None:
            return []
        return [self.waiting.popleft()]

    def _in_prompt(self, row: _Row) -> bool:
        """The row has prompt left for prefill calls (more than decode steps read)."""
        return row.request is not None and (self._whole(row) or len(row.todo) >= (self.chunk or 2))

    def _whole(self, row: _Row) -> bool:
        """A fresh row's prompt that one-shot compression takes: read whole, in one call."""
        return not row.read and compresses_whole(row.caches, self.origin, len(row.todo))

    def _prompt_row(self) -> Optional[_Row]:
        return next((r for r in self.rows if self._in_prompt(r)), None)

    def _iteration(self) -> None:
        for row in self.rows:
            if row.request is not None and row.request.cancelled:
                self._finish(row, "cancelled")
        # prefill: the row reading a prompt reads up to prefill_tokens more of it (whole chunks
        # of a compressing cache, then the remainder token by token in decode steps; a prompt
        # compressed in one shot, whole: the same schedule as Session.append, so the stream is
        # exact whatever the other rows do)
        row = self._prompt_row()
        budget = self.prefill_tokens
        while row is not None and self._in_prompt(row) and not row.request.cancelled and budget > 0:
            if self._whole(row):
                take = len(row.todo)
            elif self.chunk:  # whole chunks, as many as the budget holds (read layer by layer)
                take = max(1, min(len(row.todo), budget) // self.chunk) * self.chunk
            else:
                take = min(len(row.todo), budget)
            logits = self._read_prompt(row, row.todo[:take], len(row.read))
            row.todo, budget = row.todo[take:], budget - take
            if not row.todo:
                self._deliver(row, logits[0])
        # decode: every other busy row reads one token; the rest are masked rows
        readers = [r for r in self.rows if r.request is not None and not self._in_prompt(r)]
        if not readers:
            return
        for row in self.rows:
            if row.request is None:
                if row.held:
                    self._park(row)
                row.dirty = True
        tokens = [0] * self.slots
        pos = [0] * self.slots
        for row in readers:
            tokens[row.index] = row.next if row.next is not None else row.todo[0]
            pos[row.index] = len(row.read)
        # A row halfway through its prompt runs a dummy token ahead of its stream (at its next
        # position); a cache whose commit compresses is restored after the step.
        midway = self._prompt_row()
        if midway is not None:
            self.stats["steps_beside_a_prompt"] += 1
            pos[midway.index] = len(midway.read)
            if self.scratch_caches:
                copy_row(midway.caches, self.scratch.caches)
        logits = self.step(self.model, self.caches,
                           torch.tensor(tokens, device=self.device).view(-1, 1),
                           torch.tensor(pos, device=self.device).view(-1, 1))
        if midway is not None and self.scratch_caches:
            copy_row(self.scratch.caches, midway.caches)
        self.stats["steps"] += 1
        for row in readers:
            row.read.append(tokens[row.index])
            if row.next is not None:
                row.next = None
                self._deliver(row, logits[row.index])
            else:
                row.todo.pop(0)
                self.stats["prefilled_tokens"] += 1
                if not row.todo:
                    self._deliver(row, logits[row.index])

    def _read_prompt(self, row: _Row, ids: list, start: int) -> Tensor:
        """Row `row` reads prompt tokens ids at positions start...; its logits [1, V] after."""
        dev = self.device
        tokens = torch.tensor([ids], dtype=torch.long, device=dev)
        logits = read_prompt(self.model, row.caches, tokens, torch.tensor([[start]], device=dev),
                             self.max_seq_length, self.prefill_fn, self.compiled_prefill)
        row.read += ids
        self.stats["prefilled_tokens"] += len(ids)
        return logits

    def _deliver(self, row: _Row, logits: Tensor) -> None:
        """Sample the row's next token and hand it to its request; finish the row if done."""
        request = row.request
        token = sample_row(logits, request.params, request.generator)
        request.tokens.append(token)
        self.stats["generated_tokens"] += 1
        request.emit("token", token)
        if token in request.eos:
            self._finish(row, "stop")
        elif len(request.tokens) >= request.params.max_tokens or \
                (not self.unbounded and len(row.read) + 1 >= self.max_seq_length):
            self._finish(row, "length")
        else:
            row.next = token

    def _finish(self, row: _Row, reason: str) -> None:
        """The row keeps what it read (held), for a request that continues the stream."""
        request, row.request = row.request, None
        row.next, row.todo, row.used = None, [], time.perf_counter()
        self.stats[f"finished_{reason}"] += 1
        request.emit("done", reason)

    # ---- rows and kept histories -----------------------------------------------------------
    def _reset(self, row: _Row) -> None:
        for c in row.caches:
            c.reset()
        row.read, row.todo, row.next, row.dirty = [], [], None, False

    def _park(self, row: _Row, keep: Optional[_Row] = None) -> None:
        """Copy a held row into the pool (replacing the least recently used, never `keep`),
        then free it."""
        pool = [p for p in self.pool if p is not keep]
        if pool:
            slot = min(pool, key=lambda p: (bool(p.read), p.used))
            copy_row(row.caches, slot.caches)
            slot.read, slot.used = row.read, row.used
            self.stats["parked"] += 1
        row.read = []
        row.dirty = True

    def _admit(self, request: Request) -> None:
        """Give the request a row: a held or parked history that its prompt extends if any
        (longest first), else a fresh one."""
        prompt = request.prompt

        def extends(r: _Row) -> int:
            n = len(r.read)
            return n if 0 < n < len(prompt) and prompt[:n] == r.read else 0

        held = [r for r in self.rows if r.request is None and not r.dirty]
        best = max(held + self.pool, key=extends, default=None)
        if best is not None and extends(best):
            if best in self.pool:
                row = self._free_row(keep=best)
                copy_row(best.caches, row.caches)
                row.read, row.used, row.dirty, best.read = best.read, best.used, False, []
            else:
                row = best
            request.cached_tokens = len(row.read)
            self.stats["cached_tokens"] += len(row.read)
        else:
            row = self._free_row()
            if row.dirty or row.read:
                self._reset(row)
        row.request, row.todo = request, prompt[len(row.read):]
        self.stats["prompt_tokens"] += len(prompt)

    def _free_row(self, keep: Optional[_Row] = None) -> _Row:
        """A row with no request: an empty one first, else the least recently used held one
        (parked first, never into `keep`)."""
        free = [r for r in self.rows if r.request is None]
        row = min(free, key=lambda r: (r.held, r.used))
        if row.held:
            self._park(row, keep)
        return row
