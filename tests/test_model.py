"""The model and its static cache on tiny random models: incremental == full forward, no
recompiles, prefill buckets, sampling."""
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend

import caches.attention as A

from core import kernels as K
from caches import build_caches, make_cache_factory
from conftest import tiny_model
from engine.runtime.generation import Generator, Session, decode_one_token, sample, settling
from engine.runtime.prefill import prefill, prefill_bucket


def full_logits(model, ids, max_seq_length=64, make_cache=None):
    return model(ids, torch.arange(ids.shape[1]),
                 build_caches(model, ids.shape[0], max_seq_length, make_cache))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_incremental_matches_full_forward(dtype):
    model = tiny_model(attention_bias=True).to(dtype)
    ids = torch.randint(0, 256, (2, 24))
    ref = full_logits(model, ids)
    caches = build_caches(model, 2, 64)
    outs = [model(ids[:, :9], torch.arange(9), caches)]
    for t in range(9, 24):
        outs.append(model(ids[:, t:t + 1], torch.tensor([t]), caches))
    inc = torch.cat(outs, 1)
    tol = 1e-4 if dtype == torch.float32 else 0.1
    assert (inc - ref).abs().max().item() < tol
    # and the model really depends on the past: shuffling the prefix changes the last logits
    shuffled = torch.cat([ids[:, :12].flip(1), ids[:, 12:]], 1)
    assert (full_logits(model, shuffled)[:, -1] - ref[:, -1]).abs().max() > 1e-2


def test_gqa_and_mha_layouts_agree_with_explicit_attention():
    # A Q/K/V reference written from the definition, with K/V repeated per query head.
    model = tiny_model(n_head=4, n_kv_heads=2)
    ids = torch.randint(0, 256, (1, 10))
    logits = full_logits(model, ids)
    layer = model.layers[0].attention
    x = model.tok_embeddings(ids)
    h = model.layers[0].attention_norm(x)
    caches = build_caches(model, 1, 64)
    out = layer(h, torch.arange(10).view(1, -1), caches[0])
    q, k, v = layer.wqkv(h).split([64, 32, 32], -1)
    from model import apply_rope
    rope = caches[0].rope[:10]
    q = apply_rope(q.view(1, 10, 4, 16).transpose(1, 2), rope)
    k = apply_rope(k.view(1, 10, 2, 16).transpose(1, 2), rope).repeat_interleave(2, 1)
    v = v.view(1, 10, 2, 16).transpose(1, 2).repeat_interleave(2, 1)
    att = (q @ k.transpose(-1, -2) / 4.0).masked_fill(torch.ones(10, 10).triu(1).bool(), -1e9)
    ref = layer.wo((att.softmax(-1) @ v).transpose(1, 2).reshape(1, 10, 64))
    assert torch.allclose(out, ref, atol=1e-5)
    assert torch.isfinite(logits).all()


def test_decode_step_never_recompiles():
    model = tiny_model()
    gen = Generator(model, max_seq_length=128)
    counter = CompileCounter()
    gen.decode_fn = torch.compile(decode_one_token, backend=counter, fullgraph=True)
    torch._dynamo.reset()
    result = gen.generate(list(range(1, 8)), max_new_tokens=80, temperature=0.0)
    assert result.new_tokens == 80
    assert counter.frame_count == 1
    # a second generation with another prompt length reuses the same graph
    gen.generate(list(range(1, 20)), max_new_tokens=70, temperature=0.0)
    assert counter.frame_count == 1
    # sampling settings are constants of the graph: one more graph per setting, not per step
    gen.generate(list(range(1, 5)), max_new_tokens=70, temperature=0.7, top_k=5)
    assert counter.frame_count == 2


def test_compiled_generation_matches_eager_and_prefill_buckets_share_graphs():
    torch._dynamo.reset()
    model = tiny_model()
    eager = Generator(model, max_seq_length=96)
    expected = {n: eager.generate(list(range(3, 3 + n)), 12).new_ids[0] for n in (5, 11)}
    gen = Generator(model, max_seq_length=96, compile=True, compile_prefill=True)
    prefill_counter = CompileCounterWithBackend("inductor")
    decode_counter = CompileCounterWithBackend("inductor")
    gen.prefill_fn = torch.compile(prefill, backend=prefill_counter, fullgraph=True, dynamic=False)
    gen.decode_fn = torch.compile(decode_one_token, backend=decode_counter, fullgraph=True)
    for n in (5, 11):  # both pad to the 16-token bucket
        assert gen.generate(list(range(3, 3 + n)), 12).new_ids[0] == expected[n]
    assert prefill_counter.frame_count == 1
    assert decode_counter.frame_count == 1


def test_prefill_bucket():
    assert [prefill_bucket(n, 1000) for n in (1, 16, 17, 100, 700)] == [16, 16, 32, 128, 1000]


