"""The region cache and every policy, on tiny random models and hand-worked examples."""
import math

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend

from caches import POLICIES, FullCache, build_caches, make_cache_factory
from caches.cam import CaMCache
from caches.region import RegionCache
from caches.h2o import H2OCache
from caches.keydiff import KeyDiffCache
from caches.knorm import KnormCache
from caches.lagkv import LagKVCache
from caches.tova import TOVACache
from caches.a2sf import A2SFCache
from caches.weightedkv import WeightedKVCache
from conftest import tiny_model
from core.errors import UserError
from engine.runtime.generation import Generator, Session, compile_decode, decode_one_token
from engine.runtime.steps import forward, steps
from engine.runtime.prefill import read_by_layer
from caches.attention import KVView
from model import rope_table
from quantize.kv import dequantize_int8, dequantize_words, quantize_int8

COMPRESSING = [p for p in POLICIES if p != "full"]
BUDGET = 16


def variants():
    for name in COMPRESSING:
        middles = ["model", "int8"] if POLICIES[name].has_middle else ["model"]
        for middle in middles:
            for positions in ("original", "cache"):
                for batch in (1, 2):
                    yield name, middle, positions, batch


def stream_logits(model, ids, make_cache, max_seq_length=256):
    """Feed ids [B, T] one token at a time through the decode path; logits [B, T, V]."""
    B, T = ids.shape
    caches = build_caches(model, B, max_seq_length, make_cache)
    return torch.cat([model(ids[:, t:t + 1], torch.tensor([t]), caches) for t in range(T)], dim=1)


@pytest.mark.parametrize("name,middle,positions,batch", list(variants()))
def test_policy_matrix_runs_long_in_constant_memory(name, middle, positions, batch):
    model = tiny_model()
    factory = make_cache_factory(name, cache_size=BUDGET, kv_middle=middle, positions=positions,
                                 chunk=8)
    gen = Generator(model, max_seq_length=128, batch_size=batch, make_cache=factory)
    before = gen.cache_bytes
    caches = gen.caches
    prompt = [[(7 * i + 3 * b) % 256 for i in range(21)] for b in range(batch)]
    n_new = 4 * BUDGET + 10  # well past the budget: fill, then evict for many steps
    with torch.inference_mode():
        # sample so that the two sequences of a batch diverge and keep their own index maps
        out = gen.generate(prompt, n_new, temperature=1.0)
        logits = model(torch.tensor([[5] * batch]).T, torch.tensor([21 + n_new]), caches)
    assert out.new_tokens == n_new
    assert gen.cache_bytes == before
    assert torch.isfinite(logits).all()
    retained = (caches[0].pos >= 0).sum(-1)
    if name == "quantized":
        assert (retained == 21 + n_new).all()  # nothing dropped (94 fed + the extra token)
    elif name == "lagkv":
        assert (retained <= BUDGET).all()
    else:
        assert (retained == BUDGET).all()
    for cache in caches:  # buffers hold their static shape; nothing allocated on the way
        assert cache.k_fast.shape[2] + cache.k_mid.shape[2] == cache.capacity


@pytest.mark.parametrize("name", COMPRESSING)
@pytest.mark.parametrize("region", ["whole-step", "per-block"])
def test_compiled_decode_never_recompiles(name, region):
    torch._dynamo.reset()
    model = tiny_model()
    factory = make_cache_factory(name, cache_size=BUDGET, chunk=8,
                                 kv_middle="int8" if POLICIES[name].has_middle else "model")
    gen = Generator(model, max_seq_length=256, make_cache=factory)
    expected = gen.generate(list(range(1, 12)), 70).new_ids[0]
    counter = CompileCounter()
    if region == "whole-step":  # the CUDA path
        gen.decode_fn = torch.compile(decode_one_token, backend=counter, fullgraph=True)
    else:  # the CPU path: one graph a step, both blocks one nested region (+ prompt-chunk
        compile_decode(decode_one_token, model, backend=counter, caches=gen.caches)  # compression)
    assert gen.generate(list(range(1, 12)), 70).new_ids[0] == expected
    # fill phase and eviction phase share one graph (LagKV: a step with partition scoring and
    # one without)
    steps = 2 if name == "lagkv" else 1
    assert counter.frame_count == (1 if region == "whole-step" else steps + 1)


@pytest.mark.parametrize("name", ["weightedkv", "cam", "quantized"])
def test_inductor_compiled_policy_matches_eager(name):
    """(quantized: compiled attention reads its int8 middle as a reduction, eager as a
    matmul.)"""
    torch._dynamo.reset()
    model = tiny_model()
    factory = make_cache_factory(name, cache_size=BUDGET, chunk=8)
    gen = Generator(model, max_seq_length=256, make_cache=factory)
    expected = gen.generate(list(range(1, 12)), 50).new_ids[0]
    counter = CompileCounterWithBackend("inductor")
    gen.decode_fn = torch.compile(decode_one_token, backend=counter, fullgraph=True)
    assert gen.generate(list(range(1, 12)), 50).new_ids[0] == expected
    assert counter.frame_count == 1
    # the CPU path: one inductor graph a step, every block one nested region in it
    gen.decode_fn = decode_one_token
    counter = CompileCounterWithBackend("inductor")
    compile_decode(decode_one_token, model, backend=counter, caches=gen.caches)
    assert gen.generate(list(range(1, 12)), 50).new_ids[0] == expected
    assert counter.frame_count == 2  # the step and the chunk's compression step


@pytest.mark.parametrize("name", COMPRESSING)
@pytest.mark.parametrize("positions", ["original", "cache"])
def test_budget_above_sequence_length_equals_full(name, positions):
    model = tiny_model()
    ids = torch.randint(0, 256, (2, 40))
    ref = stream_logits(model, ids, FullCache)
    factory = make_cache_factory(name, cache_size=96, positions=positions, chunk=8)
    assert (stream_logits(model, ids, factory) - ref).abs().max() < 1e-4


def test_chunked_prefill_without_eviction_equals_full():
    model = tiny_model()
    ids = torch.randint(0, 256, (1, 45))
    ref = Generator(model, 128).generate(ids[0].tolist(), 10).new_ids
    gen = Generator(model, 128, make_cache=make_cache_factory("h2o", cache_size=96, chunk=8))
    assert gen.generate(ids[0].tolist(), 10).new_ids == ref


class WindowedFullCache(FullCache):
    """Reference for streaming: keep everything, attend to the sink and the last window only."""
    sink, window = 4, 12

    def update(self, input_pos, q, k, v):
        q, segments, mask = super().update(input_pos, q, k, v)
        pos = self.pos.unsqueeze(-2)
        cur = input_pos.view(input_pos.shape[0], 1, -1, 1)
        return KVView(q, segments, mask & ((pos < self.sink) | (pos >= cur - self.window)))


def test_streaming_matches_sink_plus_window_reference():
    model = tiny_model()
    ids = torch.randint(0, 256, (2, 60))
    ref = stream_logits(model, ids, WindowedFullCache)
    # budget 16 = sink 4 + window 12; the new token is attended with them (use-then-compress)
    ours = stream_logits(model, ids, make_cache_factory("streaming", cache_size=16, chunk=8))
    assert (ours - ref).abs().max() < 1e-4
    full = stream_logits(model, ids, FullCache)
    assert (ours - full)[:, 20:].abs().max() > 1e-2  # and it really drops tokens


class FakeQuantFullCache(FullCache):
    """Reference for quantized: everything kept; tokens older than sink + window are attended
    through an int8 quantize-dequantize round trip."""
    sink, window = 4, 4

    def update(self, input_pos, q, k, v):
        q, segments, mask = super().update(input_pos, q, k, v)
        k_all, v_all = segments[0].k, segments[0].v
        pos = self.pos.unsqueeze(-1)  # [B, 1, S, 1]
        cur = input_pos[:, -1].view(-1, 1, 1, 1)
        middle = (pos >= self.sink) & (pos < cur - self.window)  # left the window before cur
        fq = lambda x: dequantize_int8(*quantize_int8(x)).to(x.dtype)  # noqa: E731
        k_ref = torch.where(middle, fq(k_all), k_all)
        v_ref = torch.where(middle, fq(v_all), v_all)
        from caches.attention import KVSegment
        return KVView(q, [KVSegment(k_ref, v_ref)], mask)


def test_quantized_matches_fake_quant_reference():
    model = tiny_model()
    ids = torch.randint(0, 256, (2, 50))
    ref = stream_logits(model, ids, FakeQuantFullCache)
    factory = make_cache_factory("quantized", cache_size=16, sink=4, window=4, chunk=8)
    ours = stream_logits(model, ids, factory)
    assert (ours - ref).abs().max() < 1e-4
    full = stream_logits(model, ids, FullCache)
    assert (ours - full).abs().max() > 1e-4  # int8 does change the numbers


