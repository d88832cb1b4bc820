"""One-shot prompt compression (--prompt_compression snapkv, caches/snapkv.py)."""
import math

import pytest
import torch

from caches import POLICIES, make_cache_factory
from caches.h2o import H2OCache
from caches.snapkv import keep_middle, observation_votes
from conftest import tiny_model
from core.errors import UserError
from engine.runtime.generation import Generator, Session, compile_decode, decode_one_token
from engine.runtime.steps import steps
from quantize.kv import dequantize_words

COMPRESSING = [n for n in POLICIES if not POLICIES[n].keeps_every_token]
PROMPT = [(7 * i) % 250 + 1 for i in range(150)]


def session(name, n_prompt, **kw):
    s = Session(tiny_model(), make_cache=make_cache_factory(name, cache_size=32, chunk=8, **kw),
                max_seq_length=256)
    s.append(PROMPT[:n_prompt])
    return s


@pytest.mark.parametrize("name", COMPRESSING)
def test_a_prompt_within_the_budget_changes_nothing(name):
    a, b = session(name, 30, prompt_compression="snapkv"), session(name, 30)
    assert torch.equal(a.logits, b.logits)
    for ca, cb in zip(a.caches, b.caches):
        assert all(torch.equal(x, y) for x, y in zip(ca.state().values(), cb.state().values()))
    assert a.generate(20).new_ids == b.generate(20).new_ids


@pytest.mark.parametrize("name, kv_middle", [(n, m) for n in COMPRESSING for m in ("model", "int8")
                                              if m == "model" or POLICIES[n].has_middle])
def test_a_long_prompt_is_read_whole_and_held_to_the_budget(name, kv_middle):
    s = session(name, 150, prompt_compression="snapkv", kv_middle=kv_middle)
    full = Session(tiny_model(), max_seq_length=256)
    full.append(PROMPT)
    assert torch.equal(s.logits, full.logits)  # the prompt's own logits are exact
    for c in s.caches:
        pos = c.pos[0]
        held = [sorted(p[p >= 0].tolist()) for p in pos]
        assert all(len(h) == c.sink + c.window + c.middle for h in held)
        for h in held:  # sink and window always; the rest from the middle
            assert h[:c.sink] == list(range(c.sink))
            assert h[-c.window:] == list(range(150 - c.window, 150))
    out = s.generate(30)
    assert len(out.new_ids[0]) == 30
    assert all(((c.pos >= 0).sum(-1) <= 32).all() for c in s.caches)


def test_quantized_reads_a_prompt_in_one_shot_then_stores_it_in_int8():
    """The quantized cache keeps every token: one shot reads the prompt as `full` does (exact
    logits), then holds all of it, the tokens older than the window in int8, as reading it
    chunk by chunk would hold them (layer 0, whose keys do not depend on earlier attention:
    the same codes and scales for every position)."""
    one = Session(tiny_model(), make_cache=make_cache_factory(
        "quantized", cache_size=32, chunk=8, prompt_compression="snapkv"), max_seq_length=256)
    one.append(PROMPT)
    chunked = session("quantized", 150)
    full = Session(tiny_model(), max_seq_length=256)
    full.append(PROMPT)
    assert torch.equal(one.logits, full.logits)
    assert not torch.equal(chunked.logits, full.logits)  # chunk by chunk attends to int8
    for c in one.caches:
        held = sorted(c.pos[0, 0][c.pos[0, 0] >= 0].tolist())
        assert held == list(range(150))
        assert (c.pos[..., c.n_fast:] >= 0).sum(-1).eq(150 - c.sink - c.window).all()
    a, b = one.caches[0], chunked.caches[0]
    assert int8_by_position(a) == int8_by_position(b)
    assert len(one.generate(10).new_ids[0]) == 10


def int8_by_position(cache) -> dict:
    """Per (row, head, position) of the int8 middle: its codes and scale (slots may differ)."""
    mid = cache.pos[..., cache.n_fast:]
    state = cache.state()  # the codes' words as int32
    return {(b, h, p): tuple(state[name][b, h, s].flatten().tolist()
                             for name in ("k_words", "v_words"))
            for b in range(mid.shape[0]) for h in range(mid.shape[1])
            for s, p in enumerate(mid[b, h].tolist()) if p >= 0}