def test_sampling():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, -1.0]]).repeat(20000, 1)
    assert sample(logits[:1], 0.0, None).item() == 3
    torch.manual_seed(0)
    draws = sample(logits, 1.0, None).view(-1)
    freq = torch.bincount(draws, minlength=5).float() / draws.numel()
    assert (freq - logits[0].softmax(-1)).abs().max() < 0.015
    topk = sample(logits, 1.0, 2).view(-1)
    assert set(topk.unique().tolist()) == {2, 3}
    torch.manual_seed(1)
    a = sample(logits[:100], 0.9, 3)
    torch.manual_seed(1)
    assert torch.equal(a, sample(logits[:100], 0.9, 3))


def test_generation_stops_at_eos():
    model = tiny_model()
    gen = Generator(model, max_seq_length=64)
    free = gen.generate([1, 2, 3], 20).new_ids[0]
    eos = free[4]
    stopped = gen.generate([1, 2, 3], 20, eos_ids=[eos])
    assert stopped.new_ids[0] == free[:free.index(eos) + 1]
    assert stopped.stopped_at_eos


def test_generation_without_eos_reads_nothing_back_a_step(monkeypatch):
    # Without EOS ids or a callback the decode loop never asks the device whether to stop, so
    # a GPU can run steps back to back: only the first token is checked, before the loop.
    model = tiny_model()
    gen = Generator(model, max_seq_length=64)
    checks = []
    isin = torch.isin
    monkeypatch.setattr(torch, "isin", lambda *a, **k: checks.append(1) or isin(*a, **k))
    free = gen.generate([1, 2, 3], 20)
    assert len(free.new_ids[0]) == 20 and not free.stopped_at_eos
    assert len(checks) == 1
    never = gen.generate([1, 2, 3], 20, eos_ids=[model.args.vocab_size + 5])
    assert never.new_ids == free.new_ids
    assert len(checks) == 1 + 20  # with EOS ids every token is checked


def test_cache_bytes_are_exact():
    model = tiny_model()
    gen = Generator(model, max_seq_length=100, batch_size=2)
    per_layer = 2 * (2 * 2 * 100 * 16 * 4) + 2 * 100 * 8  # K and V float32, pos int64 per row
    assert gen.cache_bytes == 2 * per_layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fresh_prompt_attends_causally_over_its_own_slots(monkeypatch, dtype):
    import caches.full
    model = tiny_model(attention_bias=True).to(dtype)
    ids = torch.randint(0, 256, (2, 24))
    taken = []
    fresh = caches.full.starts_fresh
    monkeypatch.setattr(caches.full, "starts_fresh", lambda p: taken.append(fresh(p)) or taken[-1])
    causal = full_logits(model, ids)
    assert taken and all(taken)  # every layer took the causal path
    monkeypatch.setattr(caches.full, "starts_fresh", lambda p: False)
    masked = full_logits(model, ids)  # the whole static buffer under the mask
    assert (causal - masked).abs().max() < (1e-5 if dtype == torch.float32 else 0.1)
    # A chunk that does not start at 0 keeps the mask (it reads the slots before it).
    assert not fresh(torch.arange(5, 9).view(1, -1)) and not fresh(torch.tensor([[0, 1], [3, 4]]))


def test_a_compiled_fresh_prompt_attends_causally_over_its_own_slots(monkeypatch):
    """--compile_prefill: a graph cannot read the positions on the host, so read_prompt tells
    the caches that every row starts at 0 (`fresh`): a fresh prompt's graph attends causally
    over its own slots; a later turn of the full cache reads eager (under the mask, faster
    than a padded graph), and a layered plan's compiled chunks (read chunk by chunk, as a
    prompt too short to read layer by layer is) keep the mask in their full layers. Logits
    equal eager ones."""
    import engine.runtime.prefill as P
    monkeypatch.setattr(P, "BY_LAYER", False)
    torch._dynamo.reset()
    model = tiny_model()
    prompt, turn = list(range(3, 14)), list(range(20, 29))
    plans = {"full": None,
             "weightedkv,full": make_cache_factory("weightedkv,full", cache_size=16, chunk=4,
                                                   layer_pattern="repeat")}
    causal = {}
    for name, make in plans.items():
        eager = Session(model, make, max_seq_length=96)
        expected = []
        for ids in (prompt, turn):
            eager.append(ids)
            expected.append(eager.logits.clone())
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm.print_readable(print_output=False))
            return gm.forward
        session = Session(model, make, max_seq_length=96, compile_prefill=True)
        session.prefill_fn = settling(torch.compile(prefill, backend=backend, fullgraph=True,
                                                    dynamic=False))
        for ids, want in zip((prompt, turn), expected):
            session.append(ids)
            assert (session.logits - want).abs().max() < 1e-5, name
        causal[name] = [g.count("is_causal = True") for g in graphs]
        torch._dynamo.reset()
    # full: one graph (the fresh prompt's block region); the plan: the chunk shape's graph,
    # compiled at a later chunk too, so its full layers attend under the mask
    assert causal == {"full": [1], "weightedkv,full": [0]}