@pytest.mark.parametrize("positions", ["original", "cache"])
def test_quantized_prompt_chunks_attend_only_over_slots_in_use(monkeypatch, positions):
    """A prompt chunk of the quantized cache (whose middle spans max_seq_length) attends over
    the middle slots that can hold a token so far, under one mask for every head, and its
    logits are those of attending over the whole static buffer."""
    from caches.region import RegionCache
    model = tiny_model()
    ids = torch.randint(0, 256, (2, 60))
    pos = torch.arange(60)
    factory = make_cache_factory("quantized", cache_size=16, sink=4, window=4, chunk=8,
                                 positions=positions)
    widths, trim = [], RegionCache.trim

    def spy(self, view, used):
        out = trim(self, view, used)
        widths.append((self.capacity, out.mask.shape[-1]))
        assert out.mask.shape[1] == 1  # every head holds the same slots: one mask for all
        return out

    def read(trimmed):
        monkeypatch.setattr(RegionCache, "trim", spy)
        if not trimmed:
            monkeypatch.setattr(RegionCache, "live_slots", lambda self, input_pos: None)
        caches = build_caches(model, 2, 256, factory)
        out = [model(ids[:, c:c + 8], pos[c:c + 8], caches) for c in range(0, 56, 8)]
        out += [model(ids[:, t:t + 1], pos[t:t + 1], caches) for t in range(56, 60)]
        return torch.cat(out, dim=1)

    trimmed = read(True)
    chunks, steps = widths[:7 * 2], widths[7 * 2:]  # 7 chunks, 2 layers; then the tokens
    widths.clear()
    whole = read(False)
    assert (whole - trimmed).abs().max() < 1e-5
    capacity = chunks[0][0]
    # chunk c (positions from 8c): the 16 fast slots and the 8c - sink - window middle slots
    # filled before it, one at least (an empty one, masked, for the fused kernel)
    assert [w for _, w in chunks[::2]] == [16 + max(1, 8 * c - 8) for c in range(7)]
    assert all(a == b == capacity for a, b in steps)  # decode steps are not cut
    assert all(w == capacity for _, w in widths)  # and with trimming off, nothing is


@pytest.mark.parametrize("positions", ["original", "cache"])
def test_a_compiled_quantized_prompt_attends_over_the_slots_in_use_in_one_graph(positions):
    """Read layer by layer and compiled, a prompt chunk of the quantized cache attends over the
    middle slots in use as the host counts them before the chunk (`live`, an unbacked size):
    growing with the stream (with rank positions, up to the whole middle: a second prompt past
    max_seq_length), one graph for every size (nothing compiles after the warm-up), and the
    logits of eager chunks over the whole static buffer."""
    from engine.runtime.generation import compile_prompt
    torch._dynamo.reset()
    model = tiny_model(n_layer=2)
    factory = make_cache_factory("quantized", cache_size=24, chunk=8,
                                 prompt_compression="bulk", positions=positions)
    prompt = [(7 * i) % 250 + 1 for i in range(370 if positions == "cache" else 310)]
    sizes, before = [], RegionCache.before_chunk

    def spy(self, first):
        before(self, first)
        live = self.__dict__.get("live")
        sizes.append(None if live is None else live.shape[0])

    def run(compiled):
        counter = CompileCounter()
        s = Session(model, factory, 320)
        if compiled:
            s.prefill_fn, s.compiled_prefill = compile_prompt(model, backend=counter), True
        s.warmup()
        frames = counter.frame_count
        sizes.clear()
        s.append(prompt[:290])
        first = s.logits.clone()
        s.append(prompt[290:])
        return torch.cat([first, s.logits]), counter.frame_count - frames, s.caches[0].n_mid

    import unittest.mock
    with unittest.mock.patch.object(RegionCache, "live_slots", lambda self, input_pos: None):
        whole, _, n_mid = run(False)
    with unittest.mock.patch.object(RegionCache, "before_chunk", spy):
        got, frames, _ = run(True)
    assert frames == 0
    torch.testing.assert_close(got, whole, rtol=1e-3, atol=1e-3)
    # (a wave's layers read pieces at different depths: the sizes grow layer by layer)
    assert min(sizes) == 1 and len(set(sizes)) > 3
    assert max(sizes) == n_mid if positions == "cache" else n_mid - 16 < max(sizes) < n_mid
    torch._dynamo.reset()


@pytest.mark.parametrize("name,options", [
    ("quantized", {}), ("quantized", {"positions": "cache"}),
    ("weightedkv", {"kv_middle": "int8"}),
    ("weightedkv", {"kv_middle": "int8", "prompt_compression": "bulk"}),
    ("tova", {"kv_middle": "int8", "positions": "cache"})])
def test_an_int8_middle_holds_only_tokens_older_than_the_step(monkeypatch, name, options):
    """What attend_in_parts reads by (KVView): at every step, prompt chunks and decode, the
    middle slots of a cache with an INT8 middle that a step attends hold tokens older than its
    first query, and every query of the step sees the same of them."""
    model = tiny_model()
    ids = torch.randint(0, 256, (2, 60), generator=torch.Generator().manual_seed(3))
    pos = torch.arange(60)
    checked, view = [], RegionCache.view

    def spy(self, input_pos, q, per_head, mask):
        out = view(self, input_pos, q, per_head, mask)
        mid = out.mask[..., self.n_fast:]  # [B, H|1, T, n]
        assert (mid == mid[:, :, :1]).all()
        held = self.pos[..., self.n_fast:self.n_fast + mid.shape[-1]]  # [B, H|1, n]
        first = input_pos.reshape(-1, input_pos.shape[-1])[:, :1, None]
        assert ((held < first) | ~mid[:, :, 0]).all()
        checked.append((input_pos.shape[-1], bool(mid.any())))
        return out
    monkeypatch.setattr(RegionCache, "view", spy)
    caches = build_caches(model, 2, 256, make_cache_factory(name, cache_size=BUDGET, chunk=8,
                                                            **options))
    with torch.inference_mode():
        for c in range(0, 56, 8):
            model(ids[:, c:c + 8], pos[c:c + 8], caches)
        for t in range(56, 60):
            model(ids[:, t:t + 1], pos[t:t + 1], caches)
    # chunks and token steps both met, with a middle in use
    assert {T for T, used in checked if used} >= {1, 8}


def test_lagkv_scores_partitions_only_at_steps_that_complete_one(monkeypatch):
    """The host tells LagKV which decode steps complete a partition (each row on its own
    positions; prompt chunks always score); the other steps skip the scoring, and every
    statistic and slot is what scoring at every step gives."""
    from caches.lagkv import LagKVCache
    model = tiny_model()
    factory = make_cache_factory("lagkv", cache_size=BUDGET, chunk=8)
    rows = [list(range(1, 30)), list(range(5, 16))]  # rows at different positions

    def run():
        s = Session(model, factory, max_seq_length=256, batch_size=2)
        s.append(rows)
        s.generate(60)
        return s

    calls, before = [], LagKVCache.before_step

    def spy(self, first, last):
        before(self, first, last)
        if self.layer_id == 0:
            calls.append((first, last, self.scoring))
    monkeypatch.setattr(LagKVCache, "before_step", spy)
    scheduled = run()
    c = scheduled.caches[0]

    def completes(p):  # derived here from LagKV's definition, not from the cache's own method
        done = p - c.sink + 1
        return done % c.lag_len == 0 and done >= 2 * c.lag_len
    assert all(on == any(a != b or completes(b) for a, b in zip(first, last))
               for first, last, on in calls)
    assert sum(on for _, _, on in calls) >= 2 and not all(on for _, _, on in calls)
    assert all(c.scoring for c in scheduled.caches)  # back to every step after each step
    monkeypatch.setattr(LagKVCache, "scheduled", False)  # the host never says: every step scores
    every = run()
    for a, b in zip(scheduled.caches, every.caches):
        for name, x in a.state().items():
            assert torch.equal(x, b.state()[name]), name


def test_a_warm_up_compiles_lagkv_with_and_without_scoring():
    """Timings exclude compilation: Session.warmup steps to LagKV's first scoring position."""
    torch._dynamo.reset()
    model = tiny_model()
    counter = CompileCounter()
    s = Session(model, make_cache_factory("lagkv", cache_size=BUDGET, chunk=8), 256)
    s.decode_fn = compile_decode(decode_one_token, model, backend=counter, caches=s.caches)
    s.warmup()
    frames = counter.frame_count
    # the step with and without scoring, a chunk's compression pass alone and stacked (a
    # wavefront's layers at work)
    assert frames == 4
    s.append(list(range(1, 30)))
    s.generate(80)
    assert counter.frame_count == frames


@pytest.mark.parametrize("name,kw,piece", [
    ("weightedkv", {}, 16),  # token steps: pieces of WAVE_PIECE
    ("streaming", {"prompt_compression": "bulk"}, 96),  # one pass: half the 192 rows
])
def test_a_warm_up_compiles_a_wavefront_s_steps(name, kw, piece, monkeypatch):
    """Timings exclude compilation: after Session.warmup a long prompt, read as a wavefront
    (one to four layers at work, stacked), and its decode compile nothing."""
    import engine.runtime.prefill as P
    from engine.runtime.generation import compile_prompt
    torch._dynamo.reset()
    monkeypatch.setattr(P, "WAVE_PIECE", 16)
    model = tiny_model(n_layer=4)
    counter = CompileCounter()
    s = Session(model, make_cache_factory(name, cache_size=BUDGET, chunk=8, **kw), 512)
    s.decode_fn = compile_decode(decode_one_token, model, backend=counter, caches=s.caches)
    s.prefill_fn, s.compiled_prefill = compile_prompt(model, backend=counter), True
    s.warmup()
    frames = counter.frame_count
    waves = []
    read = P.read_by_layer
    # read_prompt passes read_by_layer's arguments in order: the 8th is the piece
    monkeypatch.setattr(P, "read_by_layer", lambda *a: waves.append(a[7]) or read(*a))
    s.append(list(range(1, 200)))
    s.generate(20)
    assert waves == [piece] and counter.frame_count == frames
    torch._dynamo.reset()


