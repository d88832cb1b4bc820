"""Sessions: prefill + decode with sampling (gpt-fast's split), for any cache policy, over cache
state that outlives one call.

A Session owns one cache per layer (the model owns none, so sessions on one model are
independent) and the position of each batch row. `append` feeds tokens into the same caches,
positions continuing; `generate` continues from where the stream is; `save`/`load` keep the
whole state in a safetensors file. `Generator` is the one-shot form: every call starts afresh.

The decode step is one function of (model, caches, token, input_pos); compiled once with
fullgraph=True it serves every step of every turn, because every cache keeps static shapes and
is addressed by index tensors. Prefill pads the prompt to a power-of-two bucket when compiled,
so prompt lengths share a handful of graphs instead of one per length.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor

from caches import CacheFactory, build_caches, make_cache_factory
from caches.region import RegionCache
from core.errors import UserError
from caches.attention import through_cache
from core import kernels
from engine.runtime import speculative
from engine.runtime.prefill import (prefill, prefill_chunk, read_prompt, settle_left)
from engine.runtime.sampling import sample
from engine.runtime.steps import forward, reset_steps, run, steps
from model import Transformer, block_input, block_output
from quantize.dense import STREAM_ROWS, baking, baking_backend, stream_compiled_decode

SESSION_FORMAT = "regionkv-session"
SESSION_VERSION = 4  # bump when the saved layout changes; older files are refused by name


def decode_one_token(model: Transformer, caches, token: Tensor, input_pos: Tensor,
                     temperature: float, top_k: Optional[int]) -> Tensor:
    """token [B, 1] at input_pos [B, 1] -> the next token [B, 1]."""
    logits = forward(model, token, input_pos, caches)
    return sample(logits[:, -1], temperature, top_k)


def run_step(model: Transformer, idx: Tensor, input_pos: Tensor, caches) -> Tensor:
    return run(model, idx, input_pos, caches)


# A layer's step through its cache as one nested region, compiled once for every layer. A step
# with its weights baked in traces its blocks inline (a nested region's weights are its inputs,
# which that step must hold as constants), but the cache's step holds no weights, and traced
# inline in all 30 blocks it took most of that compile: `weightedkv` 127 s, 25 s this way
_THROUGH = torch.compiler.nested_compile_region(through_cache)


def through_region(cache, input_pos: Tensor, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    # q, k and v are views of one projection; a nested region takes no inputs that alias
    return _THROUGH(cache, input_pos, q.clone(), k.clone(), v.clone())


def run_baked_block(layer: torch.nn.Module, x: Tensor, input_pos: Tensor, cache) -> Tensor:
    return layer(x, input_pos, cache, through=through_region)


def run_inline_step(model: Transformer, idx: Tensor, input_pos: Tensor, caches,
                    block: Callable = run_baked_block) -> Tensor:
    """run_step with every block traced inline, for a step with its weights baked in; each
    block's step through its cache is one nested region (`through_region`)."""
    return run(model, idx, input_pos, caches, block=block)


_COMPRESS = {}  # backend -> RegionCache's compression steps compiled with it (shared by every
#                session): (token by token, one pass per chunk)
# Inductor's options for the compiled steps (backend "inductor"). Its wrapper checks every
# input's sizes and strides before the kernels run: 320 checks a step in the CPU step graph
# (0.4-0.9 ms). Dynamo's guards have already checked the graph's inputs, and a nested block
# region's inputs come from the graph itself.
COMPRESS_OPTIONS = {"size_asserts": False}
# The CPU step graph goes without reorder_for_locality too: the pass sinks the attention's read
# of V (its product feeds only the output projection) below the cache's commit, which writes V
# again; a buffer read after a write cannot be updated in place, so the step copied all of V
# once a block. Without the pass every cache write stays in place.
STEP_OPTIONS = {**COMPRESS_OPTIONS, "reorder_for_locality": False}


