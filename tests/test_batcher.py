"""Continuous batching without HTTP: streams decoded together equal each stream run alone, for
every policy; conversations resume from kept or parked histories; the queue is bounded; cancel
frees a row; the decode step compiles once."""
import threading
import time

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from caches import POLICIES, make_cache_factory
from conftest import tiny_model
from core.errors import UserError
from engine.runtime.batcher import Batcher, QueueFull, SamplingParams, sample_row
from engine.runtime.generation import Generator, Session

S = 256


def factory(name):
    # rank positions, as the server runs a compressing cache; prompts longer than the cache
    return make_cache_factory(name) if name == "full" else \
        make_cache_factory(name, cache_size=48, chunk=8, positions="cache")


def greedy(n):
    return SamplingParams(max_tokens=n, temperature=0)


def prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 40, 70, 1, 33, 100)]


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("prefill_tokens", [8, 512])
def test_streams_batched_together_equal_each_alone(name, prefill_tokens):
    # prefill_tokens 8: a prompt is read one chunk per step while the other rows decode
    model = tiny_model()
    batcher = Batcher(model, factory(name), slots=3, max_seq_length=S,
                      prefill_tokens=prefill_tokens).start()
    try:
        requests = []
        for i, p in enumerate(prompts()):  # arrivals while others decode; more than the slots
            requests.append(batcher.submit(p, greedy(10 + i)))
            time.sleep(0.005 * i)
        outs = [r.result() for r in requests]
    finally:
        batcher.stop()
    for i, (p, out) in enumerate(zip(prompts(), outs)):
        alone = Generator(model, S, make_cache=factory(name)).generate(p, 10 + i)
        assert out == alone.new_ids[0], (name, len(p))
    assert batcher.stats["finished_length"] == len(outs)
    if prefill_tokens == 8:
        assert batcher.stats["steps_beside_a_prompt"] > 0


@pytest.mark.parametrize("name,mode", [("weightedkv", "snapkv"), ("quantized", "snapkv"),
                                       ("h2o", "snapkv"), ("weightedkv", "bulk")])
def test_prompts_are_read_as_alone_whatever_their_prompt_compression(name, mode):
    # A fresh row whose prompt outgrows the budget reads it in one shot with snapkv (whole,
    # past prefill_tokens), as Session does; a later turn of the same stream goes chunk by
    # chunk. Without the one-shot read the server's snapkv streams were plain chunked ones.
    model = tiny_model()
    make = make_cache_factory(name, cache_size=48, chunk=8, positions="cache",
                              prompt_compression=mode)
    g = torch.Generator().manual_seed(3)
    p1, p2 = (torch.randint(0, 256, (n,), generator=g).tolist() for n in (90, 20))
    batcher = Batcher(model, make, slots=2, max_seq_length=S, prefill_tokens=16).start()
    try:
        requests = [batcher.submit(p, greedy(8)) for p in prompts()]
        outs = [r.result() for r in requests]
        o1 = batcher.submit(p1, greedy(8)).result()
        o2 = batcher.submit(p1 + o1 + p2, greedy(8)).result()
    finally:
        batcher.stop()
    for p, out in zip(prompts(), outs):
        assert out == Generator(model, S, make_cache=make).generate(p, 8).new_ids[0], len(p)
    ref = Session(model, make, S)
    ref.append(p1)
    assert o1 == ref.generate(8).new_ids[0]
    ref.append(p2)
    assert o2 == ref.generate(8).new_ids[0]


@pytest.mark.parametrize("name", ["full", "weightedkv", "h2o", "lagkv"])
@pytest.mark.parametrize("slots,parked,traffic", [(2, 2, False), (1, 1, True), (1, 0, True)])
def test_a_conversation_reads_only_its_new_turn(name, slots, parked, traffic):
    # Turn 2's prompt extends turn 1's prompt and reply: it resumes the kept row (or, after
    # other traffic took the row, the parked copy) and equals one Session that appended both.
    model = tiny_model()
    g = torch.Generator().manual_seed(2)
    p1, p2, other = (torch.randint(0, 256, (n,), generator=g).tolist() for n in (50, 45, 30))
    ref = Session(model, factory(name), S)
    ref.append(p1)
    r1 = ref.generate(10).new_ids[0]
    ref.append(p2)
    r2 = ref.generate(10).new_ids[0]

    batcher = Batcher(model, factory(name), slots=slots, max_seq_length=S, parked=parked).start()
    try:
        o1 = batcher.submit(p1, greedy(10)).result()
        if traffic:
            batcher.submit(other, greedy(5)).result()
        second = batcher.submit(p1 + o1 + p2, greedy(10))
        o2 = second.result()
    finally:
        batcher.stop()
    assert o1 == r1
    kept = parked > 0 or not traffic
    # every token of turn 1 but the last reply token (sampled, not yet read) is reused
    assert second.cached_tokens == (len(p1) + len(o1) - 1 if kept else 0)
    assert batcher.stats["prefilled_tokens"] == len(p1) + len(other) * traffic + \
        len(p2) + 1 + (second.cached_tokens == 0) * (len(p1) + len(o1) - 1)
    if kept or name == "full":  # a compressing cache re-reading the history compresses it anew
        assert o2 == r2