def test_quantized_cache_bytes_about_half_of_full_in_bf16():
    model = tiny_model(head_dim=64, n_head=2, n_kv_heads=1).to(torch.bfloat16)  # the real D
    full = Generator(model, 4096).cache_bytes
    quant = Generator(model, 4096, make_cache=make_cache_factory("quantized")).cache_bytes
    assert 0.5 < quant / full < 0.6  # int8 + per-token scales and index maps
    h2o_small = Generator(model, 1024, make_cache=make_cache_factory("h2o", cache_size=64))
    h2o_large = Generator(model, 8192, make_cache=make_cache_factory("h2o", cache_size=64))
    assert h2o_small.cache_bytes == h2o_large.cache_bytes  # budget, not sequence length


# ---- hand-worked examples: one cache, K/V and attention fed by hand --------------------------

def standalone(cls, sink, window, middle, D=4, B=1, H=1, chunk=1, **kw):
    rope = rope_table(64, D, 10000.0, None)
    return cls(B, H, D, 64, torch.float32, rope, sink=sink, window=window, middle=middle,
               chunk=chunk, **kw)


def step(cache, t, value, probs):
    """Write token t (key = value = `value`), then hand the cache attention `probs` over its
    slots, given by position: {pos: p}."""
    x = torch.full((1, 1, 1, cache.k_fast.shape[-1]), float(value))
    cache.update(torch.tensor([[t]]), x.repeat(1, 1, 1, 1), x, x)
    p = torch.zeros(1, 1, 1, 1, cache.capacity)
    for slot, pos in enumerate(cache.pos[0, 0].tolist()):
        if pos in probs:
            p[..., slot] = probs[pos]
    cache.commit(torch.tensor([[t]]), p)


def value_at(cache, position):
    slot = cache.pos[0, 0].tolist().index(position)
    if slot < cache.n_fast:
        return cache.v_fast[0, 0, slot]
    v = cache.mid_rows("v")[0, 0, slot - cache.n_fast]
    return dequantize_words(v) if cache.middle_int8 else v.float()


def test_an_int8_middle_needs_a_head_dim_of_whole_words():
    # Four codes to a word: a head dim of 6 cannot be packed, and the cache says so in one
    # line, with the fix; 8 can.
    with pytest.raises(UserError, match="head dim 6 is not a multiple of 4; use kv_middle"):
        standalone(WeightedKVCache, sink=1, window=2, middle=2, D=6, middle_int8=True)
    assert standalone(WeightedKVCache, sink=1, window=2, middle=2, D=8,
                      middle_int8=True).k_words.shape[-1] == 3  # two words and the scale


def test_an_int8_middle_holds_each_slot_as_one_row_of_words_ending_in_its_scale():
    # K's middle and V's are one buffer each (the scale is the row's last word, not a buffer
    # of its own: fewer inputs for the compiled step); the row dequantizes to the token
    # within half a step of its scale.
    from quantize.kv import EPS, pack
    c = standalone(H2OCache, sink=1, window=2, middle=4, D=8, middle_int8=True)
    assert {n for n, _ in c.named_buffers()} == {"k", "v", "k_words", "v_words", "pos", "acc",
                                                  "rope", "rng_key"}
    torch.manual_seed(0)
    tokens = torch.randn(6, 8)
    for t in range(6):
        x = tokens[t].view(1, 1, 1, 8)
        c.update(torch.tensor([[t]]), x, x, x)
        c.commit(torch.tensor([[t]]), torch.zeros(1, 1, 1, 1, c.capacity))
    held = [(slot, pos) for slot, pos in enumerate(c.pos[0, 0, c.n_fast:].tolist()) if pos >= 0]
    assert len(held) == 3  # tokens 1-3: after the sink, before the window
    for slot, pos in held:
        row, x = c.v_words[0, 0, slot], tokens[pos]
        q, scale = quantize_int8(x)
        assert torch.equal(row[:-1].view(torch.int32), pack(q).view(torch.int32))
        assert row[-1:].view(torch.float32) == scale == x.abs().max() / 127 + EPS
        assert (value_at(c, pos) - x).abs().max() <= scale / 2 + 1e-6


def test_weightedkv_paper_toy_example():
    """WeightedKV Fig. 3: a cache of 4 (sink 1, middle 1, window 2) over tokens 1..5 (positions
    0..4). At step 5 token 2 has the lowest average attention: its key goes, and v3 becomes
    (s2 v2 + s3 v3) / (s2 + s3) = v2/6 + 5 v3/6 with s2 : s3 = 1 : 5."""
    cache = standalone(WeightedKVCache, sink=1, window=2, middle=1)
    v = {0: 1.0, 1: 6.0, 2: 12.0, 3: 3.0, 4: 5.0}
    # a2 = 0.4 over n2 = 4 steps (s2 = 0.1); a3 = 1.5 over n3 = 3 steps (s3 = 0.5)
    attention = [{0: 1.0}, {0: 0.8, 1: 0.2}, {0: 0.5, 1: 0.1, 2: 0.4},
                 {0: 0.4, 1: 0.05, 2: 0.55, 3: 0.0}, {0: 0.3, 1: 0.05, 2: 0.55, 3: 0.05, 4: 0.05}]
    for t in range(5):
        step(cache, t, v[t], attention[t])
    retained = sorted(p for p in cache.pos[0, 0].tolist() if p >= 0)
    assert retained == [0, 2, 3, 4]  # k2 (position 1) removed
    merged = value_at(cache, 2)
    assert torch.allclose(merged, torch.full_like(merged, v[1] / 6 + 5 * v[2] / 6))
    # the ablation drops v2 instead
    evict = standalone(POLICIES["weightedkv-evict"], sink=1, window=2, middle=1)
    for t in range(5):
        step(evict, t, v[t], attention[t])
    assert torch.allclose(value_at(evict, 2), torch.full((4,), v[2]))


@pytest.mark.parametrize("int8", [False, True])
def test_weightedkv_merges_into_the_oldest_window_token(int8):
    cache = standalone(WeightedKVCache, sink=1, window=2, middle=1, middle_int8=int8)
    attention = [{0: 1.0}, {0: 0.5, 1: 0.5}, {0: 0.2, 1: 0.1, 2: 0.7},
                 {0: 0.2, 1: 0.1, 2: 0.6, 3: 0.1}, {0: 0.2, 1: 0.1, 2: 0.6, 3: 0.05, 4: 0.05},
                 {0: 0.2, 2: 0.1, 3: 0.05, 4: 0.6, 5: 0.05}]
    for t, probs in enumerate(attention):
        step(cache, t, 2.0 * t + 1, probs)
    # step 4: middle {1, 2}; s1 = 0.8 / 4 < s2 = 1.9 / 3, so 1 merges into 2 (a middle token).
    # step 5: middle {2, 3}; s3 = 0.2 / 3 < s2 = 2.0 / 4, so 3 merges into its right neighbour
    # 4, the oldest window token.
    retained = sorted(p for p in cache.pos[0, 0].tolist() if p >= 0)
    assert retained == [0, 2, 4, 5]
    s3, s4 = 0.2 / 3, 0.65 / 2
    assert torch.allclose(value_at(cache, 4), torch.full((4,), (s3 * 7 + s4 * 9) / (s3 + s4)),
                          atol=1e-4)
    s1, s2 = 0.8 / 4, 1.9 / 3
    assert torch.allclose(value_at(cache, 2), torch.full((4,), (s1 * 3 + s2 * 5) / (s1 + s2)),
                          atol=1e-4 if not int8 else 0.05)


def test_h2o_tova_a2sf_pick_the_victims_their_scores_imply():
    # Accumulated attention: position 1 got 0.9 long ago, position 2 gets a little every step.
    history = [{0: 1.0}, {0: 0.1, 1: 0.9}, {0: 0.6, 1: 0.0, 2: 0.4},
               {0: 0.6, 1: 0.0, 2: 0.3, 3: 0.1}, {0: 0.5, 1: 0.0, 2: 0.3, 3: 0.1, 4: 0.1}]
    expected = {H2OCache: 2,    # acc: pos1 0.9, pos2 1.0 -> evict 1? no: see below
                TOVACache: 1,   # this step: pos1 0.0 < pos2 0.3
                A2SFCache: 1}   # s = alpha s + a: pos1 decays to 0.9 * 0.2^3 ~ 0.007
    for cls in (H2OCache, TOVACache, A2SFCache):
        cache = standalone(cls, sink=1, window=2, middle=1)
        for t, probs in enumerate(history):
            step(cache, t, t, probs)
        gone = {0, 1, 2, 3, 4} - {p for p in cache.pos[0, 0].tolist() if p >= 0}
        victim = 1 if cls is not H2OCache else (1 if 0.9 < 1.0 else 2)
        assert gone == {victim}, cls.__name__
    assert expected[TOVACache] == 1