def test_explicit_attention_path_matches_sdpa_and_reports_probabilities():
    from caches import FullCache

    seen = []

    class ObservingCache(FullCache):
        wants_probs = True

        def commit(self, input_pos, probs):
            seen.append(probs)

    model = tiny_model()
    ids = torch.randint(0, 256, (2, 12))
    ref = full_logits(model, ids)
    out = full_logits(model, ids, make_cache=ObservingCache)
    assert (out - ref).abs().max() < 1e-4
    probs = seen[0]  # [B, Hkv, G, T, S]
    assert probs.shape == (2, 2, 2, 12, 64)
    assert torch.allclose(probs.sum(-1), torch.ones(2, 2, 2, 12))
    assert probs[..., 12:].abs().max() == 0  # empty slots get nothing
    assert probs[0, 0, 0, 3, 4:].abs().max() == 0  # causal


@pytest.mark.parametrize("slots,chunk", [(1089, 256), (1024, 256), (200, 256), (100, 7)])
def test_split_attention_is_the_masked_softmax_in_pieces(slots, chunk):
    # Whole chunks, a shorter last one, chunks with nothing to attend (row 1 stops early) and
    # a single short piece (200 < 256) all give the masked softmax over every slot.
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 16, generator=g) for n in (4, slots, slots))
    pos = torch.arange(slots).view(1, 1, 1, slots)
    mask = (pos <= torch.tensor([slots - 70, slots // 3]).view(2, 1, 1, 1)) & (pos % 5 != 1)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                           attn_mask=mask)
    assert (A.split_attend(q, k, v, mask, chunk).double() - ref).abs().max() < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_in_parts_is_the_masked_softmax_over_all_the_segments(dtype):
    # A chunk's fast slots (causal, some empty) and a middle seen alike by every query, some of
    # its slots empty; in row 1 none at all (the kernel gives such a part no weight).
    g = torch.Generator().manual_seed(0)
    B, Hkv, G, T, D, F, N = 2, 2, 3, 8, 16, 12, 40
    q = torch.randn(B, Hkv, G * T, D, generator=g)
    fast = A.KVSegment(*(torch.randn(B, Hkv, F, D, generator=g) for _ in range(2)))
    mid = A.KVSegment(*(torch.randn(B, Hkv, N, D, generator=g) for _ in range(2)))
    t, s = torch.arange(T).view(T, 1), torch.arange(F).view(1, F)
    causal = (s >= 4) & (s - 4 <= t) | (s < 2)  # 2 sink slots, the chunk from slot 4
    seen = (torch.arange(N) < torch.tensor([30, 0]).view(B, 1)) & (torch.arange(N) % 7 != 3)
    mask = torch.cat([causal.expand(B, 1, T, F), seen.view(B, 1, 1, N).expand(B, 1, T, N)], -1)
    k, v = (torch.cat([a, b], 2).double() for a, b in zip(fast[:2], mid[:2]))
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k, v, attn_mask=A.fold(mask, G), scale=0.3)
    got = A.attend_in_parts(q.to(dtype), [A.KVSegment(*(x.to(dtype) for x in seg[:2]))
                                          for seg in (fast, mid)], mask, 0.3)
    assert got.dtype == dtype
    assert (got.double() - ref).abs().max() < (1e-5 if dtype == torch.float32 else 2e-2)


# compiled: slow (a minute of compiling on a 2-core CPU) for a path the CPU does not take by
# default (split-K decode attention is CUDA's; the CPU's compiled step reads through reductions)
@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_decoding_through_split_attention_keeps_the_tokens(monkeypatch, compiled):
    # With SPLIT_SLOTS set for the device, a decode step that would go to SDPA with a mask
    # attends chunk by chunk: the same greedy tokens, eager and compiled (attention as
    # reductions off, so the CPU's compiled step takes that path too).
    model = tiny_model()
    prompt = list(range(3, 40))
    expected = Generator(model, max_seq_length=100).generate(prompt, 30).new_ids[0]
    calls = []
    split = A.split_attend
    monkeypatch.setattr(A, "split_attend", lambda *a: calls.append(1) or split(*a))
    monkeypatch.setattr(K, "SPLIT_SLOTS", {"cpu": 16})
    monkeypatch.setattr(K, "REDUCE_ROWS", 0)
    torch._dynamo.reset()
    gen = Generator(model, max_seq_length=100, compile=compiled)
    assert gen.generate(prompt, 30).new_ids[0] == expected
    assert calls  # traced once when compiled, called every step and layer when eager
    torch._dynamo.reset()


@pytest.mark.parametrize("word", [torch.float32, torch.int32])
def test_int8_codes_pack_a_quarter_of_the_row_into_each_byte_of_a_word(word, monkeypatch):
    # Byte i of word j holds code i * D/4 + j (the bytes of a little-endian word: the view
    # below), and codes unpacks the words into the row reshaped to [4, D/4], every code from
    # -128 to 127 signed. The words are bit patterns in float32 tensors (many of them NaNs) or
    # int32 ones, as the CPU's vectors load best (quantize/kv.py): compiled (as the step packs,
    # selects and unpacks them), every bit the same.
    import quantize.kv as kv
    from quantize.kv import codes, pack, quantize_int8, quantize_words, widen
    monkeypatch.setattr(kv, "WORD", word)
    c = torch.arange(-128, 128, dtype=torch.int8)[torch.randperm(256)].view(4, 64)
    # and a row of signalling NaNs, 0x7f800001: bytes 3, 2, 1, 0 = 127, -128, 0, 1
    nans = torch.tensor([1, 0, -128, 127], dtype=torch.int8).repeat_interleave(16)
    c = torch.cat([c, nans[None]])
    words = pack(c)
    bytes_ = c.view(5, 4, 16).transpose(-1, -2).contiguous().view(torch.int32).squeeze(-1)
    assert words.dtype == word and torch.equal(words.view(torch.int32), bytes_)
    assert words[4].view(torch.float32).isnan().all()
    assert words[4].view(torch.int32)[0] == 0x7f800001
    assert torch.equal(codes(words), c.float().view(5, 4, 16))
    torch._dynamo.reset()
    keep = torch.rand(5, 16) > 0.5
    step = torch.compile(lambda c, old: (torch.where(keep, pack(c), old), codes(pack(c))),
                         fullgraph=True)
    got_words, got_codes = step(c, words.flip(-1))
    assert torch.equal(got_words.view(torch.int32),
                       torch.where(keep, words, words.flip(-1)).view(torch.int32))
    assert torch.equal(got_codes, codes(words))
    # widen: the codes in the row's order, times their scales, in any dtype, eager or compiled
    scale = torch.rand(5, 1) + 0.5
    for dt in (torch.float32, torch.bfloat16):
        want = (c.float() * scale).to(dt)
        for f in (widen, torch.compile(widen, fullgraph=True)):
            assert torch.equal(f(words, scale, dt), want)
    # A row of a cache: the words, then the scale's bits, compiled as one pointwise write
    x = torch.randn(3, 64) * torch.tensor([[1.0], [1e-3], [300.0]])
    q, scale = quantize_int8(x)
    for rows in (quantize_words(x), torch.compile(quantize_words, fullgraph=True)(x)):
        assert rows.dtype == word and rows.shape == (3, 17)
        assert torch.equal(rows[:, :16].view(torch.int32), pack(q).view(torch.int32))
        assert torch.equal(rows[:, 16:].view(torch.float32), scale)
        # read back whole (a stretch's widen) or a few rows at a time (a merge's reads): the
        # same float32 values, every bit, eager or compiled
        want = q.float() * scale
        for f in (kv.dequantize_words, kv.dequantize_few,
                  torch.compile(kv.dequantize_few, fullgraph=True)):
            assert torch.equal(f(rows), want)
    torch._dynamo.reset()


@pytest.mark.parametrize("compiled, dtype, word", [
    (False, torch.float32, None), (True, torch.float32, None), (True, torch.bfloat16, None),
    (True, torch.float32, "other"), (True, torch.bfloat16, "other")])
def test_int8_stretches_attend_as_their_dequantized_values_do(compiled, dtype, word,
                                                              monkeypatch):
    # Attention over INT8 stretches (codes four to a word, per-token scales) beside float
    # ones, keys or values alone INT8 too (rank positions keep float keys), equals plain
    # softmax attention over the dequantized values. Compiled, the CPU step reads every
    # stretch through reductions or the kernels (a bfloat16 query over float words through a
    # stored float32 copy); eager, through matrix products. word "other": the words in the
    # tensors this CPU does not use (float32 on AVX-512, int32 elsewhere), whose loops
    # Inductor generates differently.
    import quantize.kv as kv
    from quantize.kv import pack
    if word == "other":
        monkeypatch.setattr(kv, "WORD", torch.float32 if kv.WORD == torch.int32 else torch.int32)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 1, 64, generator=g).to(dtype)

    def stretch(n, k_int8, v_int8):  # -> the segment and its K, V in float32
        seg, plain = [], []
        for int8 in (k_int8, v_int8):
            if int8:
                c = torch.randint(-127, 128, (1, 2, n, 64), generator=g, dtype=torch.int8)
                scale = torch.rand(1, 2, n, 1, generator=g) / 50
                seg.append((pack(c), scale))
                plain.append(c.float() * scale)
            else:
                x = torch.randn(1, 2, n, 64, generator=g).to(dtype)
                seg.append((x, None))
                plain.append(x.float())
        (k, ks), (v, vs) = seg
        return A.KVSegment(k, v, ks, vs), plain
    made = [stretch(300, False, False), stretch(100, False, False), stretch(300, True, True),
            stretch(37, True, True), stretch(50, False, True)]
    segs = [m[0] for m in made]
    k = torch.cat([m[1][0] for m in made], dim=2).repeat_interleave(2, dim=1)
    v = torch.cat([m[1][1] for m in made], dim=2).repeat_interleave(2, dim=1)
    mask = torch.rand(1, 1, 1, 787, generator=g) > 0.2
    scores = (q.float() @ k.transpose(-1, -2) / 8).masked_fill(~mask, float("-inf"))
    want_probs = torch.softmax(scores, dim=-1)
    want = want_probs @ v

    def attend(q, segs, mask):
        return A.attend(A.KVView(q, segs, mask), need_probs=True)
    torch._dynamo.reset()
    got, got_probs = (torch.compile(attend, fullgraph=True) if compiled else attend)(q, segs, mask)
    tolerance = 1e-5 if dtype == torch.float32 else want.abs().max().item() / 128  # rounding
    assert got.dtype == dtype and (got.float() - want).abs().max() < tolerance
    assert (got_probs.view(1, 4, 1, -1) - want_probs).abs().max() < 1e-6
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_attention_kernel_reads_strided_stretches_exactly(dtype):
    """kernels.scores / kernels.mix (a compiled CPU step's attention over a cached stretch),
    and scores8 / mix8 over the same as INT8 words: q.k and p @ v in float32 for any number of
    query rows, head sizes in registers (64, 128) and not (40; 36, not a multiple of 8 lanes),
    a stretch sliced out of a larger buffer, by every kernel this CPU has, against float64; bad
    input is a clear error."""
    from core import kernels
    from quantize.kv import dequantize_words, quantize_words, split_words
    assert kernels.available(), "the decode kernels build on every x86 machine of the pool"
    g = torch.Generator().manual_seed(0)
    for b, h, m, s, d in [(1, 3, 3, 1030, 64), (2, 2, 1, 5, 40), (1, 1, 16, 300, 128),
                          (1, 2, 5, 77, 128), (1, 2, 7, 129, 64), (1, 2, 4, 23, 36)]:
        k = torch.randn(b, h, s + 9, d, generator=g).to(dtype)[:, :, 4:4 + s]
        v = torch.randn(b, h + 1, s + 9, d, generator=g).to(dtype)[:, 1:, 2:2 + s]
        q = torch.randn(b, h, m, d, generator=g).to(dtype)
        p = torch.softmax(torch.randn(b, h, m, s, generator=g), dim=-1)
        want_s, want_m = q.double() @ k.double().transpose(-1, -2), p.double() @ v.double()
        for kernel in range(kernels.KERNEL + 1):
            got_s, got_m = kernels.scores(q, k, kernel), kernels.mix(p, v, kernel)
            assert got_s.dtype == got_m.dtype == torch.float32
            torch.testing.assert_close(got_s.double(), want_s, rtol=1e-5, atol=1e-4)
            torch.testing.assert_close(got_m.double(), want_m, rtol=1e-5, atol=1e-5)
        # the same slots as INT8 words in a cache's rows (words, then the scale: quantize/kv.py)
        rows = quantize_words(torch.randn(b, h, s + 3, d, generator=g))[:, :, 1:1 + s]
        words, scale = split_words(rows)
        plain = dequantize_words(rows).double()
        want_s, want_m = q.double() @ plain.transpose(-1, -2), p.double() @ plain
        for kernel in range(kernels.KERNEL + 1):
            got_s, got_m = kernels.scores8(q, words, scale, kernel), \
                kernels.mix8(p, words, scale, kernel)
            torch.testing.assert_close(got_s.double(), want_s, rtol=1e-5, atol=1e-4)
            torch.testing.assert_close(got_m.double(), want_m, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="cached rows must be contiguous"):
        kernels.scores(q, k.transpose(-1, -2).contiguous().transpose(-1, -2))
    with pytest.raises(RuntimeError, match="words for a head of"):
        kernels.scores8(q[..., :8], words, scale)
    with pytest.raises(RuntimeError, match=r"expected \[B, H, M, \*\] against"):
        kernels.mix(p[0], v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_attend_kernel_is_masked_softmax_attention_over_a_stretch(dtype):
    """kernels.attend (a compiled CPU step's attention over a long stretch, without
    probabilities): softmax(q.k * scale, masked) @ v and each row's log-sum-exp, over float or
    INT8 keys and values, for masks of one row or one per query token (row m reads m % T), whole
    blocks of slots masked, a row with nothing to attend (y 0, lse -inf), by every kernel this
    CPU has, against float64; bad input is a clear error."""
    import math

    from core import kernels
    from quantize.kv import dequantize_words, quantize_words, split_words
    assert kernels.available()
    g = torch.Generator().manual_seed(0)
    for b, h, m, t, s, d in [(1, 3, 9, 1, 1030, 64), (2, 2, 4, 2, 300, 40), (1, 1, 16, 1, 5, 128),
                             (1, 2, 6, 3, 129, 36), (1, 2, 3, 1, 0, 64)]:
        q = torch.randn(b, h, m, d, generator=g).to(dtype)
        mask = torch.rand(b, 1, t, s, generator=g) > 0.3
        mask[..., 128:256] = False  # a block with nothing to attend
        mask[0, 0, 0, :] = False  # rows 0, t, 2t, ... of the first (b, h): nothing at all
        kf, vf = (torch.randn(b, h, s + 5, d, generator=g)[:, :, 2:2 + s] for _ in "kv")
        stored = [(kf.to(dtype), vf.to(dtype), None, None, kf.to(dtype).double(),
                   vf.to(dtype).double())]
        if d % 4 == 0:  # INT8 words in a cache's rows, then the scale (quantize/kv.py)
            kr, vr = quantize_words(kf), quantize_words(vf)
            (kw, ks), (vw, vs) = split_words(kr), split_words(vr)
            stored.append((kw, vw, ks, vs, dequantize_words(kr).double(),
                           dequantize_words(vr).double()))
        rows = mask[:, :, torch.arange(m) % t]
        for k, v, ks, vs, k64, v64 in stored:
            x = (q.double() @ k64.transpose(-1, -2) / math.sqrt(d)).masked_fill(~rows, -math.inf)
            want_lse = torch.logsumexp(x, dim=-1)
            want = (torch.softmax(x, dim=-1) @ v64).nan_to_num(0.0)
            for kernel in range(kernels.KERNEL + 1):
                y, lse = kernels.attend(q, k, v, mask, 1 / math.sqrt(d), ks, vs, kernel)
                assert y.dtype == lse.dtype == torch.float32 and y.shape == q.shape
                torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5)
        # A view of several stretches (a region cache's fast slots in the model dtype, then its
        # INT8 middle) in one call: the softmax over all of them, the mask over their slots.
        view = [stored[0], *stored]
        both = torch.cat([mask, mask.flip(-1), mask], dim=-1)
        rows = both[:, :, torch.arange(m) % t]
        x = torch.cat([q.double() @ k64.transpose(-1, -2) for *_, k64, _ in view], dim=-1)
        x = (x / math.sqrt(d)).masked_fill(~rows, -math.inf)
        want = (torch.softmax(x, dim=-1) @ torch.cat([v64 for *_, v64 in view], dim=2))
        for kernel in range(kernels.KERNEL + 1):
            y, lse = kernels.attend_over(q, [st[:4] for st in view], both, 1 / math.sqrt(d),
                                         kernel)
            torch.testing.assert_close(y.double(), want.nan_to_num(0.0), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(lse.double(), torch.logsumexp(x, dim=-1), rtol=1e-5,
                                       atol=1e-5)
    with pytest.raises(RuntimeError, match="over the stretches' S slots"):
        kernels.attend_over(q, [(k, v, ks, vs)] * 2, torch.ones(1, 1, 1, 1, dtype=torch.bool),
                            1.0)
    with pytest.raises(RuntimeError, match="mask must be bool"):
        kernels.attend(q, k, v, mask.float(), 1.0, ks, vs)
    with pytest.raises(RuntimeError, match="both INT8 or both float"):
        kernels.attend(q, k, v, mask, 1.0, ks, None)


def attend_compiled_and_eager(q, segs, mask, need_probs: bool):
    """model.attend over (q, segs, mask) compiled whole, its graph recorded and run eagerly,
    and plain eager -> ((y, probs) compiled, (y, probs) eager, the graph's node targets as
    strings). Dynamo's caches are reset before the trace."""
    graphs = []

    def recording(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes])
        return gm.forward

    def attend(q, segs, mask):
        return A.attend(A.KVView(q, segs, mask), need_probs=need_probs)
    torch._dynamo.reset()
    got = torch.compile(attend, fullgraph=True, backend=recording)(q, segs, mask)
    return got, attend(q, segs, mask), graphs[-1]


@pytest.mark.parametrize("on", [True, False])
def test_a_compiled_cpu_step_attends_through_the_kernels(on, monkeypatch):
    """A compiled few-row CPU step reads each float stretch of ATTEND_SLOTS slots or more
    through kernels.scores and kernels.mix, each such INT8 one through kernels.scores8 and
    kernels.mix8, with the same output and probabilities as eager, or, when no probabilities
    are wanted, the whole view through one call of kernels.attend; a shorter stretch (with
    probabilities), and kernels.ATTENTION = False, keep Inductor's reductions."""
    from core import kernels
    from quantize.kv import pack
    monkeypatch.setattr(kernels, "ATTENTION", on)
    assert kernels.available()  # built before the trace, as the engine does
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 1, 64, generator=g).bfloat16()
    n = kernels.ATTEND_SLOTS  # shorter stretches stay with the reductions (the last one)
    kv = [torch.randn(1, 2, s, 64, generator=g).bfloat16() for s in (n, n + 100)]
    c = torch.randint(-127, 128, (1, 2, n + 30, 64), generator=g, dtype=torch.int8)
    scale = torch.rand(1, 2, n + 30, 1, generator=g) / 50
    segs = [A.KVSegment(kv[0], kv[1][:, :, :n]), A.KVSegment(kv[1], kv[1]),
            A.KVSegment(pack(c), pack(c), scale, scale),
            A.KVSegment(kv[0][:, :, :40], kv[0][:, :, :40])]
    mask = torch.rand(1, 1, 1, 3 * n + 170, generator=g) > 0.2
    (got, got_probs), (want, want_probs), ops = attend_compiled_and_eager(q, segs, mask, True)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got_probs, want_probs, rtol=1e-4, atol=1e-5)
    calls = [t.removeprefix("regionkv.").removesuffix(".default") for t in ops
             if t.startswith(("regionkv.scores", "regionkv.mix"))]
    assert sorted(calls) == (["mix", "mix", "mix8", "scores", "scores", "scores8"] if on else []), \
        ops
    # Without probabilities the whole view, short stretch and INT8 one too, is one call of the
    # attend kernel.
    (got, _), (want, _), ops = attend_compiled_and_eager(q, segs, mask, False)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    calls = [t.removeprefix("regionkv.").removesuffix(".default") for t in ops
             if t.startswith(("regionkv.attend", "regionkv.scores", "regionkv.mix"))]
    assert calls == (["attend"] if on else []), ops
    torch._dynamo.reset()