def compile_decode(fn: Callable, model: Transformer, backend="inductor", caches=(),
                   rows: int = 1, whole_step: Optional[bool] = None,
                   bake_weights: bool = False) -> Callable:
    """Compile a single-token step function `fn(model, caches, token, input_pos, ...)` for the
    model's device. In both forms every block runs through one nested compiled region
    (`torch.compiler.nested_compile_region`): compiled once and stamped out per layer, so
    compiling takes seconds, not the minutes of 30 unrolled blocks with their compression.

    whole_step (the default on CUDA): `fn` itself, sampling included, is one graph, replayed as
    a CUDA graph (mode="reduce-overhead"), which removes the per-kernel launch cost that
    dominates small-batch decode.
    Otherwise (CPU): the model's single-token forward (embedding, blocks, head) is one graph,
    with one guard check and one call a step, and sampling stays eager. With at most
    STREAM_ROWS `rows` a step, the blocks' float linears (and a tied head) read a plain copy of
    their weights through the engine's GEMV kernel (kernels/; where it does not build, as a
    reduction that Inductor fuses and streams: quantize/dense.py), and attention reads each
    float stretch of the cache through its scores and mix kernels.
    Prompt chunks stay eager; those of compressing `caches` compress token by token through one
    compiled step (or in one compiled pass, with bulk prompt compression), on either device.

    bake_weights (CPU, Inductor): the step graph inlines its blocks and holds the linears'
    weights as constants, each product a GEMM kernel of Inductor's own generated into the
    graph (quantize.dense.baking_backend): 25-30% faster bfloat16 steps on an AMX CPU, for a
    longer compile (20-30 s, in every process: Inductor's caches do not serve a frozen graph).
    """
    allow_many_graphs()
    if model.device.type == "cpu":
        kernels.available()  # built before a trace asks (a trace cannot build)
    if whole_step is None:
        whole_step = model.device.type == "cuda"
    compiled = steps(model)
    compiled.blocks = True
    inductor = backend == "inductor"
    if backend not in _COMPRESS:  # keyed by the backend itself: a test's counter stays alive
        _COMPRESS[backend] = [torch.compile(f, fullgraph=True, dynamic=False, backend=backend,
                                            options=COMPRESS_OPTIONS if inductor else None)
                              for f in (RegionCache.compress_step, RegionCache.compress_bulk)]
    for cache in caches:
        if isinstance(cache, RegionCache):
            cache.compiled_compress, cache.compiled_bulk = _COMPRESS[backend]
    if whole_step:
        compiled.graph = None
        if model.device.type != "cuda":  # a graph traced whole, as CUDA's, without CUDA graphs
            return torch.compile(fn, fullgraph=True, dynamic=False, backend=backend)
        # The caches are inputs of the graph, written in place: their buffers keep fixed
        # addresses, so the CUDA graph reads and writes them directly instead of copying.
        for cache in caches:
            for buf in cache.buffers():
                torch._dynamo.mark_static_address(buf)
        return torch.compile(fn, mode="reduce-overhead", fullgraph=True, backend=backend)
    if bake_weights and inductor:
        compiled.graph = baked_step(model)
        return fn
    if rows <= STREAM_ROWS:
        stream_compiled_decode(model)
    compiled.graph = torch.compile(run_step, fullgraph=True, dynamic=False, backend=backend,
                                     options=STEP_OPTIONS if inductor else None)
    return fn


def baked_step(model: Transformer) -> Callable:
    """The model's CPU step graph with its linear weights baked in (compile_decode), one backend
    per model: dynamo keeps a graph per backend, so another model never runs this one's
    weights, and a new session of this model finds its graph compiled."""
    if getattr(model, "baking_backend", None) is None:
        model.baking_backend = baking_backend(model, STEP_OPTIONS)
    backend = model.baking_backend
    graph = torch.compile(run_inline_step, fullgraph=True, dynamic=False, backend=backend)

    def step(*args):
        graphs = backend.graphs
        with baking():  # the linears read their weights as constants (PackedLinear.forward)
            logits = graph(*args)
        if backend.graphs != graphs:  # this call compiled: give back the heap the compile freed
            release_freed_heap()
        return logits
    return step


def release_freed_heap() -> bool:
    """Return to the system the heap that freed memory left in the process: glibc keeps it,
    ~420 MiB after a baked step's compile on the default model, which stays resident
    otherwise. False where the C library has no malloc_trim."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


def allow_many_graphs() -> None:
    """One graph per cache policy and batch shape for each compiled function (the decode step,
    the chunk step: one function for all): a process that compiles many of them (bench.py,
    sweeps) needs more than dynamo's default 8. A stack of caches (RegionCache.stacked) is one
    graph for every height: its rows are marked dynamic, which dynamo ignores in a module's
    buffers unless told (graphs compiled with dynamic=False hold every unmarked size static)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    torch._dynamo.config.force_nn_module_property_static_shapes = False
    torch._dynamo.config.force_parameter_static_shapes = False