def test_h2o_victim_follows_accumulated_attention():
    history = [{0: 1.0}, {0: 0.0, 1: 1.0}, {0: 0.5, 1: 0.3, 2: 0.2},
               {0: 0.5, 1: 0.0, 2: 0.2, 3: 0.3}, {0: 0.5, 1: 0.0, 2: 0.1, 3: 0.2, 4: 0.2}]
    cache = standalone(H2OCache, sink=1, window=2, middle=1)
    for t, probs in enumerate(history):
        step(cache, t, t, probs)
    # acc: position 1 = 1.3, position 2 = 0.5 -> the heavy hitter stays, 2 goes
    assert {p for p in cache.pos[0, 0].tolist() if p >= 0} == {0, 1, 3, 4}


@pytest.mark.parametrize("loud", [1, 2])
def test_knorm_evicts_the_largest_key(loud):
    cache = standalone(KnormCache, sink=1, window=2, middle=1)
    for t in range(5):  # key = value = a constant vector: its norm is 2 |value|
        step(cache, t, 9.0 if t == loud else 1.0, {})
    gone = {0, 1, 2, 3, 4} - {p for p in cache.pos[0, 0].tolist() if p >= 0}
    assert gone == {loud}
    assert not KnormCache.wants_probs and not KeyDiffCache.wants_probs


def test_keydiff_evicts_the_key_most_like_the_mean():
    # un-rotated keys (rank positions), so the directions are the ones written
    cache = standalone(KeyDiffCache, sink=1, window=2, middle=1, positions="cache")
    keys = {0: [1.0, 0, 0, 0], 1: [0, 1.0, 0, 0], 2: [1.0, 0.1, 0, 0], 3: [1.0, 0, 0, 0],
            4: [1.0, 0, 0, 0]}
    for t, k in keys.items():
        x = torch.tensor(k).view(1, 1, 1, 4)
        cache.update(torch.tensor([[t]]), x, x, x)
        cache.commit(torch.tensor([[t]]), None)
    # positions 1 and 2 reach the middle; 2 points where most keys point, 1 is distinctive
    assert {p for p in cache.pos[0, 0].tolist() if p >= 0} == {0, 1, 3, 4}


@pytest.mark.parametrize("middle", ["model", "int8"])
@pytest.mark.parametrize("prompt", ["chunked", "bulk", "snapkv"])
def test_a_key_statistic_is_of_the_key_its_slot_holds(middle, prompt):
    """keydiff's 1 / |k| is taken once, as a key is stored (a prompt chunk, a decode step, a
    one-shot load, the move into an INT8 middle, one by one or in a pass), and moves with its
    token: after a long stream each slot's equals its key's, as stored."""
    model = tiny_model()
    factory = make_cache_factory("keydiff", cache_size=BUDGET, chunk=8, kv_middle=middle,
                                 prompt_compression=prompt)
    gen = Generator(model, max_seq_length=256, make_cache=factory)
    with torch.inference_mode():
        gen.generate([[(5 * i) % 256 for i in range(60)]], 30, temperature=1.0)
    for cache in gen.caches:
        held = cache.pos >= 0
        stat = getattr(cache, cache.key_stat)
        assert held[..., cache.n_fast:].any() and (stat[held] > 0).all()
        torch.testing.assert_close(stat[held], cache.of_key(cache.all_keys())[held],
                                   rtol=1e-6, atol=0)


def test_argmin_ties_go_to_the_oldest():
    history = [{0: 1.0}, {0: 1.0}, {0: 1.0}, {0: 1.0}, {0: 1.0}]  # everyone else scores 0
    cache = standalone(H2OCache, sink=1, window=2, middle=1)
    for t, probs in enumerate(history):
        step(cache, t, t, probs)
    assert {p for p in cache.pos[0, 0].tolist() if p >= 0} == {0, 2, 3, 4}


def test_tova_drops_the_same_token_in_every_head():
    cache = standalone(TOVACache, sink=1, window=2, middle=1, H=2)
    x = torch.zeros(1, 2, 1, 4)
    for t in range(5):
        cache.update(torch.tensor([[t]]), torch.zeros(1, 2, 1, 4), x, x)
        p = torch.zeros(1, 2, 1, 1, cache.capacity)
        p[0, 0, 0, 0, :t + 1] = torch.linspace(0, 1, t + 1)   # head 0 prefers late tokens
        p[0, 1, 0, 0, :t + 1] = torch.linspace(1, 0, t + 1)   # head 1 prefers early ones
        p = p / p.sum(-1, keepdim=True).clamp(min=1e-9)
        cache.commit(torch.tensor([[t]]), p)
    kept = [sorted(q for q in cache.pos[0, h].tolist() if q >= 0) for h in range(2)]
    assert kept[0] == kept[1]


def test_cam_merge_is_reproducible_under_a_seed_and_merges_v_over_m():
    def run(seed):
        cache = standalone(CaMCache, sink=1, window=3, middle=0, merge_span=2, seed=seed, H=4)
        w = torch.rand(4, 40, generator=torch.Generator().manual_seed(0))  # per head, position
        for t in range(30):
            x = torch.full((1, 4, 1, 4), float(t + 1))
            cache.update(torch.tensor([[t]]), x, x, x)
            # attention goes to the two newest tokens only: A_i / mean(A_next) lands in (0, 1)
            pos = cache.pos[0]
            p = torch.where(pos >= t - 1, w.gather(1, pos.clamp(min=0).long()), 0.0)
            cache.commit(torch.tensor([[t]]), (p / p.sum(-1, keepdim=True)).view(1, 4, 1, 1, -1))
        return cache.v_fast.clone(), cache.pos.clone()

    a, b = run(seed=3), run(seed=3)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    runs = [run(seed=s)[0] for s in range(6)]
    assert any(not torch.equal(runs[0], r) for r in runs[1:])  # the draws do depend on the seed


@pytest.mark.parametrize("chunk", [1, 4])
def test_cam_merge_arithmetic_when_the_draw_succeeds(chunk):
    # Uniform attention makes A_i >= mean(A_next) for the oldest token: probability 1.
    cache = standalone(CaMCache, sink=1, window=3, middle=0, merge_span=2, chunk=chunk)
    vals = {}
    for t in range(5):
        x = torch.full((1, 1, 1, 4), float(10 * (t + 1)))
        vals[t] = 10.0 * (t + 1)
        cache.update(torch.tensor([[t]]), x, x, x)
        p = torch.zeros(1, 1, 1, 1, cache.capacity)
        valid = cache.pos[0, 0] >= 0
        p[..., valid] = 1.0 / valid.sum()
        cache.commit(torch.tensor([[t]]), p)
    # step 4: position 1 leaves the window (window = {2, 3, 4}); V_1 / 2 goes to 2 and 3
    assert 1 not in cache.pos[0, 0].tolist()
    assert torch.allclose(value_at(cache, 2), torch.full((4,), vals[2] + vals[1] / 2))
    assert torch.allclose(value_at(cache, 3), torch.full((4,), vals[3] + vals[1] / 2))
    assert torch.allclose(value_at(cache, 4), torch.full((4,), vals[4]))


@pytest.mark.parametrize("chunk", [1, 4])
def test_cam_merges_into_every_follower_when_fewer_than_m_follow(chunk):
    """merge_span 8 over a window of 3: position 1 leaves at step 4 with 2, 3 and 4 after it
    (the ring holds window + chunk slots, some of them stale), so V_1 / 3 goes to each."""
    cache = standalone(CaMCache, sink=1, window=3, middle=0, merge_span=8, chunk=chunk)
    for t in range(5):
        x = torch.full((1, 1, 1, 4), float(10 * (t + 1)))
        cache.update(torch.tensor([[t]]), x, x, x)
        p = torch.zeros(1, 1, 1, 1, cache.capacity)
        valid = cache.pos[0, 0] >= 0
        p[..., valid] = 1.0 / valid.sum()
        cache.commit(torch.tensor([[t]]), p)
    assert sorted(q for q in cache.pos[0, 0].tolist() if q >= 0) == [0, 2, 3, 4]
    for q in (2, 3, 4):
        assert torch.allclose(value_at(cache, q), torch.full((4,), 10.0 * (q + 1) + 20.0 / 3))
    assert torch.allclose(value_at(cache, 0), torch.full((4,), 10.0))


def test_cam_draws_compile_with_the_head_hash_as_a_value_not_an_index():
    """Inductor folds `arange(H) * C` into an index expression, and a GPU kernel computes index
    expressions in int32: Triton rejected the hash constant (0xC2B2AE35 > 2**31, seen on an
    H100). The compiled draws keep the head's product a 64-bit value and equal the eager ones."""
    from torch._inductor.utils import run_and_get_code
    from caches.cam import uniform
    key, cur = torch.tensor([12345]), torch.tensor([[[700]], [[3]]])
    out, code = run_and_get_code(torch.compile(lambda k, c: uniform(k, c, 9, 3)), key, cur)
    assert torch.equal(out, uniform(key, cur, 9, 3))
    assert "3266489909" in code[0]  # the constant is in the kernel ...
    assert "3266489909L*x" not in code[0]  # ... but not as an index multiplier