@pytest.mark.parametrize("need_probs", [False, True])
def test_a_compiled_prompt_chunk_reads_int8_by_a_widened_copy_or_matmuls(need_probs):
    """A compiled step of many query rows (a prompt chunk: 32 tokens, 2 query heads a KV head)
    never reads an INT8 stretch through scores8 / mix8 or a reduction that widens every code
    once per row (a 4k prompt of `quantized` took 33 s that way). Without probabilities the
    stretches are widened to the model dtype once and go through fused SDPA; with them, a
    matmul over the codes. Either way: the values of attention over the dequantized slots
    (computed here in float32), and eager's. The widened copy is kernels.widen8's, equal bit
    for bit to quantize.kv.widen for every kernel this CPU has."""
    from core import kernels
    from quantize.kv import pack
    assert kernels.available()
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 32, 64, generator=g).bfloat16()
    n = kernels.ATTEND_SLOTS
    kv = torch.randn(1, 2, n, 64, generator=g).bfloat16()
    c = torch.randint(-127, 128, (1, 2, n + 30, 64), generator=g, dtype=torch.int8)
    scale = torch.rand(1, 2, n + 30, 1, generator=g) / 50
    segs = [A.KVSegment(kv, kv), A.KVSegment(pack(c), pack(c), scale, scale)]
    mask = torch.rand(1, 1, 32, 2 * n + 30, generator=g) > 0.2
    mask[..., n:] = mask[..., :1, n:]  # the middle seen alike by every query, as in a view (KVView)
    (got, probs), (want, _), ops = attend_compiled_and_eager(q, segs, mask, need_probs)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert (probs is not None) == need_probs
    assert not [t for t in ops if t.startswith(("regionkv.scores", "regionkv.mix"))]
    assert any("scaled_dot_product" in t for t in ops) != need_probs, ops
    # the widened copy by the kernel (Inductor's loop reads float words through the stack)
    assert any(t.startswith("regionkv.widen8") for t in ops) != need_probs, ops
    # The reference: every slot dequantized in float32, attention by its definition.
    from quantize.kv import widen
    for dtype in (torch.float32, torch.bfloat16):
        for kernel in range(kernels.KERNEL + 1):
            assert torch.equal(kernels.widen8(pack(c)[:, :, 7:], scale[:, :, 7:], dtype, kernel),
                               widen(pack(c)[:, :, 7:], scale[:, :, 7:], dtype))
    k = torch.cat([kv.float(), c.float() * scale], dim=2)
    s = (q.float().view(1, 2, 2 * 32, 64) @ k.transpose(-1, -2)) / 8
    p = torch.softmax(s.masked_fill(~mask.repeat(1, 1, 2, 1), float("-inf")), dim=-1)
    ref = (p @ k).view(1, 4, 32, 64)
    torch.testing.assert_close(got.float(), ref, rtol=3e-2, atol=3e-2)
    torch._dynamo.reset()