def compile_prompt(model: Transformer, backend="inductor") -> Callable:
    """`prefill` compiled for prompt reads (a chunk of compressing caches, a fresh prompt's
    length bucket of the full cache): its blocks run through one nested compiled region,
    compiled once instead of unrolled (minutes with compression in every block), and the token
    steps its caches leave out of the graph run after it (`settling`). Prompts that
    `read_prompt` takes layer by layer go through the model's `steps(model).chunk`, set here:
    one layer's step through its cache over a chunk, compiled once for every layer (the token
    steps it leaves settle in engine.runtime.prefill.read_by_layer, with the other layers')."""
    allow_many_graphs()
    if model.device.type == "cpu":
        kernels.available()  # built before a trace asks (a trace cannot build)
    compiled = steps(model)
    compiled.blocks = True
    compiled.chunk = torch.compile(through_cache, fullgraph=True, dynamic=False,
                                     backend=backend,
                                     options=COMPRESS_OPTIONS if backend == "inductor" else None)
    # A layer's norms, linears and MLP over a piece of rows: one graph for every layer and
    # every piece length (the warm-up's pieces are shorter than a long prompt's).
    compiled.pieces = tuple(rows_dynamic(torch.compile(f, fullgraph=True, dynamic=False,
                                                         backend=backend))
                              for f in (block_input, block_output))
    return settling(torch.compile(prefill, fullgraph=True, dynamic=False, backend=backend))


def rows_dynamic(graph: Callable) -> Callable:
    """graph(layer, x [B, T, dim], *y [B, H, T, D]) compiled for any T: only the rows are
    dynamic (every size dynamic, Inductor copies y's heads element by element through
    symbolic strides, 14x slower)."""
    def call(layer, x: Tensor, *y: Tensor):
        torch._dynamo.maybe_mark_dynamic(x, 1)
        for t in y:
            torch._dynamo.maybe_mark_dynamic(t, 2)
        return graph(layer, x, *y)
    return call


def settling(chunk_graph: Callable) -> Callable:
    """A compiled prompt chunk `chunk_graph(model, caches, tokens, input_pos, last)` followed by
    the token steps its caches left out of the graph (RegionCache.commit), every layer at once
    as after an eager chunk."""
    def chunk(model: Transformer, caches, tokens: Tensor, input_pos: Tensor, last: Tensor):
        logits = chunk_graph(model, caches, tokens, input_pos, last)
        settle_left(caches, input_pos.expand(tokens.shape))
        return logits
    return chunk


def warmup_positions(caches) -> list:
    """Positions a warm-up steps through: 0 and 1 (the second confirms the graph is reused),
    then each position where a cache's step first takes another variant (the first pass of a
    compression interval, LagKV's first partition scoring), so every variant compiles."""
    return sorted({0, 1}.union(*(c.warmup_positions() for c in caches)))


class TokenLog:
    """The tokens [B, 1] a decode loop makes, copied into blocks of BLOCK columns allocated as
    they fill. Kept one small tensor a step, every kept token sat in malloc's heap between
    that step's freed temporaries and split them: the heap grew by 35-170 KB a token in long
    runs while the memory in use stayed flat."""
    BLOCK = 4096

    def __init__(self, first: Tensor):
        self.blocks, self.n = [], 0
        self.append(first)

    def append(self, token: Tensor) -> None:
        at = self.n % self.BLOCK
        if at == 0:
            self.blocks.append(token.new_empty(token.shape[0], self.BLOCK))
        self.blocks[-1][:, at:at + 1].copy_(token)
        self.n += 1

    def __len__(self) -> int:
        return self.n

    def tolist(self) -> list:
        """Every row's tokens, in order."""
        return torch.cat(self.blocks, 1)[:, :self.n].tolist()


