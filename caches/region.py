"""The region cache: sink + middle + window in static buffers, compressed in place.

One layer's cache holds `budget = sink + middle + window` retained tokens plus `chunk` staging
slots for the tokens being written (use-then-compress: new tokens are attended together with
everything retained, then the cache compresses back to the budget).

Physical layout (slot order is irrelevant to attention; every decision reads `pos`):
    fast slots [0, sink + window + chunk)   model dtype: sink slots, then a ring for the window
    middle slots [0, middle + 1)            model dtype or INT8: a row of D/4 + 1 32-bit words
                                            a slot, codes four to a word, then the per-token,
                                            per-head scale (quantize/kv.py)
Index maps and statistics cover the concatenation fast ++ middle ("global" slots, C in all):
    pos [B, Hkv, C]    int32 absolute position of each slot's token, -1 = empty
    <stat> [B, Hkv, C] float32 per-slot statistics named by the policy (`stats`)
A middle in the model dtype shares one K and one V buffer with the fast slots (k_fast and k_mid
are views of k), so attention reads one stretch and, without probabilities, runs fused SDPA.

Every step is update, attention, commit: write the new tokens into their ring slots; attend;
`commit` hands the probabilities to the policy's statistics (only when `wants_probs`), then for
each new token: the token leaving the window moves into a free middle slot (quantized when the
middle is int8) and, if the middle is over its share, the policy picks a victim per KV head and
evicts or merges it. Every batch row has its own positions. No host syncs, no data-dependent
shapes: conditions are tensors used in `torch.where`, indices are tensors used in gather/scatter.

A policy subclasses RegionCache and overrides a few hooks (cur [B, 1, 1] is the position of
the token just attended, per row):
    accumulate(p, positions)  statistics from attention p [B, Hkv, T, C] (policies with
                              wants_probs; positions [B, T])
    score(cur)                per-slot score [B, Hkv, C]: the middle slot with the lowest goes
    remove(victim, do, cur)   evict (default) or merge the victim
    remove_bulk(victims, do, cur)   the same for several victims per head at once (bulk
                              prompt compression, below)
    middle_score(cur)         the middle slots' scores only (a token step's candidates), for
                              a score that costs work per slot
    of_key(k)                 the statistic named `key_stat`, of a key as stored: taken once,
                              as the key is written or enters an INT8 middle

Prompt chunks compress token by token (`prompt_compression="chunked"`, the default: one
compression step per chunk token, in order) or in one pass (`"bulk"`): every token that left
the window during the chunk and every middle token are candidates; the n lowest-scored go at
once (scores taken once, after the chunk; ties: oldest first), n = candidates - middle (at
least every candidate scored -inf), then the survivors move into free middle slots.
For a policy that marks `exact_bulk` (eviction only, scores fixed before a token can go) the two
keep the same tokens, and chunked prompts take the pass. The other policies' token steps wait,
in an eager step, until every layer has attended (`settle`): caches alike then take them
together, stacked.

Decode compresses after every token (`compression_interval=1`, the default) or, with interval
k (at most `chunk`), in one bulk pass after each token whose position p has (p + 1) % k == 0:
the tokens that left the window since the last pass wait in the ring's staging slots (the same
`chunk` slots a prompt chunk uses) and are attended until the pass. The schedule follows the
positions, so it survives batching, row views and saved sessions; the host decides it once a
step (`before_step`: the graph has one variant that passes and one that does not; a graph
compiled around the whole step never hears from the host and passes every step, masked by
row). Before a prompt chunk is written, the tokens still waiting are compressed in one pass.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from caches.base import KVCache, KVView, put_slots
from caches.full import scatter_tokens
from core.errors import UserError
from caches.attention import KVSegment
from model import apply_rope
from quantize.kv import dequantize_few, dequantize_words, quantize_words, split_words, zero_rows

FAR = 2**31 - 1  # a position later than any real one (positions are int32)


class StayOrder(NamedTuple):
    """RegionCache.stay_order: the tokens that stay after a bulk pass's victims go."""
    slot: Tensor  # [B, H, C] the slots by position, the n that stay first
    rank: Tensor  # [B, H, C] each slot's place in that order
    n: Tensor     # [B, H, 1] how many stay
    at: Tensor    # [B, H, K] the rank of the first token that stays after each victim (n: none)