def test_a_cpu_without_bfloat16_matmuls_reads_values_in_float32(monkeypatch):
    """On an AVX2-only CPU (no oneDNN bfloat16) a bfloat16 matmul takes ATen's fallback, 20-35x
    slower than float32 at attention's shapes: the explicit softmax reads V in float32 there,
    in the model dtype elsewhere."""
    g = torch.Generator().manual_seed(0)
    v = torch.randn(1, 2, 40, 8, generator=g).to(torch.bfloat16)
    p = torch.softmax(torch.randn(1, 2, 3, 40, generator=g), dim=-1)
    seg = A.KVSegment(v, v)
    monkeypatch.setattr(K, "CPU_BF16_MATMUL", False)
    assert torch.equal(seg.mix(p), p @ v.float())
    monkeypatch.setattr(K, "CPU_BF16_MATMUL", True)
    assert torch.equal(seg.mix(p), (p.to(torch.bfloat16) @ v).float())
    assert not torch.equal(p @ v.float(), (p.to(torch.bfloat16) @ v).float())


def test_a_step_with_its_weights_baked_in_matches_eager_and_reads_its_caches_live(monkeypatch):
    """--bake_weights: the linears' weights become constants of the step graph, every cache
    buffer stays an input (the caches compress during these steps, between graph calls), and
    another model gets its own graph; each block's step through its cache is one nested region
    (the same subgraph for every layer: a short compile), and the heap each compile freed is
    given back once."""
    import torch._inductor.compile_fx as inductor
    import engine.runtime.generation as G
    from quantize.dense import PackedLinear, pack_dense_linears
    torch._dynamo.reset()
    trims, release = [], G.release_freed_heap
    monkeypatch.setattr(G, "release_freed_heap", lambda: trims.append(release()))  # glibc: True
    graphs, compile_fx = [], inductor.compile_fx
    monkeypatch.setattr(inductor, "compile_fx", lambda gm, *a, **k: graphs.append(gm) or
                        compile_fx(gm, *a, **k))
    make = make_cache_factory("weightedkv", cache_size=24)
    prompt = list(range(3, 40))
    for seed in (0, 1):
        model = pack_dense_linears(tiny_model(seed))
        eager = Generator(model, 96, make_cache=make).generate(prompt, 16).new_ids[0]
        gen = Generator(model, 96, make_cache=make, compile=True, bake_weights=True)
        assert gen.generate(prompt, 16).new_ids[0] == eager
        weights = sum(isinstance(m, PackedLinear) for m in model.modules())
        assert model.baking_backend.baked == weights  # each linear's weight, nothing else
        assert trims == [True] * model.baking_backend.graphs and trims
        trims.clear()
        regions = [n.args[0].target for n in graphs[-1].graph.nodes
                   if n.target is torch.ops.higher_order.invoke_subgraph]
        assert len(regions) == len(model.layers) and len(set(regions)) == 1