@dataclass
class Generation:
    token_ids: list                 # every token of each row's stream so far (prompt + new)
    new_tokens: int                 # new tokens of the first row
    prefill_s: float
    decode_s: float
    stopped_at_eos: bool
    new_ids: list = field(default_factory=list)  # each row's new tokens, up to its first EOS

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: tokens made by decode steps (all but the first) per second."""
        return (self.new_tokens - 1) / self.decode_s if self.new_tokens > 1 and self.decode_s > 0 else 0.0


def model_fingerprint(model: Transformer) -> str:
    """Identifies the weights a cache was computed with: config, weight kind, a few values
    (rounded to bfloat16, so that one model in two dtypes is told apart by its dtype instead)."""
    h = hashlib.sha1(json.dumps(model.args.to_dict(), sort_keys=True).encode())
    # oneDNN's packed layout (quantize/dense.py) holds the same float weights as nn.Linear
    head = type(model.output).__name__
    h.update(("Linear" if head == "PackedLinear" else head).encode())
    for t in (model.norm.weight, model.tok_embeddings.weight[:2]):
        h.update(t.detach().to(torch.bfloat16).float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


class Session:
    """A stream's cache state that outlives one call.

        session = Session(model, make_cache=make_cache_factory("weightedkv", cache_size=256))
        session.append(tok.encode(document))
        session.save("doc.session")
        reply = session.generate(100, eos_ids=tok.eos_ids)
        session.append(tok.encode(next_turn, bos=False))   # same caches, positions continue

    batch_size rows are independent streams, each at its own position; `append` takes one id
    list (every row) or one list per row, of any lengths. After `generate`, the last sampled
    token of each row is pending: the next `append` or `generate` feeds it first, so the cache
    holds every token of the stream exactly once.
    """

    def __init__(self, model: Transformer, make_cache: Optional[CacheFactory] = None,
                 max_seq_length: Optional[int] = None, batch_size: int = 1,
                 compile: bool = False, compile_prefill: bool = False,
                 bake_weights: bool = False, speculation=None):
        """
        Args:
            make_cache: a caches.make_cache_factory(...) result (default: the full cache).
            max_seq_length: positions the stream may reach (full cache, original positions),
                or the RoPE table that rank positions need (default: the model's context).
            compile: compile the decode step; compile_prefill: also prompt chunks.
            bake_weights: compile the CPU decode step with the weights baked in (faster
                steps, a longer compile: compile_decode).
            speculation: an engine.runtime.speculative.Speculation (a draft and k): generate
                by speculative decoding (one row; a compressing cache must compress on a
                schedule, 1 < `compression_interval` <= chunk - k, so that its output stays
                exact).
        """
        self.model = model
        self.device = model.device
        self.make_cache = make_cache or make_cache_factory("full")
        self.max_seq_length = max_seq_length or model.args.max_position_embeddings
        self.batch_size = batch_size
        self.caches = build_caches(model, batch_size, self.max_seq_length, self.make_cache)
        # Caches that rotate keys by rank (rank positions) never run out of positions.
        self.unbounded = all(c.unbounded for c in self.caches)
        self.prefill_chunk = prefill_chunk(self.caches)
        self.compiled_prefill = compile_prefill
        self.decode_fn = decode_one_token
        self.prefill_fn = prefill
        reset_steps(model)
        if compile:
            self.decode_fn = compile_decode(decode_one_token, model, caches=self.caches,
                                            rows=batch_size, bake_weights=bake_weights)
        if compile_prefill:
            self.prefill_fn = compile_prompt(model)
        self.speculation, self.verify_graph = speculation, None
        if speculation is not None:
            speculative.check(self, speculation)
            draft = getattr(speculation.draft, "model", None)
            if compile:  # the verify step of k + 1 tokens, and the draft model's step
                self.verify_graph = speculative.VerifyGraph(speculation.k + 1)
                if draft is not None and draft is not model:
                    compile_decode(decode_one_token, draft, caches=speculation.draft.caches)
                elif draft is not None:  # the target's step graph serves; its compression too
                    for cache in speculation.draft.caches:
                        if isinstance(cache, RegionCache):
                            cache.compiled_compress, cache.compiled_bulk = _COMPRESS["inductor"]
        self.reset()

    # ---- state -----------------------------------------------------------------------------
    def reset(self) -> None:
        """Empty every row: no tokens, position 0."""
        for cache in self.caches:
            cache.reset()
        self.tokens = [[] for _ in range(self.batch_size)]  # what each row's cache has read
        self.pending: Optional[Tensor] = None  # [B, 1] sampled, not yet read
        self.logits: Optional[Tensor] = None   # [B, V] next-token logits after an append
        self._append_s = 0.0
        if getattr(self, "speculation", None) is not None:
            reset = getattr(self.speculation.draft, "reset", None)
            if reset:
                reset()

    @property
    def positions(self) -> list:
        """Tokens each row has seen (its next position), the pending token included."""
        extra = 1 if self.pending is not None else 0
        return [len(t) + extra for t in self.tokens]

    @property
    def cache_bytes(self) -> int:
        return sum(c.nbytes for c in self.caches)

    def _room(self, n_more: int) -> None:
        if self.unbounded:
            return
        reach = max(self.positions) + n_more
        if reach > self.max_seq_length:
            raise UserError(f"the stream would reach {reach} tokens but this session holds "
                            f"{self.max_seq_length} positions; start a new session, raise "
                            f"`max_seq_length`, or use rank positions (`positions` cache) with "
                            f"a compressing cache")

    # ---- feeding tokens --------------------------------------------------------------------
    @torch.inference_mode()
    def append(self, ids) -> None:
        """Feed more tokens into the same caches (a prompt, a document, the next chat turn).

        ids: token ids for every row, or one list per row (lengths may differ)."""
        rows = ids if ids and isinstance(ids[0], (list, tuple)) else [ids] * self.batch_size
        if len(rows) != self.batch_size:
            raise UserError(f"expected token ids for {self.batch_size} row(s), got {len(rows)}")
        if any(len(r) == 0 for r in rows):
            raise UserError("nothing to append: the text is empty after tokenization")
        rows = [list(map(int, r)) for r in rows]
        self._room(max(len(r) for r in rows))  # (positions count the pending token already)
        if self.pending is not None:  # the last generated token enters the cache first
            rows = [[p] + r for p, r in zip(self.pending.view(-1).tolist(), rows)]
            self.pending = None
        t0 = time.perf_counter()
        if len({len(r) for r in rows}) == 1:
            self.logits = self._prefill(list(range(self.batch_size)), rows)
        else:  # rows of different lengths: each row through a batch-1 view of the caches
            self.logits = torch.cat([self._prefill([b], [r]) for b, r in enumerate(rows)])
        for b, r in enumerate(rows):
            self.tokens[b] += r
        read = getattr(getattr(self.speculation, "draft", None), "read_stream", None)
        if read:  # a draft model reads the prompt too, as prefill
            read(self.tokens[0])
        sync(self.device)
        self._append_s += time.perf_counter() - t0

    @torch.inference_mode()
    def append_shared(self, ids) -> None:
        """append(ids) to every row of an empty session, reading ids once: row 0 reads them and
        the other rows get copies of its cache state (what each would have read itself), so a
        batch of B streams with one long prompt costs one prompt's prefill, not B."""
        if any(self.tokens) or self.pending is not None:
            raise UserError("append_shared starts a session: reset it first")
        ids = list(map(int, ids))
        if not ids:
            raise UserError("nothing to append: the text is empty after tokenization")
        self._room(len(ids))
        t0 = time.perf_counter()
        logits = self._prefill([0], [ids])
        for cache in self.caches:
            for buf in cache.row_buffers().values():
                buf[1:].copy_(buf[:1].expand_as(buf[1:]))
        self.logits = logits.expand(self.batch_size, -1).contiguous()
        self.tokens = [list(ids) for _ in range(self.batch_size)]
        sync(self.device)
        self._append_s += time.perf_counter() - t0

    def _prefill(self, row_ids: list, rows: list) -> Tensor:
        """Run rows (equal lengths) of the batch rows `row_ids` through their caches; return the
        logits [len(row_ids), V] after their last token."""
        caches = self.caches if len(row_ids) == self.batch_size else \
            [row_view(c, row_ids[0]) for c in self.caches]
        dev = self.device
        start = torch.tensor([len(self.tokens[b]) for b in row_ids], device=dev).view(-1, 1)
        tokens = torch.tensor(rows, dtype=torch.long, device=dev)
        return read_prompt(self.model, caches, tokens, start, self.max_seq_length,
                           self.prefill_fn, self.compiled_prefill)

    # ---- generating ------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, max_new_tokens: int, temperature: float = 0.0,
                 top_k: Optional[int] = None, eos_ids=(),
                 callback: Optional[Callable[[int], None]] = None) -> Generation:
        """Continue every row by up to max_new_tokens (fewer where a bounded stream ends, or
        once every row has sampled an EOS). callback(token_id) receives every new token of the
        first row as it is made.

        Raises:
            UserError: nothing was appended yet.
        """
        if self.logits is None and self.pending is None:
            raise UserError("the session is empty: append a prompt before generating")
        if not self.unbounded:  # every new token but the last is read; the last needs room too
            max_new_tokens = min(max_new_tokens, self.max_seq_length - max(self.positions))
        if max_new_tokens < 1:
            raise UserError(f"the session's {self.max_seq_length} positions are all used; start a "
                            f"new session or raise `max_seq_length`")
        if self.speculation is not None:
            return self._speculate(max_new_tokens, temperature, top_k, eos_ids, callback)
        dev = self.device
        eos = torch.tensor(sorted(set(eos_ids)) or [-1], device=dev)
        pos = torch.tensor(self.positions, device=dev).view(-1, 1)
        sync(dev)
        t0 = time.perf_counter()
        if self.pending is not None:  # continue a generation: read its last token first
            token = self.decode_fn(self.model, self.caches, self.pending, pos - 1, temperature,
                                   top_k).clone()
            for b, p in enumerate(self.pending.view(-1).tolist()):
                self.tokens[b].append(p)
        else:
            token = sample(self.logits, temperature, top_k)
        self.logits, self.pending = None, None
        before = [list(t) for t in self.tokens]  # the stream so far, all read
        out = TokenLog(token)
        finished = torch.isin(token.view(-1), eos)
        # Reading the new token (to stream it and stop at EOS) is the loop's only host sync.
        # Without EOS ids or a callback nothing is read back, so a GPU runs steps back to back
        # while the host prepares the next ones.
        stops = bool(eos_ids)
        first = token[0, 0].item()
        if callback:
            callback(first)
        sync(dev)
        t1 = time.perf_counter()
        while len(out) < max_new_tokens and not (stops and bool(finished.all())):
            token = self.decode_fn(self.model, self.caches, token, pos, temperature, top_k).clone()
            pos = pos + 1
            out.append(token)
            if stops:
                finished |= torch.isin(token.view(-1), eos)
            if callback:
                callback(token[0, 0].item())
        sync(dev)
        t2 = time.perf_counter()

        new = out.tolist()
        for b, r in enumerate(new):  # all but the last token were read (a row past its EOS too)
            self.tokens[b] += r[:-1]
        self.pending = token
        prefill_s, self._append_s = self._append_s + (t1 - t0), 0.0
        cut = [cut_at_eos(r, set(eos_ids)) for r in new]
        return Generation(token_ids=[b + c for b, c in zip(before, cut)], new_tokens=len(cut[0]), prefill_s=prefill_s,
                          decode_s=t2 - t1, stopped_at_eos=bool(finished.all()), new_ids=cut)

    def _speculate(self, max_new_tokens: int, temperature: float, top_k, eos_ids,
                   callback) -> Generation:
        """generate's loop by speculative decoding (engine/runtime/speculative.py)."""
        eos = set(eos_ids)
        t0 = time.perf_counter()
        if self.pending is not None:  # given out by the last call; read by the first step
            first, new = int(self.pending), []
            before = self.tokens[0] + [first]
        else:
            first = int(sample(self.logits, temperature, top_k))
            new, before = [first], list(self.tokens[0])
            max_new_tokens -= 1
            if callback:
                callback(first)
        self.logits, self.pending = None, None
        t1 = time.perf_counter()
        self.spec_stats = speculative.Stats()
        if not (eos and first in eos and new):
            new += speculative.speculate(self, self.speculation, first, len(self.tokens[0]),
                             max_new_tokens, temperature, top_k, eos, callback,
                             self.spec_stats)
        sync(self.device)
        t2 = time.perf_counter()
        if not new:  # nothing made: the pending token stays unread
            self.pending = torch.tensor([[first]], device=self.device)
        else:
            self.pending = torch.tensor([[new[-1]]], device=self.device)
        prefill_s, self._append_s = self._append_s + (t1 - t0), 0.0
        cut = cut_at_eos(new, eos)
        return Generation(token_ids=[before + cut], new_tokens=len(cut), prefill_s=prefill_s,
                          decode_s=t2 - t1, stopped_at_eos=bool(eos & set(cut)),
                          new_ids=[cut])

    @torch.inference_mode()
    def warmup(self, temperature: float = 0.0, top_k: Optional[int] = None) -> float:
        """Compile (or just run) the decode step, and a prompt chunk of compressing caches, so
        timings exclude compilation; returns the seconds it took. The session is reset after."""
        t0 = time.perf_counter()
        self.reset()
        token = torch.zeros(self.batch_size, 1, dtype=torch.long, device=self.device)
        for t in warmup_positions(self.caches):
            self.decode_fn(self.model, self.caches, token,
                           torch.full((self.batch_size, 1), t, device=self.device),
                           temperature, top_k)
        if self.speculation is not None:
            speculative.warm_up(self, temperature, top_k)
        chunk = self.prefill_chunk
        if chunk is not None and chunk < self.max_seq_length:  # compiles chunk compression
            self.reset()
            # two chunks where they fit: a prompt read layer by layer compiles its chunk step
            # (one-pass caches read them as a wavefront of two one-chunk pieces: a cache alone
            # and a stack of two, so both steps compile here)
            self.append([0] * (2 * chunk if 2 * chunk < self.max_seq_length else chunk))
        if chunk is not None and 3 * chunk < self.max_seq_length and \
                any(c.takes_token_steps(chunk) for c in self.caches):
            # A long prompt of token-step caches goes as a wavefront (read_prompt): three
            # chunks in pieces of one put a cache alone and a stack of layers to work, so that
            # the steps of both compile here.
            self.reset()
            with torch.inference_mode():
                read_prompt(self.model, self.caches,
                            torch.zeros(self.batch_size, 3 * chunk, dtype=torch.long,
                                        device=self.device),
                            torch.zeros(self.batch_size, 1, dtype=torch.long, device=self.device),
                            self.max_seq_length, self.prefill_fn, self.compiled_prefill, chunk)
        sync(self.device)
        self.reset()
        return time.perf_counter() - t0

    # ---- saving ----------------------------------------------------------------------------
    def save(self, path) -> None:
        """Write the whole state (every layer's cache, positions, statistics, pending token or
        next logits, token history) to a safetensors file, atomically."""
        from safetensors.torch import save_file

        from engine.loading.files import atomic_path
        tensors = {f"layers.{i}.{name}": t.contiguous().cpu()
                   for i, c in enumerate(self.caches) for name, t in c.state().items()}
        tensors["session.lengths"] = torch.tensor([len(t) for t in self.tokens], dtype=torch.long)
        tensors["session.tokens"] = torch.tensor(sum(self.tokens, []) or [0], dtype=torch.long)
        if self.pending is not None:
            tensors["session.pending"] = self.pending.cpu()
        if self.logits is not None:
            tensors["session.logits"] = self.logits.cpu()
        meta = {"format": SESSION_FORMAT, "version": str(SESSION_VERSION),
                "model": model_fingerprint(self.model), "cache": json.dumps(self.make_cache.spec),
                "batch_size": str(self.batch_size), "max_seq_length": str(self.max_seq_length),
                "dtype": str(self.model.dtype).removeprefix("torch.")}
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata=meta)

    @classmethod
    def load(cls, path, model: Transformer, make_cache: Optional[CacheFactory] = None,
             max_seq_length: Optional[int] = None, **kwargs) -> "Session":
        """A session saved by `save`, on `model`. Pass make_cache / max_seq_length to insist on
        them (a file made for others is refused); by default the file's own are used.

        Raises:
            UserError: the file is missing, damaged, of an older format, or made for another
                model, dtype, cache policy or size.
        """
        from core.tensors import read_safetensors
        meta = read_session_metadata(path)
        where = f"session file {path}"
        if meta["model"] != model_fingerprint(model):
            raise UserError(f"{where} was saved with another model; load it with the model "
                            f"that made it")
        dtype = str(model.dtype).removeprefix("torch.")
        if meta["dtype"] != dtype:
            raise UserError(f"{where} holds {meta['dtype']} caches, the model runs {dtype}; load "
                            f"the model in {meta['dtype']}")
        try:
            spec = json.loads(meta["cache"])
            saved_len, batch = int(meta["max_seq_length"]), int(meta["batch_size"])
            factory = CacheFactory.from_spec(spec)
        except (ValueError, TypeError, KeyError, AttributeError, UserError):
            raise UserError(f"{where} is damaged: its cache settings cannot be read") from None
        if make_cache is not None and make_cache.spec != spec:
            raise UserError(f"{where} was saved with cache {describe_spec(spec)}, not "
                            f"{describe_spec(make_cache.spec)}; load it with its own settings")
        if max_seq_length is not None and max_seq_length != saved_len:
            raise UserError(f"{where} holds {saved_len} positions, not {max_seq_length}")
        if not 1 <= batch <= 4096 or not 1 <= saved_len <= 2**24:
            raise UserError(f"{where} is damaged: batch {batch}, {saved_len} positions")
        state = read_safetensors(path)
        session = cls(model, factory, saved_len, batch, **kwargs)
        for i, c in enumerate(session.caches):
            for name, buf in c.state().items():
                t = state.get(f"layers.{i}.{name}")
                if t is None or t.shape != buf.shape or t.dtype != buf.dtype:
                    raise UserError(f"{where} is damaged: layer {i} {name} is missing or of "
                                    f"another shape")
                buf.copy_(t)
        V = model.args.vocab_size
        lengths, flat = state.get("session.lengths"), state.get("session.tokens")
        pending, logits = state.get("session.pending"), state.get("session.logits")
        ok = (lengths is not None and flat is not None and lengths.shape == (batch,)
              and bool((lengths >= 0).all()) and int(lengths.sum()) <= flat.numel()
              and bool(((flat >= 0) & (flat < V)).all())
              and (pending is None or (pending.shape == (batch, 1)
                                       and bool(((pending >= 0) & (pending < V)).all())))
              and (logits is None or logits.shape == (batch, V)))
        if not ok:
            raise UserError(f"{where} is damaged: its token history does not fit the model")
        lengths, flat = lengths.tolist(), flat.tolist()
        starts = [sum(lengths[:b]) for b in range(batch)]
        session.tokens = [flat[a:a + n] for a, n in zip(starts, lengths)]
        dev = session.device
        if pending is not None:
            session.pending = pending.to(dev)
        if logits is not None:
            session.logits = logits.to(dev)
        return session