def test_the_queue_is_bounded_and_cancel_frees_the_row():
    model = tiny_model()
    batcher = Batcher(model, factory("weightedkv"), slots=1, max_seq_length=S,
                      max_queue=1).start()
    try:
        long = batcher.submit([1, 2, 3], greedy(10**6))
        while not long.tokens:  # running in the one row
            time.sleep(0.01)
        waiting = batcher.submit([4, 5, 6], greedy(5))
        with pytest.raises(QueueFull):
            batcher.submit([7, 8], greedy(5))
        assert batcher.stats["rejected"] == 1
        gone = batcher.submit  # a waiting request can be cancelled too
        batcher.cancel(long)
        assert len(waiting.result()) == 5
        assert long.finish_reason == "cancelled"
        queued = gone([9], greedy(10**6))
        dropped = gone([10], greedy(5))
        batcher.cancel(dropped)
        assert dropped.result() == [] and dropped.finish_reason == "cancelled"
        batcher.cancel(queued)
        queued.result()
        assert batcher.active == 0 and batcher.queued == 0
    finally:
        batcher.stop()


def test_one_request_among_others_is_unaffected_by_their_cancel():
    model = tiny_model()
    alone = Generator(model, S, make_cache=factory("h2o")).generate(prompts()[2], 30).new_ids[0]
    batcher = Batcher(model, factory("h2o"), slots=3, max_seq_length=S).start()
    try:
        others = [batcher.submit(p, greedy(10**6)) for p in prompts()[:2]]
        mine = batcher.submit(prompts()[2], greedy(30))
        time.sleep(0.05)
        for r in others:
            batcher.cancel(r)
        assert mine.result() == alone
    finally:
        batcher.stop()


def test_full_cache_refuses_a_prompt_it_cannot_hold_and_stops_at_its_positions():
    model = tiny_model()
    batcher = Batcher(model, factory("full"), slots=2, max_seq_length=32).start()
    try:
        with pytest.raises(UserError, match="prompt is 32 tokens"):
            batcher.submit(list(range(32)), greedy(5))
        with pytest.raises(UserError, match="empty"):
            batcher.submit([], greedy(5))
        r = batcher.submit(list(range(20)), greedy(100))
        assert len(r.result()) == 12 and r.finish_reason == "length"  # as Generator stops
        assert Generator(model, 32).generate(list(range(20)), 100).new_ids[0] == r.tokens
    finally:
        batcher.stop()


def test_the_decode_step_compiles_once_for_every_request():
    model = tiny_model()
    counter = CompileCounter()
    batcher = Batcher(model, factory("weightedkv"), slots=2, max_seq_length=S,
                      compile_backend=counter)
    batcher.warmup()
    frames = counter.frame_count
    assert frames >= 1
    batcher.start()
    try:
        for p in prompts():
            batcher.submit(p, greedy(6))
        last = batcher.submit(prompts()[0] + [3], greedy(6))
        last.result()
        while batcher.active or batcher.queued:
            time.sleep(0.01)
    finally:
        batcher.stop()
    assert counter.frame_count == frames


@pytest.mark.parametrize("name", ["full", "weightedkv"])
def test_compiled_prompts_take_one_graph_for_every_row(name):
    # compile_prefill: every row's prompt reads through one compiled graph a shape (a chunk, or
    # a length bucket of the full cache) over the row's batch-1 view; the tokens are eager's.
    model = tiny_model()
    g = torch.Generator().manual_seed(4)
    first, *others = (torch.randint(0, 256, (70,), generator=g).tolist() for _ in range(4))

    def serve(compile_prefill):
        counter = CompileCounter()
        batcher = Batcher(model, factory(name), slots=3, max_seq_length=S, prefill_tokens=64,
                          compile_backend=counter, compile_prefill=compile_prefill)
        batcher.warmup()
        batcher.start()
        try:
            outs = [batcher.submit(first, greedy(6)).result()]  # row 0 alone
            frames = [counter.frame_count]
            # the same length on every row at once (rows 1 and 2, then row 0 once parked)
            outs += [r.result() for r in [batcher.submit(p, greedy(6)) for p in others]]
            frames.append(counter.frame_count)
        finally:
            batcher.stop()
        return outs, frames

    _, (decode_only, _) = serve(False)
    outs, frames = serve(True)
    assert frames[1] == frames[0] > decode_only  # the prompt's graphs, none again for a row
    eager = Generator(model, S, make_cache=factory(name))
    for p, out in zip([first, *others], outs):
        assert out == eager.generate(p, 6).new_ids[0]