def marks_huge_pages() -> bool:
    """Whether this kernel has transparent huge pages and shows a mapping's advice (VmFlags);
    elsewhere empty_on_huge_pages gives the same tensors without the mark to look for."""
    smaps = Path("/proc/self/smaps")
    return Path("/sys/kernel/mm/transparent_hugepage").is_dir() and smaps.is_file() and \
        "VmFlags:" in smaps.read_text()


def huge_page_advised(t: torch.Tensor) -> bool:
    """Whether the mapping that holds t's first byte is marked for huge pages (VmFlags hg)."""
    addr, inside = t.data_ptr(), False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:  # a mapping's first line: "start-end perms ..."
                lo, hi = (int(a, 16) for a in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                return "hg" in line.split()[1:]
    return False


def test_empty_on_huge_pages_gives_aligned_tensors_that_do_not_alias():
    from core.memory import ALIGN, empty_on_huge_pages
    specs = [((3, 5), torch.float32), ((7,), torch.bfloat16), ((0, 4), torch.float32),
             ((2, 3, 4), torch.int8), ((1000, 576), torch.bfloat16)]
    got = empty_on_huge_pages(specs)
    assert [(tuple(t.shape), t.dtype) for t in got] == [(tuple(s), d) for s, d in specs]
    assert all(t.is_contiguous() and t.data_ptr() % ALIGN == 0 for t in got)
    # one storage each (a compiled region refuses inputs that alias), none overlapping
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in got
                   if t.numel())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert len({t.untyped_storage().data_ptr() for t in got}) == len(got)
    for i, t in enumerate(got):
        t.fill_(i)
    assert [int(t.float().sum()) for t in got] == [0, 7, 0, 72, 4 * 576000]
    if marks_huge_pages():
        assert huge_page_advised(got[-1])