def assert_int8_middles_close(a, b):
    """The int8 middles of two caches hold the same positions, and each row's values agree
    within one code step of its scale: a compiled graph's keys and values are not bit-equal to
    an eager read's on every CPU (AVX2 differs in the last bits), and a code on a rounding edge
    may then move by one."""
    rows = []
    for cache in (a, b):
        mid, state = cache.pos[..., cache.n_fast:], cache.state()
        rows.append({(bb, h, p): [dequantize_words(state[name][bb, h, s])
                                  for name in ("k_words", "v_words")]
                     for bb in range(mid.shape[0]) for h in range(mid.shape[1])
                     for s, p in enumerate(mid[bb, h].tolist()) if p >= 0})
    assert rows[0].keys() == rows[1].keys()
    for key, xs in rows[0].items():
        for x, y in zip(xs, rows[1][key]):
            step = x.abs().amax().item() / 127
            torch.testing.assert_close(x, y, rtol=1e-4, atol=step * 1.01 + 1e-6)


def test_the_survivors_are_the_best_voted_by_the_observation_window():
    """Queries aligned with a few keys: those keys take the votes, pooling keeps their
    neighbours, and the vote is the group mean of softmax attention from the last W queries."""
    D, T, W = 8, 40, 4
    k = torch.randn(1, 1, T, D) * 0.1
    k[0, 0, 12] = k[0, 0, 25] = torch.ones(D) * 3
    q = torch.ones(1, 2, W, D)  # two query heads in the KV head's group
    probs, votes = observation_votes(q, k)
    scores = q[0, 0] @ k[0, 0].T / math.sqrt(D)
    future = torch.arange(T).view(1, T) > torch.arange(T - W, T).view(W, 1)
    by_hand = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    assert torch.allclose(probs[0, 0], by_hand, atol=1e-6)
    pooled = torch.nn.functional.avg_pool1d(by_hand.sum(0).view(1, 1, T), 7, 1, 3,
                                            count_include_pad=False).view(T)
    assert torch.allclose(votes[0, 0], pooled, atol=1e-6)
    keep = keep_middle(votes, sink=2, window=8, middle=5)
    kept = keep[0, 0].nonzero().view(-1).tolist()
    # pooling spreads each peak's vote over its 7-token neighbourhood: survivors come from both
    assert len(kept) == 5 and all(9 <= t <= 15 or 22 <= t <= 28 for t in kept)
    assert any(t <= 15 for t in kept) and any(t >= 22 for t in kept)
    assert not keep[0, 0, :2].any() and not keep[0, 0, T - 8:].any()
    assert (probs[0, 0, 0, T - W + 1:] == 0).all()  # causal: the first query sees no later key