def read_session_metadata(path) -> dict:
    from pathlib import Path

    from safetensors import safe_open
    path = Path(path)
    if not path.is_file():
        raise UserError(f"session file {str(path)!r} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as e:  # safetensors raises its own error types for a damaged file
        raise UserError(f"cannot read session file {path}: {str(e).splitlines()[0]} (a damaged "
                        f"or truncated file?)") from None
    if meta.get("format") != SESSION_FORMAT:
        raise UserError(f"{path} is not a saved session (a safetensors file of another kind)")
    if meta.get("version") != str(SESSION_VERSION):
        raise UserError(f"session file {path} has format version {meta.get('version')}; this "
                        f"engine reads version {SESSION_VERSION}: save the session again")
    missing = {"model", "cache", "batch_size", "max_seq_length", "dtype"} - set(meta)
    if missing:
        raise UserError(f"session file {path} is damaged: no {', '.join(sorted(missing))}")
    return meta


def describe_spec(spec: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in spec.items())


def row_view(cache, b: int):
    """Cache `cache` seen as batch row b alone: its buffers are views of row b, so in-place
    writes land in the batched buffers (a row's prompt is prefilled on its own)."""
    return cache.with_buffers({**cache._buffers, **{name: t[b:b + 1] for name, t
                                                    in cache.row_buffers().items()}})


class Generator(Session):
    """One-shot generation: every `generate(prompt, ...)` starts the session afresh."""

    def __init__(self, model: Transformer, max_seq_length: int, batch_size: int = 1,
                 make_cache=None, compile: bool = False, compile_prefill: bool = False,
                 bake_weights: bool = False, speculation=None):
        super().__init__(model, make_cache, max_seq_length, batch_size, compile, compile_prefill,
                         bake_weights, speculation)

    def check_prompt(self, n_prompt: int) -> None:
        check_prompt(n_prompt, self.max_seq_length, self.unbounded)

    def generate(self, prompt: list, max_new_tokens: int, temperature: float = 0.0,
                 top_k: Optional[int] = None, eos_ids=(),
                 callback: Optional[Callable[[int], None]] = None) -> Generation:
        """prompt: token ids (one sequence, for every row) or one list per row (any lengths).
        callback(token_id) receives every new token of the first row."""
        rows = prompt if prompt and isinstance(prompt[0], (list, tuple)) else [prompt]
        if len(rows) == 1 and self.batch_size > 1:
            rows = rows * self.batch_size
        if len(rows) != self.batch_size:
            raise UserError(f"expected {self.batch_size} prompts, got {len(rows)}")
        self.check_prompt(max(len(r) for r in rows))
        self.reset()
        self.append(rows)
        return super().generate(max_new_tokens, temperature, top_k, eos_ids, callback)


def check_prompt(n_prompt: int, max_seq_length: int, unbounded: bool) -> None:
    """A prompt of n_prompt tokens must be non-empty and, in a bounded stream, leave a position
    for the first new token."""
    if n_prompt == 0:
        raise UserError("the prompt is empty after tokenization; pass a non-empty prompt")
    if n_prompt >= max_seq_length and not unbounded:
        raise UserError(f"the prompt is {n_prompt} tokens but a stream holds {max_seq_length} "
                        f"positions; raise `max_seq_length` above {n_prompt} or shorten the "
                        f"prompt")


def cut_at_eos(ids: list, eos: set) -> list:
    """Keep tokens up to and including the first EOS."""
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