def test_sampling_parameters():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(300, generator=g)
    best = int(logits.argmax())
    assert sample_row(logits, SamplingParams(temperature=0), g) == best
    assert sample_row(logits, SamplingParams(temperature=1.5, top_k=1), g) == best
    assert sample_row(logits, SamplingParams(temperature=1.0, top_p=1e-6), g) == best
    draws = lambda seed: [sample_row(logits, SamplingParams(temperature=1.0, top_k=50),  # noqa
                                     torch.Generator().manual_seed(seed)) for _ in range(5)]
    assert draws(7) == draws(7)
    top50 = set(torch.topk(logits, 50).indices.tolist())
    many = [sample_row(logits, SamplingParams(temperature=2.0, top_k=50), g) for _ in range(200)]
    assert set(many) <= top50 and len(set(many)) > 10
    nucleus = [sample_row(logits, SamplingParams(temperature=1.0, top_p=0.5), g)
               for _ in range(200)]
    p = torch.softmax(logits, -1)
    order = p.argsort(descending=True)
    k = int((p[order].cumsum(0) < 0.5).sum()) + 1  # the smallest set with half the mass
    assert set(nucleus) <= set(order[:k].tolist())


def test_seeded_requests_repeat_and_run_concurrently():
    model = tiny_model()
    batcher = Batcher(model, factory("streaming"), slots=2, max_seq_length=S).start()
    try:
        params = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=42)
        a, b = batcher.submit([1, 2, 3], params), batcher.submit([1, 2, 3], params)
        assert a.result() == b.result()
        c = batcher.submit([1, 2, 3], SamplingParams(max_tokens=12, temperature=1.0, seed=43))
        assert c.result() != a.tokens
    finally:
        batcher.stop()


def test_requests_from_many_threads():
    model = tiny_model()
    batcher = Batcher(model, factory("tova"), slots=3, max_seq_length=S, max_queue=64).start()
    ps = prompts()
    results = {}

    def client(i):
        results[i] = batcher.submit(ps[i % len(ps)], greedy(8)).result()
    try:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        batcher.stop()
    for i, out in results.items():
        assert out == results[i % len(ps)], i
    assert len(results) == 12


def test_an_engine_failure_ends_the_running_streams_and_the_loop_goes_on():
    model = tiny_model()
    batcher = Batcher(model, factory("streaming"), slots=2, max_seq_length=S).start()
    try:
        step = batcher.step
        batcher.step = lambda *a: (_ for _ in ()).throw(RuntimeError("device lost"))
        failed = batcher.submit([1, 2, 3], greedy(5))
        with pytest.raises(RuntimeError, match="device lost"):
            failed.result()
        assert failed.finish_reason == "error"
        batcher.step = step
        assert batcher.submit([1, 2, 3], greedy(5)).result() == \
            Generator(model, S, make_cache=factory("streaming")).generate([1, 2, 3], 5).new_ids[0]
    finally:
        batcher.stop()


def test_a_server_step_with_its_weights_baked_in_gives_eager_tokens():
    # --bake_weights in serve.py: the slots' step (2 rows) with the weights as graph constants
    from quantize.dense import PackedLinear, pack_dense_linears
    model = pack_dense_linears(tiny_model())
    batcher = Batcher(model, factory("weightedkv"), slots=2, max_seq_length=S,
                      compile_backend="inductor", bake_weights=True)
    batcher.warmup()
    batcher.start()
    try:
        requests = [batcher.submit(p, greedy(6)) for p in prompts()[:3]]
        outs = [r.result() for r in requests]
    finally:
        batcher.stop()
    eager = Generator(model, S, make_cache=factory("weightedkv"))
    for p, out in zip(prompts(), outs):
        assert out == eager.generate(p, 6).new_ids[0]
    assert model.baking_backend.baked == sum(isinstance(m, PackedLinear) for m in model.modules())