def test_lagkv_selection_matches_the_formula():
    torch.manual_seed(0)
    L, sink, D, H = 4, 2, 8, 2
    cache = standalone(LagKVCache, sink=sink, window=2 * L, middle=6, D=D, H=H, lag=L,
                       lag_keep_ratio=0.5, positions="cache")
    ks, vs = torch.randn(1, H, 20, D), torch.randn(1, H, 20, D)
    n = sink + 2 * L  # partition 0 = positions [2, 6), successor [6, 10): scored at step 9
    for t in range(n):
        cache.update(torch.tensor([[t]]), torch.zeros(1, H, 1, D), ks[:, :, t:t + 1], vs[:, :, t:t + 1])
        cache.commit(torch.tensor([[t]]), torch.zeros(1, H, 1, 1, cache.capacity))

    def direct(x):
        part, succ = x[0, :, sink:sink + L], x[0, :, sink + L:sink + 2 * L]
        lo, hi = succ.min(dim=1, keepdim=True).values, succ.max(dim=1, keepdim=True).values
        return torch.softmax(((part - lo) / (hi - lo)).std(dim=-1), dim=-1)

    expected = direct(ks) + direct(vs)  # [H, L]
    slots = [cache.pos[0, 0].tolist().index(p) for p in range(sink, sink + L)]
    got = cache.lag_score[0][:, slots]
    assert torch.allclose(got, expected, atol=1e-5)
    keep = cache.keep[0][:, slots]
    top = expected.topk(2, dim=-1).indices
    assert torch.equal(keep, torch.zeros(H, L).scatter_(1, top, 1.0))
    # as partition 0 leaves the window, only its selected tokens enter the middle
    for t in range(n, n + L):
        cache.update(torch.tensor([[t]]), torch.zeros(1, H, 1, D), ks[:, :, t:t + 1], vs[:, :, t:t + 1])
        cache.commit(torch.tensor([[t]]), torch.zeros(1, H, 1, 1, cache.capacity))
    for h in range(H):
        kept = {p for p in cache.pos[0, h].tolist() if sink <= p < sink + L}
        assert kept == {sink + i for i in top[h].tolist()}


# ---- bulk prompt compression: one pass per chunk ---------------------------------------------

def by_position(cache):
    """Per (row, head): {position: (key, value, statistics)} of every retained token, so caches
    that place tokens in other slots compare equal."""
    k, v = cache.all_keys(), cache.all_values()
    stats = [getattr(cache, name) for name in cache.stats]
    out = {}
    for b in range(cache.pos.shape[0]):
        for h in range(cache.pos.shape[1]):
            out[b, h] = {p: (k[b, h, c], v[b, h, c], [s[b, h, c] for s in stats])
                         for c, p in enumerate(cache.pos[b, h].tolist()) if p >= 0}
    return out


def same_by_position(a, b, atol=1e-4) -> bool:
    """by_position(a) == by_position(b) up to atol (float32 summation order)."""
    want, got = by_position(a), by_position(b)
    return all(sorted(want[key]) == sorted(got[key]) and all(
        torch.allclose(x, y, atol=atol)
        for p in want[key] for x, y in zip((*want[key][p][:2], *want[key][p][2]),
                                           (*got[key][p][:2], *got[key][p][2])))
        for key in want)


def bulk_commit(cache, input_pos, probs):
    """commit, with this step's compression done as a bulk pass."""
    if probs is not None:
        cache.accumulate(probs.mean(dim=2), input_pos)
    cache.compress_bulk(input_pos[:, -1:].unsqueeze(-1))