def test_load_prompt_places_each_survivor_and_hands_the_window_attention_to_the_policy():
    B, H, T, D = 1, 2, 20, 4
    rope = torch.zeros(64, D // 2, 2)
    rope[..., 0] = 1  # identity rotation: stored keys equal the input
    cache = H2OCache(B, H, D, 64, torch.float32, rope, sink=2, window=4, middle=3, chunk=2)
    k = torch.arange(T, dtype=torch.float32).view(1, 1, T, 1).expand(B, H, T, D).clone()
    v = k + 100
    keep = torch.zeros(B, H, T, dtype=torch.bool)
    keep[0, 0, [3, 9, 11]] = True
    keep[0, 1, [5, 6, 13]] = True
    probs = torch.rand(B, H, 3, T)
    cache.load_prompt(k, v, keep, probs)
    for h, mid in ((0, [3, 9, 11]), (1, [5, 6, 13])):
        pos = cache.pos[0, h]
        assert sorted(pos[pos >= 0].tolist()) == sorted([0, 1, *mid, 16, 17, 18, 19])
        assert pos[cache.n_fast:cache.n_fast + 3].tolist() == mid  # in position order
        for slot, p in enumerate(pos.tolist()):
            if p < 0:
                continue
            key = cache.k[0, h, slot]
            assert (key == p).all() and (cache.v[0, h, slot] == p + 100).all()
            # H2O's statistic: the attention the window's queries gave that token
            assert torch.isclose(cache.acc[0, h, slot], probs[0, h, :, p].sum())
        assert (cache.acc[0, h][pos < 0] == 0).all()


def test_a_prompt_appended_to_a_stream_goes_chunk_by_chunk():
    a = session("weightedkv", 10, prompt_compression="snapkv")
    b = session("weightedkv", 10)
    a.append(PROMPT[10:150])
    b.append(PROMPT[10:150])
    assert torch.equal(a.logits, b.logits)


def test_compiled_decode_after_a_one_shot_prompt_matches_eager():
    torch._dynamo.reset()
    model = tiny_model()
    factory = make_cache_factory("weightedkv", cache_size=32, chunk=8, prompt_compression="snapkv")
    gen = Generator(model, max_seq_length=256, make_cache=factory)
    expected = gen.generate(PROMPT, 40).new_ids[0]
    compile_decode(decode_one_token, model, backend="inductor", caches=gen.caches)
    assert gen.generate(PROMPT, 40).new_ids[0] == expected


@pytest.mark.parametrize("name", ["h2o", "quantized"])
def test_a_one_shot_prompt_with_compiled_prompts_reads_through_the_compiled_pieces(name):
    """With compiled prompts and rank positions (its layers load un-rotated keys, which the
    prompt graph's full caches do not hold), a one-shot prompt takes each layer's linears and
    MLP through the compiled pieces (any number of rows, no compile after the warm-up), its
    attention eager: the logits and the caches eager's, up to the GEMMs' rounding. A session
    whose prompts are not compiled leaves the pieces alone."""
    from torch._dynamo.testing import CompileCounter
    from engine.runtime.generation import compile_prompt, read_prompt
    torch._dynamo.reset()
    model = tiny_model()
    factory = make_cache_factory(name, cache_size=32, chunk=8, prompt_compression="snapkv",
                                 positions="cache")
    eager = Session(model, make_cache=factory, max_seq_length=256)
    eager.append(PROMPT)
    s = Session(model, make_cache=factory, max_seq_length=256)
    counter = CompileCounter()
    s.prefill_fn, s.compiled_prefill = compile_prompt(model, backend=counter), True
    s.warmup()
    frames, calls, pieces = counter.frame_count, [], steps(model).pieces
    steps(model).pieces = tuple((lambda f: lambda *a: calls.append(1) or f(*a))(f) for f in pieces)
    s.append(PROMPT)
    assert counter.frame_count == frames and len(calls) == 2 * model.args.n_layer
    torch.testing.assert_close(s.logits, eager.logits, rtol=1e-4, atol=1e-4)
    for a, b in zip(s.caches, eager.caches):
        for key, x in a.state().items():
            torch.testing.assert_close(x.float(), b.state()[key].float(), rtol=1e-3, atol=1e-3)
    s.reset()  # a prompt read uncompiled on the same model leaves its compiled pieces alone
    read_prompt(model, s.caches, torch.tensor([PROMPT]), torch.zeros(1, 1, dtype=torch.long), 256)
    assert len(calls) == 2 * model.args.n_layer
    torch._dynamo.reset()


def test_the_observation_window_is_a_setting_of_snapkv():
    one = session("h2o", 150, prompt_compression="snapkv", observation_window=1)
    wide = session("h2o", 150, prompt_compression="snapkv", observation_window=64)
    assert one.caches[0].observe == 1 and wide.caches[0].observe == 64
    assert not torch.equal(one.caches[1].pos, wide.caches[1].pos)
    spec = one.make_cache.spec
    assert spec["prompt_compression"] == "snapkv" and spec["observation_window"] == 1
    with pytest.raises(UserError, match="add `prompt_compression` snapkv"):
        make_cache_factory("h2o", observation_window=8)
    with pytest.raises(UserError, match="needs a compressing policy"):
        make_cache_factory("full", prompt_compression="snapkv")
    with pytest.raises(UserError, match="at least 1"):
        make_cache_factory("h2o", prompt_compression="snapkv", observation_window=0)


def test_perplexity_after_a_prompt_scores_only_what_follows_it():
    from caches import build_caches
    from engine.evaluation.perplexity import streaming_perplexity
    model = tiny_model()
    whole = streaming_perplexity(model, build_caches(model, 1, 160), PROMPT)
    after = streaming_perplexity(model, build_caches(model, 1, 160), PROMPT, prompt=60)
    assert len(after.nlls) == len(PROMPT) - 60
    assert after.nlls == pytest.approx(whole.nlls[59:], abs=1e-4)  # full: the same logits
    short = {pc: streaming_perplexity(model, build_caches(model, 1, 160, make_cache_factory(
        "h2o", cache_size=64, chunk=8, prompt_compression=pc)), PROMPT, prompt=40)
        for pc in ("chunked", "snapkv")}
    assert short["chunked"].nlls == short["snapkv"].nlls  # within the budget: nothing changes
    long = {pc: streaming_perplexity(model, build_caches(model, 1, 160, make_cache_factory(
        "h2o", cache_size=32, chunk=8, prompt_compression=pc)), PROMPT, prompt=120)
        for pc in ("chunked", "snapkv")}
    assert long["chunked"].nlls != long["snapkv"].nlls
    with pytest.raises(UserError, match="leaves nothing to score"):
        streaming_perplexity(model, build_caches(model, 1, 160), PROMPT, prompt=150)


@pytest.mark.parametrize("name", ["quantized", "streaming", "h2o", "knorm"])
def test_a_compiled_one_shot_prompt_goes_through_the_prompt_graph(name):
    """With compiled prompts, a one-shot prompt goes through the compiled prompt graph into
    full caches of its length bucket, as `full`'s fresh prompt does, not through the eager
    reads that capture queries all the way, and not a second time for the observation window: a
    layer that needs the last queries' attention (a middle to choose: knorm; statistics from it
    too: h2o) takes the queries the graph wrote. The logits are that graph's (`full`'s), the
    caches hold what one shot read eagerly holds (the same survivors; an int8 middle's values
    within a code step, quantized choosing nothing), and a second prompt of the bucket compiles
    nothing (new full caches each prompt, the same graph)."""
    import unittest.mock

    from torch._dynamo.testing import CompileCounter

    import caches.snapkv as snapkv
    from engine.runtime.generation import compile_prompt
    torch._dynamo.reset()
    model = tiny_model(n_layer=2)
    factory = make_cache_factory(name, cache_size=32, chunk=8, prompt_compression="snapkv")
    counter = CompileCounter()
    s = Session(model, make_cache=factory, max_seq_length=256)
    s.prefill_fn, s.compiled_prefill = compile_prompt(model, backend=counter), True
    rows = []  # the rows of each eager read of a capturing cache: none
    real = snapkv.PromptCapture.update

    def spy(self, pos, *a):
        if not torch.compiler.is_compiling():
            rows.append(pos.shape[-1])
        return real(self, pos, *a)

    with unittest.mock.patch.object(snapkv.PromptCapture, "update", spy):
        s.append(PROMPT)
        frames = counter.frame_count
        s.reset()
        s.append(PROMPT[:140])  # the same bucket (256)
    assert frames > 0 and counter.frame_count == frames
    votes = snapkv.needs_votes(s.caches[0], 150)
    assert votes == (name in ("h2o", "knorm"))
    assert rows == []
    s.reset()
    s.append(PROMPT)
    eager = Session(model, make_cache=factory, max_seq_length=256)
    eager.append(PROMPT)
    full = Session(model, max_seq_length=256)
    full.prefill_fn, full.compiled_prefill = s.prefill_fn, True
    full.append(PROMPT)
    assert torch.equal(s.logits, full.logits)
    torch.testing.assert_close(s.logits, eager.logits, rtol=1e-4, atol=1e-4)
    for a, b in zip(s.caches, eager.caches):
        assert torch.equal(a.pos, b.pos)
        for key, x in a.state().items():
            if key not in ("k_words", "v_words"):
                torch.testing.assert_close(x.float(), b.state()[key].float(), rtol=1e-4,
                                           atol=1e-4)
        if a.middle_int8:
            assert_int8_middles_close(a, b)
    assert s.generate(10).new_ids == eager.generate(10).new_ids
    torch._dynamo.reset()