class RegionCache(KVCache):
    """Base region cache; as it stands, the middle keeps its oldest tokens out (FIFO)."""

    compiled_compress = None  # RegionCache.compress_step compiled, shared by every layer
    compiled_bulk = None      # RegionCache.compress_bulk compiled, shared by every layer
    any_rows = False  # a stack of caches (`stacked`), whose height varies from call to call
    stats: tuple = ()    # names of per-slot float32 statistics
    key_stat: Optional[str] = None  # the one of `stats` that is a function of the key (`of_key`)
    has_middle = True
    # Whether the bulk pass over a prompt chunk leaves exactly the tokens that the chunk's token
    # steps leave. It does when removal is eviction and every token's score is fixed before it
    # can be a candidate: keeping the `middle` best of the middle and the tokens that leave the
    # window is then the same whether they leave one by one or at once, so chunked prompt
    # compression takes the pass (one call per chunk and layer instead of one per token).
    exact_bulk = False

    def __init__(self, batch_size: int, n_kv_heads: int, head_dim: int, max_seq_length: int,
                 dtype: torch.dtype, rope: Tensor, *, sink: int, window: int, middle: int,
                 chunk: int = 32, middle_int8: bool = False, positions: str = "original",
                 prompt_compression: str = "chunked", observation_window: int = 32,
                 compression_interval: int = 1, layer_id: int = 0, seed: int = 0):
        super().__init__(rope, layer_id)
        B, H, D = batch_size, n_kv_heads, head_dim
        self.sink, self.window, self.middle, self.chunk = sink, window, middle, chunk
        self.positions = positions
        self.bulk = prompt_compression == "bulk"
        # One-shot (caches/snapkv.py): a fresh prompt over the budget is read whole and loaded.
        self.one_shot, self.observe = prompt_compression == "snapkv", observation_window
        self.unbounded = positions == "cache"
        self.interval = compression_interval
        self.due = True  # this step's token is followed by a pass (interval > 1; host-set)
        self.n_fast = sink + window + chunk
        self.n_mid = middle + 1  # one spare slot receives the token leaving the window
        self.capacity = self.n_fast + self.n_mid
        self.prefill_chunk = chunk
        if positions == "cache" and rope.shape[0] < sink + window + middle + chunk:
            raise UserError(f"rank positions rotate keys by their rank: the RoPE table "
                            f"({rope.shape[0]} positions) must cover the cache's "
                            f"{sink + window + middle + chunk} slots; raise `max_seq_length`")
        self.middle_int8 = middle_int8
        if middle_int8 and D % 4:
            raise UserError(f"an INT8 middle packs four codes to a word: the head dim {D} is not "
                            f"a multiple of 4; use kv_middle 'model'")
        buf = self.register_buffer
        # k/v: the fast slots, followed by the middle when it is in the model dtype (one
        # stretch for attention); an INT8 middle has buffers of its own, a row of words a slot
        # with its scale.
        n_kv = self.n_fast if middle_int8 else self.capacity
        buf("k", torch.zeros(B, H, n_kv, D, dtype=dtype), persistent=False)
        buf("v", torch.zeros(B, H, n_kv, D, dtype=dtype), persistent=False)
        if middle_int8:
            buf("k_words", zero_rows(B, H, self.n_mid, head_dim=D), persistent=False)
            buf("v_words", zero_rows(B, H, self.n_mid, head_dim=D), persistent=False)
        buf("pos", torch.full((B, H, self.capacity), -1, dtype=torch.int32), persistent=False)
        for name in self.stats:
            buf(name, torch.zeros(B, H, self.capacity), persistent=False)
        # Seeds a counter-based random stream (CaM's draws) that a CUDA graph can replay.
        buf("rng_key", torch.tensor([(seed * 1_000_003 + layer_id) * 2_654_435_761 % 2**61]),
            persistent=False)

    # The regions as views, for reading. Writes go through the buffer that holds the region
    # (self.k / self.v with the slot offset: `put_mid`): Inductor writes a buffer of the graph
    # in place, but a write through a view of one copies the view out and back, a read and a
    # write of the whole region at every step.
    @property
    def k_fast(self) -> Tensor:
        return self.k[:, :, :self.n_fast]

    @property
    def v_fast(self) -> Tensor:
        return self.v[:, :, :self.n_fast]

    def mid_rows(self, kv: str) -> Tensor:
        """The middle of K or V (kv: "k" or "v") as stored, one row a slot: the model dtype's
        [.., D], or an INT8 middle's words and scale [.., D/4 + 1]. The rows `put_mid` writes."""
        if self.middle_int8:
            return getattr(self, kv + "_words")
        return getattr(self, kv)[:, :, self.n_fast:]

    @property
    def k_mid(self) -> Tensor:
        return split_words(self.k_words)[0] if self.middle_int8 else self.k[:, :, self.n_fast:]

    @property
    def v_mid(self) -> Tensor:
        return split_words(self.v_words)[0] if self.middle_int8 else self.v[:, :, self.n_fast:]

    @property
    def k_scale(self) -> Tensor:
        """An INT8 middle's scales [B, H, n_mid, 1], the last word of each row (a view)."""
        return split_words(self.k_words)[1]

    @property
    def v_scale(self) -> Tensor:
        return split_words(self.v_words)[1]

    def put_mid(self, kv: str, index: Tensor, src) -> None:
        """put_slots into the middle of K or V (kv: "k" or "v"), index in middle slots, whole
        rows (`mid_rows`)."""
        if self.middle_int8:  # the rows are a buffer of their own
            put_slots(self.mid_rows(kv), index, src)
        else:  # through the buffer, not the view (above)
            put_slots(getattr(self, kv), index + self.n_fast, src)

    # ---- slots -------------------------------------------------------------------------------
    @property
    def ring_slots(self) -> int:
        """The ring's length: the window and the staging slots, after the sinks."""
        return self.window + self.chunk

    def fast_slot(self, positions: Tensor) -> Tensor:
        """Sink positions keep their own slot; later ones go round the ring."""
        ring = self.sink + (positions - self.sink) % self.ring_slots
        return torch.where(positions < self.sink, positions, ring)

    def gather_slots(self, x: Tensor, slots: Tensor) -> Tensor:
        """x [B, H, C], slots [B, H, ...] -> x at those slots, per head."""
        return x.gather(-1, slots.flatten(2)).view(slots.shape)

    def all_keys(self) -> Tensor:
        """Keys of every global slot [B, H, C, D] in float32, as stored (rotated at their
        positions, or un-rotated under rank positions); empty slots hold stale values."""
        if not self.middle_int8:
            return self.k.float()
        return torch.cat([self.k_fast.float(), dequantize_words(self.k_words)], dim=2)

    def all_values(self) -> Tensor:
        """Values of every global slot [B, H, C, D] in float32."""
        if not self.middle_int8:
            return self.v.float()
        return torch.cat([self.v_fast.float(), dequantize_words(self.v_words)], dim=2)

    def read_v(self, g: Tensor) -> Tensor:
        """Values at global slots g [B, H] (or [B, H, K]) -> [B, H, D] ([B, H, K, D]) float32,
        from whichever region."""
        return self._read_v(g.unsqueeze(-1)).squeeze(2) if g.dim() == 2 else self._read_v(g)

    def _read_v(self, g: Tensor) -> Tensor:
        rows = self.mid_rows("v")
        D, Dm = self.v_fast.shape[-1], rows.shape[-1]  # Dm: D, or D/4 + 1 words
        f = g.clamp(max=self.n_fast - 1).unsqueeze(-1).expand(*g.shape, D)
        m = (g - self.n_fast).clamp(min=0).unsqueeze(-1).expand(*g.shape, Dm)
        fast = self.v_fast.gather(2, f).float()
        mid = rows.gather(2, m)
        mid = dequantize_few(mid) if self.middle_int8 else mid.float()
        return torch.where((g < self.n_fast).unsqueeze(-1), fast, mid)

    def write_v(self, g: Tensor, value: Tensor, do: Tensor) -> None:
        """Write value [B, H, D] at global slots g [B, H] where do [B, H]."""
        rows = self.mid_rows("v")
        D, Dm = self.v_fast.shape[-1], rows.shape[-1]
        is_fast = (g < self.n_fast).unsqueeze(-1).unsqueeze(-1)
        do = do.unsqueeze(-1).unsqueeze(-1)
        value = value.unsqueeze(2)
        f = g.clamp(max=self.n_fast - 1).unsqueeze(-1).unsqueeze(-1).expand(-1, -1, 1, D)
        old = self.v_fast.gather(2, f)
        put_slots(self.v, f, torch.where(do & is_fast, value.to(old.dtype), old))  # fast: from 0
        m = (g - self.n_fast).clamp(min=0).unsqueeze(-1).unsqueeze(-1).expand(-1, -1, 1, Dm)
        old = rows.gather(2, m)
        new = quantize_words(value) if self.middle_int8 else value.to(old.dtype)
        self.put_mid("v", m, torch.where(do & ~is_fast, new, old))

    def write_all_v(self, value: Tensor, do: Tensor) -> None:
        """Write value [B, H, C, D] (float32) at every global slot where do [B, H, C]: one pass
        over the buffers, for updates of many slots at once (no scatter, so no two writes of
        one slot can race)."""
        do = do.unsqueeze(-1)
        if not self.middle_int8:  # one buffer holds both regions
            self.v.copy_(torch.where(do, value.to(self.v.dtype), self.v))
            return
        fast = value[:, :, :self.n_fast]
        self.v.copy_(torch.where(do[:, :, :self.n_fast], fast.to(self.v.dtype), self.v))
        mid, do_mid = value[:, :, self.n_fast:], do[:, :, self.n_fast:]
        self.v_words.copy_(torch.where(do_mid, quantize_words(mid), self.v_words))

    # ---- the contract ------------------------------------------------------------------------
    def before_step(self, first: list, last: list) -> None:
        self.due = any((p + 1) % self.interval == 0 for p in last)

    def after_step(self) -> None:
        self.due = True

    def warmup_positions(self) -> tuple:
        return (self.interval - 1,) if self.interval > 1 else ()

    def update(self, input_pos: Tensor, q: Tensor, k: Tensor, v: Tensor) -> KVView:
        B, H, T, D = k.shape
        if T > 1 and self.interval > 1 and not self.verifying:
            # Tokens waiting for the next pass would be overwritten by the chunk: pass now.
            (self.compiled_bulk or RegionCache.compress_bulk)(self, (input_pos[:, :1] - 1)
                                                              .unsqueeze(-1))
        slots = self.fast_slot(input_pos)  # [B, T]
        if self.positions == "original":
            q, k = self.rotate(q, input_pos), self.rotate(k, input_pos)
        scatter_tokens(self.k, slots, k)  # fast slots, which start at slot 0
        scatter_tokens(self.v, slots, v)
        per_head = slots.unsqueeze(1).expand(B, H, T)
        put_slots(self.pos, per_head, input_pos.unsqueeze(1).expand(B, H, T).to(torch.int32))
        for name in self.stats:  # a new token starts from zero statistics, or its key's
            new = (self.of_key(k.to(self.k.dtype).float()).expand(B, H, T)
                   if name == self.key_stat else 0.0)
            put_slots(getattr(self, name), per_head, new)
        used = self.live_slots(input_pos)
        # A cache that keeps every token holds the same slots in every head: one mask for all.
        pos = self.pos[:, :1] if self.keeps_every_token else self.pos
        pos = pos if used is None else pos.narrow(2, 0, self.n_fast + used)
        # Compared as int32, the positions' dtype: against int64 positions Inductor's CPU loop
        # widens every slot's position to int64 lanes through the stack (a 4k prompt of
        # `quantized`: 3 s in the masks of its chunks).
        now = input_pos.view(B, 1, T, 1).to(pos.dtype)
        held = pos.unsqueeze(-2)  # [B, H|1, 1, S] each slot's position
        if T > 1:
            # A prompt chunk's slot is seen where min(pos, now - pos) >= 0 (no overflow: now <
            # 2**31 - 1), one comparison: two joined by & left the chunk's softmax over them a
            # third slower on AVX-512 (machine C), level on AVX2. A decode
            # step keeps the two, where the one read no faster.
            mask = torch.minimum(held, now - held) >= 0
        else:
            mask = (held >= 0) & (held <= now)
        return self.trim(self.view(input_pos, q, per_head, mask), used)

    def in_use(self, first: int) -> int:
        """Middle slots that a prompt chunk from position `first` attends, for a cache whose
        middle spans the stream (quantized): middle slots fill lowest first, and only with
        tokens that left the window, first - sink - window of them before the chunk; one at
        least (the fused kernel stops on an empty stretch; the slot, empty, is masked)."""
        return min(self.n_mid, max(1, first - self.sink - self.window))

    def before_chunk(self, first: list) -> None:
        # The slots in use as a tensor's length (`live`), which a compiled chunk reads as a
        # size it does not guard on (unbacked): one graph for every length, the middle's whole
        # included (a size the graph guarded would compile again there, and at 0 and 1).
        if self.keeps_every_token:
            self.live = torch.empty(self.in_use(max(first)), dtype=torch.int8,
                                    device=self.pos.device)
            torch._dynamo.decorators.mark_unbacked(self.live, 0)

    def after_chunk(self) -> None:
        self.__dict__.pop("live", None)  # an attribute only while set: `alike` compares them

    def live_slots(self, input_pos: Tensor) -> Optional[int]:
        """The middle slots a prompt chunk at input_pos [B, T] of a cache whose middle spans the
        stream (quantized) attends, or None for all: those that hold a token (`in_use`, for the
        row furthest on), not the whole static buffer, as the host said before the chunk
        (`live`; read by layer, compiled or not), else as an eager chunk's positions say. The
        slots left out are empty (masked), so attention is unchanged: a 4k prompt attends over
        half the slots, on average."""
        if not self.keeps_every_token or input_pos.shape[-1] == 1:
            return None
        live = self.__dict__.get("live")
        if live is not None:
            return live.shape[0]
        if torch.compiler.is_compiling():
            return None
        return self.in_use(int(input_pos[:, 0].max()))  # a host read, once a layer

    def trim(self, view: KVView, used: Optional[int]) -> KVView:
        """The view's slots cut to the fast ones and `used` middle ones (its mask is cut
        already: made from the positions of those slots, not sliced). By `narrow`, not a slice:
        a compiled chunk would branch on whether a slice spans the whole buffer (a graph for
        the chunks that find the middle full)."""
        if used is None:
            return view
        q, segments, mask = view
        if self.middle_int8:
            mid = KVSegment(*(None if x is None else x.narrow(2, 0, used) for x in segments[1]))
            return KVView(q, [segments[0], mid], mask)
        n = self.n_fast + used
        return KVView(q, [KVSegment(*(x.narrow(2, 0, n) for x in segments[0][:2]))], mask)

    def view(self, input_pos: Tensor, q: Tensor, per_head: Tensor, mask: Tensor) -> KVView:
        """What the step attends over: every slot, its keys rotated as the positions say."""
        B, H, T = per_head.shape
        D = q.shape[-1]
        if self.positions == "cache":
            # StreamingLLM's pos-shift: keys are stored un-rotated and rotated by their rank
            # among the retained tokens; the query takes its own rank (the newest).
            rank = self.ranks()
            q_rank = rank.gather(2, per_head)  # [B, H, T]
            G = q.shape[1] // H
            q = apply_rope(q.view(B, H, G, T, D), self.rope[q_rank].unsqueeze(2)).view(q.shape)
            if not self.middle_int8:
                return KVView(q, [KVSegment(apply_rope(self.k, self.rope[rank]), self.v)], mask)
            k_fast = apply_rope(self.k_fast, self.rope[rank[..., :self.n_fast]])
            k_mid = dequantize_words(self.k_words)
            k_mid = apply_rope(k_mid, self.rope[rank[..., self.n_fast:]]).to(k_fast.dtype)
            return KVView(q, [KVSegment(k_fast, self.v_fast),
                              KVSegment(k_mid, self.v_mid, None, self.v_scale)], mask)
        if not self.middle_int8:
            return KVView(q, [KVSegment(self.k, self.v)], mask)
        return KVView(q, [KVSegment(self.k_fast, self.v_fast),
                          KVSegment(self.k_mid, self.v_mid, self.k_scale, self.v_scale)], mask)

    def ranks(self) -> Tensor:
        """Rank of every slot's position among the retained tokens (empty slots rank last)."""
        key = torch.where(self.pos >= 0, self.pos, FAR)
        order = key.argsort(dim=-1)
        ar = torch.arange(self.capacity, device=key.device).expand_as(order)
        # Empty slots are masked; clamping keeps their (unused) rotation inside the table.
        return torch.empty_like(order).scatter_(-1, order, ar).clamp(max=self.rope.shape[0] - 1)

    @property
    def slot_buffers(self) -> tuple:
        return ("k", "v", "pos") + self.stats

    def written_slots(self, input_pos: Tensor) -> Tensor:
        return self.fast_slot(input_pos)

    def commit(self, input_pos: Tensor, probs) -> None:
        # A KV head's attention is the mean over the query heads of its group.
        p = None if probs is None else probs.mean(dim=2)
        if self.verifying:  # kept until the engine knows which tokens stay (`accept`)
            input_pos_, slots, saved, _ = self.verified
            self.verified = (input_pos_, slots, saved, p)
            return
        if p is not None:
            self.accumulate(p, input_pos)
        self.compress(input_pos)

    def settle_accepted(self, input_pos: Tensor, held) -> None:
        # Token by token, as single steps add their attention (the same sums, in the same
        # order), then the compression that falls on the last token; the block never crosses
        # an earlier one.
        for i in range(input_pos.shape[1]):
            if held is not None:
                self.accumulate(held[:, :, i:i + 1], input_pos[:, i:i + 1])
        last = input_pos[:, -1:]
        if self.interval > 1:
            self.due = any((p + 1) % self.interval == 0 for p in last.view(-1).tolist())
        try:
            self.compress(last)
        finally:
            self.due = True

    def compress(self, input_pos: Tensor) -> None:
        """commit's compression after the step at input_pos [B, T] was attended."""
        T = input_pos.shape[1]
        if not self.takes_token_steps(T):
            if T > 1:  # the whole chunk in one pass
                bulk = self.compiled_bulk or RegionCache.compress_bulk
                bulk(self, input_pos[:, -1:].unsqueeze(-1))
            elif self.due:  # one pass every `interval` positions; each row on its own schedule
                self.compress_bulk(input_pos.unsqueeze(-1),
                                   rows=(input_pos.view(-1) + 1) % self.interval == 0)
            return
        if torch.compiler.is_compiling():
            # The compiled decode step keeps each layer's step. A traced prompt chunk's steps
            # run after its graph, every layer at once (engine/runtime/generation.py, `settling`):
            # unrolled in the graph, a chunk's 32 steps took minutes to compile. Compiled code
            # never reads `waiting`: its guards would then check the attribute.
            if T == 1:
                self.token_steps(input_pos)
            return
        if self.waiting is not None:  # eager: every layer's token steps at once (settle)
            self.waiting.append(self)
            return
        self.token_steps(input_pos)

    def takes_token_steps(self, T: int) -> bool:
        """Whether a T-token step compresses token by token (else in one pass, or not at all
        this step)."""
        return not (self.bulk or self.exact_bulk) if T > 1 else self.interval == 1

    def token_steps(self, input_pos: Tensor) -> None:
        """One compression step for each token of input_pos [B, T], in order. A prompt chunk's
        go through the compiled step when there is one (set by compile_decode): it turns ~60
        small eager ops per token into one call."""
        compress = self.compiled_compress if input_pos.shape[1] > 1 and self.compiled_compress \
            else RegionCache.compress_step
        for i in range(input_pos.shape[1]):
            cur = input_pos[:, i:i + 1].unsqueeze(-1)
            if self.any_rows:  # a stack: its height is dynamic (`stacked`)
                torch._dynamo.maybe_mark_dynamic(cur, 0)
            compress(self, cur)

    def settle(self, waiting: list, input_pos: Tensor) -> None:
        """The token steps of an eager step or a traced prompt chunk (T tokens; a decode
        step's one) for every layer whose cache waited: caches alike (same class, settings
        and buffer shapes) are stacked into one cache, a row per layer and row, which takes
        the T steps once instead of once per layer (the ops of a step are small: their count,
        not their size, is the cost). Exactly the steps each cache takes alone: a step's
        every op is per row. The stack is a copy, made per step and written back, in parts of
        at most STACK_BYTES, and only where the copy costs less than the calls it saves
        (STEP_BYTES)."""
        groups: dict = {}
        for cache in waiting:
            groups.setdefault(cache.alike(), []).append(cache)
        T = input_pos.shape[1]
        for group in groups.values():
            # A stack copies each cache in and out once for the T steps: it pays while that is
            # cheaper than T calls per layer (STEP_BYTES a call).
            n = group[0].stack_limit if group[0].nbytes <= T * STEP_BYTES else 1
            for part in (group[i:i + n] for i in range(0, len(group), n)):
                if len(part) == 1:
                    part[0].token_steps(input_pos)
                    continue
                stack = self.stacked(part)
                stack.token_steps(input_pos.repeat(len(part), 1))
                stack.unstack(part)

    @staticmethod
    def stacked(caches: list) -> "RegionCache":
        """Caches alike as one: a copy of the first whose buffers hold every cache's rows,
        layer after layer (row l * B + b is row b of caches[l]); each row keeps its layer's
        random key. Its rows are marked dynamic, so that one compiled step serves a stack of
        any height (a wavefront's layers at work vary from wave to wave: a graph for each
        height took minutes to compile)."""
        B = caches[0].pos.shape[0]
        rows = {name: torch.cat([c._buffers[name] for c in caches])
                for name in caches[0].row_buffers()}
        rows["rng_key"] = torch.cat([c.rng_key.expand(B) for c in caches])
        for t in rows.values():
            torch._dynamo.maybe_mark_dynamic(t, 0)
        stack = caches[0].with_buffers({**caches[0]._buffers, **rows})
        stack.any_rows = True
        return stack

    @property
    def stack_limit(self) -> int:
        """The most caches like this one that go in one stack: STACK_BYTES of copies."""
        return max(1, STACK_BYTES // self.nbytes)

    def unstack(self, caches: list) -> None:
        """Write this stack's rows back into the caches it was made of."""
        B = caches[0].pos.shape[0]
        for name, t in self.row_buffers().items():
            for i, c in enumerate(caches):
                c._buffers[name].copy_(t[i * B:(i + 1) * B])

    def alike(self) -> tuple:
        """What caches must share to be stacked (`stacked`): class, settings (every plain
        attribute but the layer's index and `waiting`, the model's handle during a step, which
        a cache holds once it has taken one) and buffer shapes."""
        plain = (int, float, str, bool, type(None))
        settings = sorted((k, v) for k, v in vars(self).items()
                          if isinstance(v, plain) and k not in ("layer_id", "waiting"))
        shapes = [(k, tuple(b.shape), b.dtype) for k, b in self._buffers.items()]
        return (type(self), tuple(settings), tuple(shapes), self.rope.data_ptr(),
                id(self.shard), self.compiled_compress)

    def state(self) -> dict:
        """The buffers that hold the stream; an INT8 middle's rows as int32 (views of their
        bits, the scales' too: compared and saved as the integers they are, not as float32
        numbers)."""
        return {name: b.view(torch.int32) if name.endswith("_words") else b
                for name, b in super().state().items()}

    def reset(self) -> None:
        self.due = True
        for name, b in self.row_buffers().items():
            b.fill_(-1 if name == "pos" else 0)

    # ---- compression -------------------------------------------------------------------------
    def compress_step(self, cur: Tensor) -> None:
        """After the token at position cur [B, 1, 1] was attended: age the window, shrink the
        middle."""
        self.before_compress(cur)
        leaving = cur.view(-1) - self.window
        moving = leaving >= self.sink
        ring = self.fast_slot(leaving.clamp(min=self.sink))  # [B]
        spare = first_index(self.pos[..., self.n_fast:] < 0)  # [B, H] a free slot
        self.move_to_middle(ring, spare, moving)
        valid = self.pos[..., self.n_fast:] >= 0
        score = torch.where(valid, self.middle_score(cur), float("inf"))
        victim = argmin_oldest(score, self.pos[..., self.n_fast:])
        do = self.must_remove(valid, score, victim)
        self.remove(victim, do, cur)

    def move_to_middle(self, ring: Tensor, spare: Tensor, moving: Tensor) -> None:
        """Row b's token in fast slot ring[b] moves into middle slot spare[b] (per head) if
        moving[b]."""
        B, H, _, D = self.k_fast.shape
        src = ring.view(B, 1, 1, 1).expand(B, H, 1, D)
        idx = spare.view(B, H, 1, 1).expand(B, H, 1, self.mid_rows("k").shape[-1])
        k, v = self.k_fast.gather(2, src), self.v_fast.gather(2, src)
        # The spare slot is empty: writing it unconditionally is harmless when nothing moves.
        if self.middle_int8:
            kq = quantize_words(k)
            self.put_mid("k", idx, kq)
            self.put_mid("v", idx, quantize_words(v))
            k = dequantize_few(kq)  # the key as the middle holds it
        else:
            self.put_mid("k", idx, k)
            self.put_mid("v", idx, v)
        g = (spare + self.n_fast).unsqueeze(-1)  # [B, H, 1]
        r = ring.view(B, 1, 1).expand(B, H, 1)
        moving = moving.view(B, 1, 1)
        p = self.pos.gather(2, r)
        put_slots(self.pos, g, torch.where(moving, p, -1))
        put_slots(self.pos, r, torch.where(moving, -1, p))
        for name in self.stats:
            put_slots(getattr(self, name), g, self.entering(name, r, k))

    def entering(self, name: str, src: Tensor, k: Tensor) -> Tensor:
        """Statistic `name` [B, H, K] of the tokens that move from fast slots src [B, H, K] into
        the middle, whose keys it holds as k [B, H, K, D]: each token's own, but a key
        statistic of an INT8 middle is taken again (the key changed as it entered)."""
        if name == self.key_stat and self.middle_int8:
            return self.of_key(k)
        return getattr(self, name).gather(2, src)

    def compress_bulk(self, cur: Tensor, rows: Optional[Tensor] = None) -> None:
        """After a prompt chunk ending at position cur [B, 1, 1] was attended: one pass. The
        candidates are the middle tokens and the fast tokens that left the window (at most
        `chunk`: everything older went at the previous pass); the n lowest-scored go at once,
        n = candidates - middle, but at least every candidate scored -inf (LagKV's unselected
        tokens); then the surviving fast tokens move into free middle slots. rows [B] (bool):
        only these rows pass (the others keep everything)."""
        self.before_bulk(cur)
        B, H, C = self.pos.shape
        slot = torch.arange(C, device=cur.device)
        in_fast = slot < self.n_fast
        left = in_fast & (self.pos >= self.sink) & (self.pos <= cur - self.window)
        cand = left | (~in_fast & (self.pos >= 0))
        if rows is not None:
            cand = cand & rows.view(B, 1, 1)
        score = torch.where(cand, self.score(cur), float("inf"))
        excess = cand.sum(-1) - self.middle
        n = torch.maximum(excess, (score == float("-inf")).sum(-1))  # [B, H]
        # Candidates by score, ties by position (oldest first); at most `chunk` go. The other
        # slots (score inf) come last, in slot order, so that every key is distinct.
        K = min(self.chunk, C)
        after = torch.where(cand, self.pos.long(), FAR - C + slot)
        victims = smallest(ordered(score) * 2**32 + after, K)  # global slots [B, H, K]
        do = torch.arange(K, device=cur.device) < n.unsqueeze(-1)
        self.remove_bulk(victims, do, cur)
        self.move_left_to_middle(cur, rows)

    def stay_order(self, victims: Tensor, do: Tensor) -> StayOrder:
        """The tokens that stay (not among the victims that go, where do [B, H, K]) in position
        order, and each victim's place in it: what a bulk pass's merges need, without a
        [victims x slots] search (one topk of every slot, one binary search)."""
        C = self.pos.shape[-1]
        gone = torch.zeros_like(self.pos, dtype=torch.bool).scatter(-1, victims, do)
        key = torch.where((self.pos >= 0) & ~gone, self.pos, FAR)
        by_pos, slot = key.topk(C, dim=-1, largest=False)  # the tokens that stay first
        rank = torch.zeros_like(slot).scatter(
            -1, slot, torch.arange(C, device=slot.device).expand_as(slot))
        at = torch.searchsorted(by_pos, self.pos.gather(-1, victims), right=True)
        return StayOrder(slot, rank, (by_pos < FAR).sum(-1, keepdim=True), at)

    def move_left_to_middle(self, cur: Tensor, rows: Optional[Tensor] = None) -> None:
        """Every fast token that left the window moves into a free middle slot (per head: the
        i-th such token, in slot order, into the i-th free slot); only in `rows` if given."""
        B, H, _, D = self.k_fast.shape
        fast_pos = self.pos[..., :self.n_fast]
        moving = (fast_pos >= self.sink) & (fast_pos <= cur - self.window)
        if rows is not None:
            moving = moving & rows.view(B, 1, 1)
        K = min(self.chunk, self.n_mid)
        src = first_true(moving, K)  # [B, H, K] moving first
        ok = moving.gather(-1, src)
        dst = first_true(self.pos[..., self.n_fast:] < 0, K)  # free middle slots first
        Dm = self.mid_rows("k").shape[-1]  # D, or D/4 + 1 words
        s4 = src.unsqueeze(-1).expand(B, H, K, D)
        d4, ok4 = (x.unsqueeze(-1).expand(B, H, K, Dm) for x in (dst, ok))
        k, v = self.k_fast.gather(2, s4), self.v_fast.gather(2, s4)
        for kv, x in (("k", k), ("v", v)):
            if self.middle_int8:
                x = quantize_words(x)
                if kv == "k":  # the keys as the middle holds them
                    k = dequantize_few(x)
            self.put_mid(kv, d4, torch.where(ok4, x, self.mid_rows(kv).gather(2, d4)))
        g = dst + self.n_fast
        for name in ("pos", *self.stats):
            stat = getattr(self, name)
            put_slots(stat, g, torch.where(ok, self.entering(name, src, k), stat.gather(2, g)))
        put_slots(self.pos, src, torch.where(ok, -1, self.pos.gather(2, src)))

    def load_prompt(self, k: Tensor, v: Tensor, keep: Optional[Tensor],
                    probs: Optional[Tensor], rotated: bool = False) -> None:
        """Hold a whole prompt at once (one-shot prompt compression, caches/snapkv.py): k/v
        [B, H, T, D] at positions 0..T-1, un-rotated (or rotated there already: `rotated`,
        under original positions only); the sink and window tokens stay, and of the
        rest those where keep [B, H, T] (at most `middle` per head; None: all of them) enter the
        middle in position order. probs [B, H, W, T], the attention of the last W prompt tokens,
        start the policy's statistics (`accumulate`; None for a policy without them)."""
        self.reset()
        B, H, T, D = k.shape
        t = torch.arange(T, device=k.device)
        fast = ((t < self.sink) | (t >= T - self.window)).nonzero().view(-1)  # same for all rows
        slots = self.fast_slot(fast)
        kf = k[:, :, fast]
        # Middle survivors in position order: keep's True entries first, each head its own.
        if keep is None:  # all of them: one stretch, no search
            n = T - self.sink - self.window
            src = t[self.sink:self.sink + n].expand(B, H, n)
            km, vm = k[:, :, self.sink:self.sink + n], v[:, :, self.sink:self.sink + n]
        else:
            n = int(keep[0, 0].sum())
            src = first_true(keep, n)  # [B, H, n]
            idx = src.unsqueeze(-1).expand(B, H, n, D)
            km, vm = k.gather(2, idx), v.gather(2, idx)
        # Only the tokens that stay are rotated, each at its position.
        if self.positions == "original" and not rotated:
            kf, km = apply_rope(kf, self.rope[fast]), apply_rope(km, self.rope[src])
        self.k_fast[:, :, slots] = kf.to(self.k.dtype)
        self.v_fast[:, :, slots] = v[:, :, fast].to(self.v.dtype)
        self.pos[:, :, slots] = fast.to(torch.int32)
        if self.middle_int8:
            self.k_words[:, :, :n], self.v_words[:, :, :n] = quantize_words(km), quantize_words(vm)
        else:
            self.k_mid[:, :, :n], self.v_mid[:, :, :n] = km.to(self.k.dtype), vm.to(self.v.dtype)
        self.pos[:, :, self.n_fast:self.n_fast + n] = src.to(torch.int32)
        if self.key_stat:
            getattr(self, self.key_stat).copy_(self.of_key(self.all_keys()))
        if probs is not None:  # the observation window's attention, onto the slots it now holds
            W, pos = probs.shape[2], self.pos.unsqueeze(2)  # a slot's position is its token
            p = probs.gather(-1, pos.long().clamp(min=0).expand(B, H, W, pos.shape[-1]))
            self.accumulate(torch.where(pos >= 0, p, 0.0), t[T - W:].expand(B, -1))
        self.after_load(torch.full((B, 1, 1), T - 1, device=k.device))

    def must_remove(self, valid: Tensor, score: Tensor, victim: Tensor) -> Tensor:
        return valid.sum(-1, dtype=torch.int32) > self.middle  # int32: as first_index says

    def evict(self, victim: Tensor, do: Tensor) -> None:
        g = (victim + self.n_fast).unsqueeze(-1)
        put_slots(self.pos, g, torch.where(do.unsqueeze(-1), -1, self.pos.gather(2, g)))

    # ---- policy hooks ------------------------------------------------------------------------
    def before_compress(self, cur: Tensor) -> None:
        pass

    def before_bulk(self, cur: Tensor) -> None:
        """Before a bulk pass over the chunk ending at cur (what before_compress does for each
        of its tokens)."""

    def after_load(self, cur: Tensor) -> None:
        """After load_prompt, the prompt ending at cur: statistics beyond attention."""

    def accumulate(self, p: Tensor, positions: Tensor) -> None:
        pass

    def score(self, cur: Tensor) -> Tensor:
        return self.pos.float()  # oldest first

    def middle_score(self, cur: Tensor) -> Tensor:
        """The middle slots' scores [B, H, n_mid]: a token step's candidates. A policy whose
        score costs work per slot scores only these."""
        return self.score(cur)[..., self.n_fast:]

    def of_key(self, k: Tensor) -> Tensor:
        """The `key_stat` of keys k [..., D] (float32, as stored) -> [...]: taken once, as a key
        is stored, instead of from every key at every step."""
        raise NotImplementedError

    def remove(self, victim: Tensor, do: Tensor, cur: Tensor) -> None:
        self.evict(victim, do)

    def remove_bulk(self, victims: Tensor, do: Tensor, cur: Tensor) -> None:
        """victims [B, H, K] global slots, removed where do [B, H, K]."""
        put_slots(self.pos, victims, torch.where(do, -1, self.pos.gather(2, victims)))


# The most bytes of cache that one stack copies (RegionCache.settle): a bound on the transient
# memory. The default model's 30 layers at a budget of 256 take 13 MiB in float32.
STACK_BYTES = 256 * 2**20
# The cache bytes whose copy costs about one eager token step's call (~0.3 ms on a 2-core CPU,
# ~4 bytes moved per byte at 20-30 GB/s): a layer's cache at most T times this is stacked for
# T steps. Decode (T = 1) stacks the default model's layers up to a budget of about 600 (float32).
STEP_BYTES = 2**20


def coarse(score: Tensor, step: float = 2.0**-12) -> Tensor:
    """A score rounded to a grid, for scores that tie exactly in exact arithmetic (a repeated
    token's layer-0 key is the same vector at every position): rounding noise of the batched
    or compiled path must not break the tie; the oldest goes, as argmin_oldest decides."""
    return torch.round(score / step) * step


def smallest(key: Tensor, k: int) -> Tensor:
    """Indices of the k smallest of key (distinct integers) along the last axis, ascending:
    what a stable argsort's first k would be. topk, not a sort: Inductor turns a sort of up to
    512 entries into one Triton kernel, and on a GPU a kernel of the bulk pass compiled for
    over 25 s; topk stays ATen's."""
    return key.topk(k, dim=-1, largest=False).indices


def first_true(mask: Tensor, k: int) -> Tensor:
    """The first k indices [..., k] of those where mask holds, in order, then of the others:
    a stable argsort of ~mask, cut at k."""
    n = mask.shape[-1]
    index = torch.arange(n, device=mask.device)
    return smallest(torch.where(mask, index, index + n), k)


def ordered(score: Tensor) -> Tensor:
    """float scores as int64 in the same order (IEEE bits, negatives flipped; -0 as 0), so
    that a score and a position make one integer key."""
    bits = torch.where(score == 0, 0.0, score.float()).view(torch.int32).long()
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def first_index(mask: Tensor) -> Tensor:
    """The first index along the last axis where mask holds, 0 where it holds nowhere (what
    argmax of the mask gives; first_true(mask, 1) by a topk, an ATen call outside the step's
    fused loops), as int64. A min over int32 slot numbers: Inductor's CPU loop for an argmin
    or argmax carries int64 indices through generic vector code on AVX2, and over
    `quantized`'s 4k-slot middle a decode step's three took ~2 ms."""
    n = mask.shape[-1]
    slot = torch.arange(n, device=mask.device, dtype=torch.int32)
    return (torch.where(mask, slot, n).amin(dim=-1) % n).long()


def first_min(x: Tensor) -> Tensor:
    """argmin over the last axis of integers (the first of equal values), by mins
    (first_index)."""
    return first_index(x == x.amin(dim=-1, keepdim=True))


def argmin_oldest(score: Tensor, pos: Tensor) -> Tensor:
    """argmin over the last axis; ties go to the oldest position (the first slot of those, as
    argmin takes the first of equal values)."""
    best = score.amin(dim=-1, keepdim=True)
    return first_min(torch.where(score == best, pos, FAR))