def test_a_loaded_model_keeps_its_weights_in_huge_pages(default_checkpoint):
    """load_model moves every weight into one mapping advised for huge pages: the values are
    the checkpoint's, a tied head still reads the embedding table's memory, and no two weights
    alias (a compiled step's nested block regions take them as separate inputs). On a CPU
    with oneDNN's bfloat16 kernel the linears also hold packed weights in oneDNN's opaque
    layout, memory oneDNN owns: those are left where oneDNN put them."""
    from core.tensors import misaligned, read_safetensors
    from engine.loading.checkpoint import WEIGHTS_NAME, load_model
    model = load_model(default_checkpoint, dtype=torch.bfloat16)
    state = read_safetensors(default_checkpoint / WEIGHTS_NAME)
    for name, t in model.state_dict().items():
        assert torch.equal(t, state.get(name, state["tok_embeddings.weight"]).bfloat16()), name
    held = [t for t in [*model.parameters(), *model.buffers()] if t is not None and t.numel()]
    tensors = [t for t in held if t.layout == torch.strided]
    assert len(tensors) == len(held) or torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert not misaligned(model)
    if model.output.onednn:  # a packed head is oneDNN's own copy; the table stays
        assert model.output.plain is None
    else:
        assert model.output.weight.data_ptr() == model.tok_embeddings.weight.data_ptr()
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == \
        len({t.data_ptr() for t in tensors})
    if marks_huge_pages():
        assert all(huge_page_advised(t) for t in tensors)


def test_a_compiled_step_decodes_from_weights_moved_to_huge_pages():
    from core.memory import move_to_huge_pages
    from quantize.dense import pack_dense_linears
    model = pack_dense_linears(tiny_model(seed=3))
    expected = Generator(model, max_seq_length=64).generate(list(range(3, 12)), 10).new_ids[0]
    wqkv = model.layers[0].attention.wqkv

    def held():  # what the model holds (a PackedLinear's weight property may be a new copy;
        # oneDNN's packed weight is an opaque tensor, which stays where oneDNN put it)
        return [t.data_ptr() for t in [*model.parameters(), wqkv.packed, wqkv.plain]
                if t is not None and t.layout == torch.strided]
    before = held()
    assert move_to_huge_pages(model) > 0
    assert all(a != b for a, b in zip(before, held()))
    torch._dynamo.reset()
    gen = Generator(model, max_seq_length=64, compile=True)
    assert gen.generate(list(range(3, 12)), 10).new_ids[0] == expected