@pytest.mark.parametrize("name", COMPRESSING)
def test_a_bulk_pass_over_one_token_is_the_token_step(name):
    """With one token leaving the window, the bulk pass picks the victim the token step picks
    and removes (merges) it the same way: the same tokens, keys, values and statistics. (Not
    with an INT8 middle: the token step quantizes the token that leaves before it is scored or
    merged; the bulk pass scores and merges its exact key and value.)"""
    import copy
    import functools
    model = tiny_model()
    factory = make_cache_factory(name, cache_size=BUDGET, chunk=8)
    caches = build_caches(model, 2, 128, factory)
    ids = torch.randint(0, 256, (2, 60), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        for t in range(40):
            model(ids[:, t:t + 1], torch.tensor([t]), caches)
        bulk = copy.deepcopy(caches)
        for c in bulk:
            c.commit = functools.partial(bulk_commit, c)
        for t in range(40, 60):  # the fill is long over: every step removes a token
            a = model(ids[:, t:t + 1], torch.tensor([t]), caches)
            b = model(ids[:, t:t + 1], torch.tensor([t]), bulk)
            assert (a - b).abs().max() < 1e-4  # slot order changes summation order only
    assert all(same_by_position(c, d, atol=1e-5) for c, d in zip(caches, bulk))


@pytest.mark.parametrize("name,middle", [(n, m) for n in COMPRESSING
                                         for m in (["model", "int8"] if POLICIES[n].has_middle
                                                   else ["model"])])
def test_the_bulk_pass_is_the_token_steps_exactly_where_the_policy_says_so(name, middle,
                                                                           monkeypatch):
    """Two rows read 56 prompt tokens in chunks of 8 over a budget of 16 (the middle full for
    most of it). Where a policy marks `exact_bulk` (eviction only, every score fixed before its
    token can go), one bulk pass per chunk leaves the tokens, keys, values and statistics that
    the chunk's token steps leave, and chunked prompt compression takes the pass. The other
    policies differ here (merges, or scores that move as the chunk's steps go: WeightedKV's
    a / n, KeyDiff's mean key, Knorm's norm of an INT8 key), so they keep the token steps;
    CaM's pass chains its merges as the steps do, equal up to rounding."""
    model = tiny_model()
    ids = torch.randint(0, 256, (2, 56), generator=torch.Generator().manual_seed(0))

    def read(mode, token_steps=False):
        caches = build_caches(model, 2, 256, make_cache_factory(
            name, cache_size=BUDGET, chunk=8, kv_middle=middle, prompt_compression=mode))
        for c in caches if token_steps else ():
            c.exact_bulk = False
        with torch.inference_mode():
            for s in range(0, 56, 8):
                model(ids[:, s:s + 8], torch.arange(s, s + 8).expand(2, 8), caches)
        return caches

    steps, one_pass = read("chunked", token_steps=True), read("bulk")
    exact, takes_pass = all(same_by_position(a, b) for a, b in zip(steps, one_pass)), \
        one_pass[0].exact_bulk
    # CaM's pass is its token steps' chain (the same here, in float32), but it rounds once where
    # the steps round each merge to the cache dtype: chunked prompts keep the steps.
    assert exact == (takes_pass or name == "cam")
    calls = []
    step = RegionCache.compress_step
    monkeypatch.setattr(RegionCache, "compress_step",
                        lambda self, cur: calls.append(cur) or step(self, cur))
    chunked = read("chunked")
    assert all(same_by_position(a, b, atol=0)
               for a, b in zip(chunked, one_pass if takes_pass else steps))
    assert (len(calls) == 0) == takes_pass


@pytest.mark.parametrize("name,kw", [
    *((n, {"kv_middle": m}) for n in ("weightedkv", "weightedkv-evict", "cam", "keydiff")
      for m in (["model", "int8"] if POLICIES[n].has_middle else ["model"])),
    ("knorm", {"kv_middle": "int8"}),
    ("weightedkv", {"positions": "cache"}),
    ("weightedkv,cam", {"layer_pattern": "repeat"}),  # two kinds, alternating
])
def test_eager_token_steps_run_for_every_layer_at_once(name, kw, monkeypatch):
    """Two rows read 56 prompt tokens in chunks of 8 over a budget of 16, then decode 8 tokens,
    eager. Policies that keep the token steps (no exact pass) wait until every layer has
    attended, then the caches alike take the step's token steps stacked, one call per token for
    all layers: the same buffers, bit for bit, and the same logits as each layer stepping its
    own cache right after attending. Decode steps stack only caches of at most STEP_BYTES."""
    model = tiny_model(n_layer=4)
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    calls = []
    step = RegionCache.compress_step
    monkeypatch.setattr(RegionCache, "compress_step",
                        lambda self, cur: calls.append(cur) or step(self, cur))

    def read():
        calls.clear()
        caches = build_caches(model, 2, 256, make_cache_factory(name, cache_size=BUDGET,
                                                                chunk=8, **kw))
        with torch.inference_mode():
            # as the engine runs a step (engine.runtime.steps.forward): eager steps settle
            logits = [forward(model, ids[:, s:s + 8], torch.arange(s, s + 8).expand(2, 8),
                              caches) for s in range(0, 56, 8)]
            logits += [forward(model, ids[:, t:t + 1], torch.tensor([t]), caches)
                       for t in range(56, 64)]
        return caches, torch.cat(logits, 1), len(calls)

    together, logits, n_together = read()
    layers = len(model.layers)
    kinds = len({c.alike() for c in together})  # caches alike stack: one stack per kind
    assert 1 <= kinds < layers and n_together == 64 * kinds
    assert all(not c.exact_bulk for c in together)
    with monkeypatch.context() as m:  # a decode step stacks only where the copy pays
        m.setattr("caches.region.STEP_BYTES", min(c.nbytes for c in together) - 1)
        assert read()[2] == 56 * kinds + 8 * layers
    monkeypatch.setattr(RegionCache, "settle",  # each layer's steps on its own cache
                        lambda self, waiting, pos: [c.token_steps(pos) for c in waiting])
    alone, logits_alone, n_alone = read()
    assert n_alone == 64 * layers
    assert torch.equal(logits, logits_alone)
    for a, b in zip(together, alone):
        assert a.state().keys() == b.state().keys()
        assert all(torch.equal(x, b.state()[k]) for k, x in a.state().items())


@pytest.mark.parametrize("int8", [False, True])
def test_weightedkv_bulk_pass_merges_a_run_of_victims_into_one_neighbour(int8):
    """Sink 1, window 2, middle 1; tokens 0-2 one by one, then a chunk of 4 (positions 3-6)
    in one pass. Candidates 1-4 (left the window), middle 1: the best (position 2) stays,
    1, 3 and 4 go. 1 merges into 2; 3 and 4 both merge into 5, their next retained token:
    V5 <- (s3 V3 + s4 V4 + s5 V5) / (s3 + s4 + s5), s = a / n at cur = 6."""
    cache = standalone(WeightedKVCache, sink=1, window=2, middle=1, chunk=4, middle_int8=int8,
                       prompt_compression="bulk")
    value = {t: 2.0 * t + 1 for t in range(7)}
    for t in range(3):
        step(cache, t, value[t], {})
    x = torch.tensor([value[t] for t in range(3, 7)]).view(1, 1, 4, 1).expand(1, 1, 4, 4)
    positions = torch.tensor([[3, 4, 5, 6]])
    cache.update(positions, x, x, x)
    acc = {0: 0.3, 1: 0.05, 2: 0.6, 3: 0.1, 4: 0.05, 5: 0.4, 6: 0.0}
    p = torch.zeros(1, 1, 1, 4, cache.capacity)
    for slot, pos in enumerate(cache.pos[0, 0].tolist()):
        p[..., 0, slot] = acc.get(pos, 0.0)
    cache.commit(positions, p)
    assert sorted(q for q in cache.pos[0, 0].tolist() if q >= 0) == [0, 2, 5, 6]
    assert 2 in cache.pos[0, 0, cache.n_fast:].tolist()  # the survivor moved into the middle
    s = {q: acc[q] / (6 - q + 1) for q in acc}
    v2 = (s[1] * value[1] + s[2] * value[2]) / (s[1] + s[2])
    v5 = (s[3] * value[3] + s[4] * value[4] + s[5] * value[5]) / (s[3] + s[4] + s[5])
    assert torch.allclose(value_at(cache, 2), torch.full((4,), v2), atol=0.05 if int8 else 1e-5)
    assert torch.allclose(value_at(cache, 5), torch.full((4,), v5), atol=1e-5)
    assert torch.allclose(value_at(cache, 6), torch.full((4,), value[6]))


def random_bulk_pass(cache, g, positions: int, K: int):
    """Random positions below `positions` (three slots a head empty), statistics and values in
    `cache`; returns K victims a row and head, about a fifth of them staying (victims, do)."""
    B, H, C = cache.pos.shape
    for b in range(B):
        for h in range(H):
            cache.pos[b, h] = torch.randperm(positions, generator=g)[:C].int()
            cache.pos[b, h, torch.randperm(C, generator=g)[:3]] = -1  # empty slots
    cache.acc.copy_(torch.rand(B, H, C, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    victims = torch.stack([torch.randperm(C, generator=g)[:K] for _ in range(B * H)])
    victims = victims.view(B, H, K)
    return victims, (torch.rand(B, H, K, generator=g) < 0.8) & (cache.pos.gather(-1, victims) >= 0)


@pytest.mark.parametrize("seed", range(4))
def test_weightedkv_bulk_merge_matches_a_victim_by_victim_reference(seed):
    """Random slots, positions, statistics and victims (two rows, two heads, some empty slots,
    some victims that stay): each going victim's s_j V_j lands on the next position that
    stays, as a loop over the victims computes it; nothing else changes."""
    cache = standalone(WeightedKVCache, sink=2, window=6, middle=10, chunk=8, B=2, H=2,
                       prompt_compression="bulk")
    B, H, C = cache.pos.shape
    victims, do = random_bulk_pass(cache, torch.Generator().manual_seed(seed), 200, 8)
    cur = torch.full((B, 1, 1), 250)
    pos, v = cache.pos.clone(), cache.v.clone()
    s = cache.score(cur)
    cache.remove_bulk(victims, do, cur)
    expected = v.clone()
    for b in range(B):
        for h in range(H):
            going = {int(j) for j, d in zip(victims[b, h], do[b, h]) if d}
            stays = [c for c in range(C) if pos[b, h, c] >= 0 and c not in going]
            num, total = {}, {}
            for j in going:
                later = [c for c in stays if pos[b, h, c] > pos[b, h, j]]
                if later:
                    r = min(later, key=lambda c: int(pos[b, h, c]))
                    num[r] = num.get(r, 0) + s[b, h, j] * v[b, h, j]
                    total[r] = total.get(r, 0) + s[b, h, j]
            for r in num:
                expected[b, h, r] = (num[r] + s[b, h, r] * v[b, h, r]) / (total[r] + s[b, h, r])
            assert (cache.pos[b, h] == -1).sum() == (pos[b, h] == -1).sum() + len(going)
    assert torch.allclose(cache.v, expected, atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_cam_bulk_merge_matches_a_victim_by_victim_reference(seed):
    """Random slots, positions, statistics and victims (two rows, two heads, some empty slots,
    some victims that stay): the pass is the token steps' chain in position order, each going
    victim whose draw succeeds adding its value then (with what earlier victims added to it)
    / count to each of the next min(m, count) tokens present, later victims included."""
    from caches.cam import uniform_at
    cache = standalone(CaMCache, sink=2, window=12, middle=0, chunk=10, B=2, H=2, merge_span=3,
                       prompt_compression="bulk", seed=seed)
    B, H, C = cache.pos.shape
    victims, do = random_bulk_pass(cache, torch.Generator().manual_seed(seed), 60, 10)
    pos, v, acc = cache.pos.clone(), cache.v.clone(), cache.acc.clone()
    cache.remove_bulk(victims, do, torch.full((B, 1, 1), 80))
    expected, merged, chained = v.clone(), 0, 0
    for b in range(B):
        for h in range(H):
            going = {int(j) for j, d in zip(victims[b, h], do[b, h]) if d}
            present = sorted((int(pos[b, h, c]), c) for c in range(C) if pos[b, h, c] >= 0)
            for _, j in sorted((int(pos[b, h, j]), j) for j in going):
                follow = [c for p, c in present if p > pos[b, h, j]][:3]
                if not follow:
                    continue
                a_next = sum(float(acc[b, h, c]) for c in follow) / len(follow)
                prob = min(max(float(acc[b, h, j]) / a_next, 0.0), 1.0) if a_next > 0 else 1.0
                draw = uniform_at(cache.rng_key.view(-1), pos[b, h, j] + cache.window,
                                  torch.tensor(h + cache.head_offset))
                if float(draw) < prob:
                    merged += 1
                    chained += any(c in going for c in follow)
                    for c in follow:
                        expected[b, h, c] += expected[b, h, j] / len(follow)
            assert (cache.pos[b, h] == -1).sum() == (pos[b, h] == -1).sum() + len(going)
    assert merged >= 4 and chained >= 2  # draws both ways; shares that reach later victims
    kept = cache.pos >= 0
    assert torch.allclose(cache.v[kept], expected[kept], atol=1e-5)


@pytest.mark.parametrize("name", ["weightedkv", "cam", "lagkv", "knorm"])
def test_bulk_prompt_compression_compiled_matches_eager(name):
    torch._dynamo.reset()
    model = tiny_model()
    factory = make_cache_factory(name, cache_size=BUDGET, chunk=8, prompt_compression="bulk")
    prompt = list(range(1, 60))
    gen = Generator(model, max_seq_length=256, make_cache=factory)
    expected = gen.generate(prompt, 20).new_ids[0]
    chunked = Generator(model, max_seq_length=256, make_cache=make_cache_factory(
        name, cache_size=BUDGET, chunk=8)).generate(prompt, 20).new_ids[0]
    counter = CompileCounterWithBackend("inductor")
    compile_decode(decode_one_token, model, backend=counter, caches=gen.caches)
    assert gen.generate(prompt, 20).new_ids[0] == expected
    frames = 3 if name == "lagkv" else 2  # the step (LagKV: with and without scoring), the pass
    assert counter.frame_count == frames
    assert gen.generate(prompt, 20).new_ids[0] == expected and counter.frame_count == frames
    # a prompt within the budget is not compressed at all: bulk and chunked agree exactly
    short = list(range(1, 12))
    assert Generator(model, 256, make_cache=factory).generate(short, 8).new_ids == \
        Generator(model, 256, make_cache=make_cache_factory(name, cache_size=BUDGET, chunk=8)
                  ).generate(short, 8).new_ids
    assert len(chunked) == len(expected) == 20


def test_victims_by_one_integer_key_are_the_stable_sorts_first():
    """smallest(ordered(score) * 2**32 + position) gives the slots two stable argsorts give
    (by position, then by score): ties in score (-0 and 0, -inf, inf) go oldest first, and the
    other slots follow in slot order; first_true is a stable argsort of ~mask."""
    from caches.region import FAR, first_true, ordered, smallest
    g = torch.Generator().manual_seed(0)
    tied = torch.tensor([float("-inf"), -1.5, -0.0, 0.0, 0.25, 3.0, float("inf"), 1e-30])
    for C in (2, 7, 40, 300):
        B, H, K = 2, 3, min(32, C)
        score = torch.where(torch.rand(B, H, C, generator=g) < 0.5,
                            torch.randn(B, H, C, generator=g),
                            tied[torch.randint(0, len(tied), (B, H, C), generator=g)])
        pos = torch.stack([torch.randperm(10 * C, generator=g)[:C] for _ in range(B * H)])
        pos = pos.view(B, H, C).int()
        cand = torch.rand(B, H, C, generator=g) < 0.7
        score = torch.where(cand, score, float("inf"))
        by_pos = torch.where(cand, pos, FAR).argsort(dim=-1, stable=True)
        by_score = score.gather(-1, by_pos).argsort(dim=-1, stable=True)
        slot = torch.arange(C)
        key = ordered(score) * 2**32 + torch.where(cand, pos.long(), FAR - C + slot)
        assert torch.equal(smallest(key, K), by_pos.gather(-1, by_score)[..., :K])
        mask = torch.rand(B, H, C, generator=g) < 0.3
        assert torch.equal(first_true(mask, K), (~mask).int().argsort(dim=-1, stable=True)[..., :K])


def test_first_index_and_argmin_oldest_take_what_argmax_and_argmin_take():
    """first_index(mask) is argmax of the mask (the first slot where it holds, 0 where it holds
    nowhere), and argmin_oldest(score, pos) is argmin of the score with ties to the oldest
    position, then to the first slot (ties in score of every kind, empty slots at -1 and inf,
    a NaN score, every slot tied), eager and compiled, by mins over int32 slot numbers; so is
    first_min(x) argmin of integers x (weightedkv's right neighbour)."""
    from caches.region import FAR, argmin_oldest, first_index, first_min
    g = torch.Generator().manual_seed(5)
    tied = torch.tensor([float("-inf"), -0.0, 0.0, 0.5, float("inf")])
    compiled = tuple(torch.compile(f, backend="inductor", fullgraph=True)
                     for f in (first_index, argmin_oldest, first_min))
    for C in (1, 5, 64, 300):
        B, H = 2, 3
        score = torch.where(torch.rand(B, H, C, generator=g) < 0.5,
                            torch.randn(B, H, C, generator=g),
                            tied[torch.randint(0, len(tied), (B, H, C), generator=g)])
        pos = torch.randint(-1, 3 * C, (B, H, C), generator=g, dtype=torch.int32)
        score[0, 0] = float("inf")  # every slot tied
        score[1, 2, 0] = float("nan")  # the min is NaN: nothing equals it
        mask = torch.rand(B, H, C, generator=g) < 0.2
        mask[0, 1] = False  # nowhere
        want_first = mask.int().argmax(dim=-1)
        best = score.min(dim=-1, keepdim=True).values
        want_victim = torch.where(score == best, pos, FAR).argmin(dim=-1)
        after = torch.where(pos > C, pos, FAR)  # FAR everywhere in some rows
        for first, oldest, least in ((first_index, argmin_oldest, first_min), compiled):
            assert torch.equal(first(mask), want_first)
            assert torch.equal(oldest(score, pos), want_victim)
            assert torch.equal(least(after), after.argmin(dim=-1))
    torch._dynamo.reset()


def ops_seen(fn) -> set:
    """The names of the ATen ops that fn() dispatches."""
    from torch.utils._python_dispatch import TorchDispatchMode
    seen = set()

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with Ops():
        fn()
    return seen


@pytest.mark.parametrize("mode", ["bulk", "snapkv"])
def test_prompt_compression_sorts_nothing(mode):
    """A GPU compiler builds a sort of up to 512 entries as one Triton kernel, and the bulk
    pass's sorts took tens of seconds to compile on an H100: a bulk pass and a
    one-shot prompt pick their slots by topk. The ops of whole generations, every policy (one
    shot into a cache that keeps every token, and has room for it, chooses nothing)."""
    model = tiny_model()
    for name in COMPRESSING:
        factory = make_cache_factory(name, cache_size=BUDGET, chunk=8, prompt_compression=mode)
        seen = ops_seen(lambda: Generator(model, max_seq_length=128, make_cache=factory).generate(
            list(range(1, 60)), 4))
        chooses = not (mode == "snapkv" and POLICIES[name].keeps_every_token)
        assert ("topk" in seen) == chooses and not {"sort", "argsort"} & seen, (name, seen)


def test_eager_generation_writes_slots_with_scatter_not_index_grids():
    """Eager, a slot write is one scatter_: index_put_ takes an index grid per dimension (four
    aranges, their views and a broadcast), which made a token step of ~25 writes and reads
    twice as slow. Compiled steps keep index_put_, which Inductor updates in place
    (`test_a_compiled_step_writes_the_cache_in_place`); `test_inductor_compiled_policy_matches_eager`
    compares the two. Every policy, a prompt and decode steps."""
    model = tiny_model()
    for name in COMPRESSING:
        factory = make_cache_factory(name, cache_size=BUDGET, chunk=8)
        seen = ops_seen(lambda: Generator(model, max_seq_length=128, make_cache=factory).generate(
            list(range(1, 60)), 4))
        assert "scatter_" in seen and not {"index_put_", "_index_put_impl_"} & seen, (name, seen)


# ---- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,needle", [
    (dict(name="h2o", cache_size=8), "cache_size"),            # sink 4 + window 0
    (dict(name="weightedkv", cache_size=16, window=12), "no middle"),
    (dict(name="streaming", kv_middle="int8"), "middle"),
    (dict(name="cam", kv_middle="int8"), "middle"),
    (dict(name="h2o", window=0), "window"),
    (dict(name="h2o", lag=4), "no option `lag`"),
    (dict(name="nope"), "unknown cache policy"),
    (dict(name="lagkv", lag=1000), "`lag`"),
    (dict(name="h2o", prompt_compression="oneshot"), "`prompt_compression`"),
    (dict(name="full", prompt_compression="bulk"), "`prompt_compression`"),
])
def test_bad_cache_configurations_are_one_line_errors(kwargs, needle):
    name = kwargs.pop("name")
    with pytest.raises(UserError) as e:
        make_cache_factory(name, **kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_cache_positions_stream_beyond_max_seq_length():
    model = tiny_model()
    factory = make_cache_factory("weightedkv", cache_size=16, chunk=8, positions="cache")
    gen = Generator(model, 64, make_cache=factory)  # RoPE table of 64 positions
    before = gen.cache_bytes
    out = gen.generate(list(range(1, 11)), 200, temperature=1.0)
    assert out.new_tokens == 200 and gen.cache_bytes == before
    original = Generator(model, 64, make_cache=make_cache_factory("weightedkv", cache_size=16,
                                                                   chunk=8))
    assert original.generate(list(range(1, 11)), 200).new_tokens == 64 - 10  # positions run out


@pytest.mark.parametrize("name", ["streaming", "weightedkv", "cam"])
def test_a_compiled_step_writes_the_cache_in_place(name):
    """Inductor writes a buffer of the graph in place, but a write through a slice of one (a
    region: k_fast, v_mid, ...) copies the slice out and back at every step, and so does a
    write after which the buffer's old value is still read. The compiled step allocates
    nothing of a region's or a buffer's shape: every write is in place."""
    import re
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    model = tiny_model(n_layer=2)
    s = Session(model, make_cache_factory(name, cache_size=24, chunk=8), max_seq_length=256)
    s.append(list(range(1, 40)))  # past the budget: every step compresses
    s.decode_fn = compile_decode(decode_one_token, model, caches=s.caches)
    _, code = run_and_get_code(s.generate, 2)
    c = s.caches[0]
    B, H, _, D = c.k.shape
    shapes = re.findall(r"empty_strided_cpu\(\((\d+), (\d+), (\d+), (\d+)\)", "\n".join(code))
    assert shapes  # the step's code was captured
    for n in (c.n_fast, c.n_mid, c.capacity):  # a one-slot middle has a token's shape
        assert n == 1 or (str(B), str(H), str(n), str(D)) not in shapes, (n, shapes)


def test_compiled_steps_trust_their_guards_for_input_sizes():
    """Dynamo's guards check a compiled graph's inputs before it runs; Inductor's wrapper would
    check every input's sizes and strides again (320 checks a step for the default model). The
    decode step and the compiled prompt-compression step skip that second check."""
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    model = tiny_model(n_layer=2)
    s = Session(model, make_cache_factory("weightedkv", cache_size=24, chunk=8),
                max_seq_length=256)
    s.decode_fn = compile_decode(decode_one_token, model, caches=s.caches)
    _, code = run_and_get_code(lambda: (s.append(list(range(1, 40))), s.generate(2)))
    assert len(code) == 2  # the token-by-token compression step and the decode step
    assert all("assert_size_stride(" not in c and "cpp_fused" in c for c in code)


# ---- a prompt read layer by layer --------------------------------------------------------------

def assert_same_caches(a, b, atol=1e-5):
    for x, y in zip(a, b):
        sa, sb = x.state(), y.state()
        assert sa.keys() == sb.keys()
        for k in sa:
            if sa[k].is_floating_point():
                assert torch.allclose(sa[k], sb[k], atol=atol), k
            else:
                assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("name,kw", [
    *((n, {"prompt_compression": m}) for n in COMPRESSING for m in ("chunked", "bulk")),
    ("weightedkv", {"kv_middle": "int8", "prompt_compression": "bulk"}),
    ("h2o", {"positions": "cache"}),
    ("streaming", {"compression_interval": 4}),
    ("weightedkv,full", {"layer_pattern": "repeat", "prompt_compression": "bulk"}),
    ("weightedkv,full", {"layer_pattern": "repeat"}),
])
@pytest.mark.parametrize("piece", [None, 16])
def test_a_prompt_read_layer_by_layer_is_read_chunk_by_chunk(name, kw, piece):
    """Two rows read 48 tokens in chunks of 8 over a budget of 16, then 48 more (a later
    piece, over retained tokens), eager: engine.runtime.prefill.read_by_layer (each layer's linears on
    all 48 rows, or as a wavefront of pieces of 16 rows, its cache taking the six chunks in
    order) gives forward's logits and caches chunk by chunk, for every policy, the token-step
    ones (their steps settle per chunk and layer; in a wavefront the layers at work go as one
    stack, each at its own positions) and the scheduled ones (LagKV's partitions, a
    compression interval) included."""
    model = tiny_model(n_layer=3)
    ids = torch.randint(0, 256, (2, 96), generator=torch.Generator().manual_seed(1))
    factory = make_cache_factory(name, cache_size=BUDGET, chunk=8, **kw)
    chunked, layered = (build_caches(model, 2, 256, factory) for _ in range(2))
    with torch.inference_mode():
        for s in (0, 48):
            pos = torch.arange(s, s + 48).expand(2, 48)
            want = [model(ids[:, c:c + 8], pos[:, c - s:c - s + 8], chunked)[:, -1]
                    for c in range(s, s + 48, 8)][-1]
            got = read_by_layer(model, ids[:, s:s + 48], pos, layered, 8, torch.tensor([47]),
                                      piece=piece)
            assert torch.allclose(got[:, -1], want, atol=1e-5)
            assert_same_caches(chunked, layered)


def test_a_wavefront_leaves_the_layers_of_a_cache_that_keeps_every_token_alone(monkeypatch):
    """A prompt read as a wavefront (three layers, pieces of 16 rows: up to three layers at
    work, each on its own piece): `quantized`'s layers, whose chunk attends over the middle
    slots in use, take their chunks alone, each chunk over the slots its own positions need
    (in a stack an earlier piece's rows would attend over as many as the latest's);
    `streaming`'s layers at work go as one stack."""
    model = tiny_model(n_layer=3)
    ids = torch.randint(0, 256, (1, 48), generator=torch.Generator().manual_seed(4))
    trim = RegionCache.trim
    for name, stacks in (("quantized", False), ("streaming", True)):
        seen = []  # each chunk's rows (layers x batch), middle slots attended, slots it needs

        def record(self, view, used):
            first = int(self.pos.max()) - view.q.shape[2] + 1  # the chunk's
            seen.append((view.q.shape[0], used, self.in_use(first)))
            return trim(self, view, used)
        monkeypatch.setattr(RegionCache, "trim", record)
        caches = build_caches(model, 1, 256, make_cache_factory(
            name, cache_size=BUDGET, chunk=8, prompt_compression="bulk"))
        with torch.inference_mode():
            read_by_layer(model, ids, torch.arange(48), caches, 8, torch.tensor([47]), piece=16)
        heights = {rows for rows, _, _ in seen}
        assert (max(heights) > 1) == stacks, (name, heights)
        if name == "quantized":
            assert all(used == need for _, used, need in seen)
            # one count a chunk position, but the first two's: none left the window before
            # either (one slot, empty, for the fused kernel)
            assert sorted({used for _, used, _ in seen}) == [1, 8, 16, 24, 32]


def test_one_pass_caches_read_a_prompt_in_two_pieces_of_half_at_most_prefill_piece():
    """layer_piece for caches that compress a chunk in one pass: half the prompt's chunks
    (rounded up), at most PREFILL_PIECE rows, so that two layers at a time share the chunk
    steps; under two chunks, chunk by chunk. Token-step caches keep their smaller pieces."""
    from engine.runtime.prefill import PREFILL_PIECE, layer_piece
    model = tiny_model(n_layer=30)
    one_pass = build_caches(model, 1, 8192, make_cache_factory(
        "weightedkv", cache_size=BUDGET, chunk=128, prompt_compression="bulk"))
    assert [layer_piece(one_pass, 128, rows, 30) for rows in (128, 256, 384, 4096, 16384)] == \
        [None, 128, 256, 2048, PREFILL_PIECE]
    steps = build_caches(model, 1, 8192, make_cache_factory("weightedkv", cache_size=BUDGET,
                                                            chunk=128))
    assert layer_piece(steps, 128, 4096, 30) == 256


@pytest.mark.parametrize("name,kw,piece", [
    ("streaming", {}, 24),
    ("h2o", {}, 24),
    ("weightedkv", {"prompt_compression": "bulk"}, 24),
    ("weightedkv", {}, 16),  # token steps
    ("cam", {}, 16),
])
def test_read_prompt_reads_layer_by_layer_as_a_wavefront(name, kw, piece, monkeypatch):
    """read_prompt reads a 61-token prompt (chunks of 8) layer by layer, as one wavefront over
    its 56 rows of whole chunks (then 5 tokens one by one): in pieces of 24 rows (24, 24, 8)
    where every cache compresses a chunk in one pass, of 16 where a cache takes token steps;
    the logits and caches of BY_LAYER off (chunk by chunk through every layer)."""
    import engine.runtime.prefill as generation
    model = tiny_model(n_layer=2)
    ids = torch.randint(0, 256, (1, 61), generator=torch.Generator().manual_seed(2))
    factory = make_cache_factory(name, cache_size=BUDGET, chunk=8, **kw)
    monkeypatch.setattr(generation, "PREFILL_PIECE", 24)
    monkeypatch.setattr(generation, "WAVE_PIECE", 16)
    pieces = []
    read = generation.read_by_layer
    monkeypatch.setattr(generation, "read_by_layer", lambda model, idx, *a: pieces.append(
        (idx.shape[1], a[5])) or read(model, idx, *a))

    def read_prompt(on):
        monkeypatch.setattr(generation, "BY_LAYER", on)
        caches = build_caches(model, 1, 256, factory)
        with torch.inference_mode():
            return caches, generation.read_prompt(model, caches, ids, torch.zeros(1, 1).long(),
                                                  256)

    caches, logits = read_prompt(True)
    assert pieces == [(56, piece)]
    pieces.clear()
    want_caches, want = read_prompt(False)
    assert pieces == []
    assert torch.allclose(logits, want, atol=1e-5)
    assert_same_caches(caches, want_caches)


@pytest.mark.parametrize("name", ["weightedkv", "streaming"])
def test_a_compiled_chunk_step_reads_as_the_eager_one(name):
    """compile_prompt's chunk step (steps(model).chunk) and compile_decode's token step: read
    through them as a wavefront (four layers, pieces of one chunk: one to four layers at work,
    stacked), a prompt gives the eager whole-prompt read's logits and caches, and each
    compiles two graphs, a cache alone and a stack of any height (none for each height)."""
    from engine.runtime.generation import compile_decode, compile_prompt
    torch._dynamo.reset()
    model = tiny_model(n_layer=4)
    ids = torch.randint(0, 256, (1, 48), generator=torch.Generator().manual_seed(3))
    factory = make_cache_factory(name, cache_size=BUDGET, chunk=8)
    eager, compiled = (build_caches(model, 1, 256, factory) for _ in range(2))
    counter = CompileCounter()
    compile_prompt(model, backend=counter)
    compile_decode(lambda *a: None, model, backend=counter, caches=compiled)
    last = torch.tensor([47])
    with torch.inference_mode():
        want = read_by_layer(model, ids, torch.arange(48), eager, 8, last)
        got = read_by_layer(model, ids, torch.arange(48), compiled, 8, last, steps(model).chunk, 8)
    assert torch.allclose(got, want, atol=1e-5)
    assert_same_caches(eager, compiled)
    token_steps = compiled[0].takes_token_steps(8)
    assert token_steps == (name == "weightedkv")
    assert counter.frame_count == (4 if token_steps else 2)
    torch._dynamo.reset()
