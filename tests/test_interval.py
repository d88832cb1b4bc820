"""compression_interval: decode compresses in one bulk pass every k positions (caches/region.py)."""
import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter

from caches import POLICIES, build_caches, make_cache_factory
from conftest import tiny_model
from core.errors import UserError
from engine.runtime.generation import Generator, Session, compile_decode, decode_one_token
from engine.runtime.steps import reset_steps

COMPRESSING = [p for p in POLICIES if p != "full"]
BUDGET, CHUNK = 16, 8


def factory(name, k, **kw):
    return make_cache_factory(name, cache_size=BUDGET, chunk=CHUNK, compression_interval=k, **kw)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_streaming_holds_the_window_of_the_last_pass_and_what_came_since(k):
    """Streaming: after the token at position t, the cache holds the sink and (P - window, t],
    P the last position with (P + 1) % k == 0 (t itself when it passes): the tokens that left
    the window since the last pass are still attended."""
    model = tiny_model()
    caches = build_caches(model, 1, 256, factory("streaming", k))
    sink, window = caches[0].sink, caches[0].window
    passes = []
    with torch.inference_mode():
        for t in range(80):
            model(torch.tensor([[t % 256]]), torch.tensor([t]), caches)
            if (t + 1) % k == 0:
                passes.append(t)
            P = passes[-1] if passes else -1
            want = {p for p in range(t + 1) if p < sink or p > P - window}
            for c in caches:
                held = c.pos[0, 0][c.pos[0, 0] >= 0].tolist()
                assert sorted(held) == sorted(want), (t, c.layer_id)
                assert (c.pos[0] >= 0).sum(-1).eq(len(want)).all()  # every head alike
    assert len(want) == sink + window + (79 - passes[-1])


@pytest.mark.parametrize("name", COMPRESSING)
def test_compiled_step_matches_eager_with_two_graph_variants(name):
    """Each policy with k = 4: the compiled block step (one graph with a pass, one without)
    gives the eager tokens; the budget holds after every pass; batch rows at different
    positions pass on their own schedules (each row as if alone)."""
    torch._dynamo.reset()
    model = tiny_model()
    f = factory(name, 4)
    prompt = list(range(3, 30))  # three chunks and a remainder read token by token
    eager = Generator(model, max_seq_length=256, make_cache=f)
    expected = eager.generate(prompt, 45).new_ids[0]
    if name not in ("quantized",):
        held = (eager.caches[0].pos >= 0).sum(-1)
        budget = eager.caches[0].sink + eager.caches[0].window + eager.caches[0].middle
        last = len(prompt) + 45 - 2  # the position of the last token the caches read
        assert (held <= budget + (last + 1) % 4).all()
    counter = CompileCounter()
    gen = Generator(model, max_seq_length=256, make_cache=f)
    gen.decode_fn = compile_decode(decode_one_token, model, backend=counter, caches=gen.caches)
    assert gen.generate(prompt, 45).new_ids[0] == expected
    frames = counter.frame_count
    # the step with and without a pass, a chunk's token step and the bulk pass
    assert frames == 4
    assert gen.generate(prompt[:-3], 30).new_ids[0] == eager.generate(prompt[:-3], 30).new_ids[0]
    assert counter.frame_count == frames
    # two rows of different lengths: each row's tokens are those of the row alone
    reset_steps(model)
    rows = [prompt, prompt[5:]]
    both = Session(model, f, max_seq_length=256, batch_size=2)
    both.append(rows)
    out = both.generate(20).new_ids
    for b, row in enumerate(rows):
        alone = Session(model, f, max_seq_length=256)
        alone.append(row)
        assert alone.generate(20).new_ids[0] == out[b], b


@pytest.mark.parametrize("name", ["weightedkv", "lagkv", "cam"])
def test_a_session_saved_between_passes_continues_identically(name, tmp_path):
    model = tiny_model()
    f = factory(name, 8)
    s = Session(model, f, max_seq_length=256)
    s.append(list(range(1, 40)))
    s.generate(13)  # stops between two passes: tokens are waiting in the staging slots
    s.save(tmp_path / "s.safetensors")
    s.append([5, 6, 7] * 4)  # a chunk and a remainder after the waiting tokens
    want = s.generate(25).new_ids[0]
    loaded = Session.load(tmp_path / "s.safetensors", model)
    assert loaded.make_cache.spec == f.spec and f.spec["compression_interval"] == 8
    loaded.append([5, 6, 7] * 4)
    assert loaded.generate(25).new_ids[0] == want


def test_interval_one_is_the_default_and_bad_values_are_refused():
    model = tiny_model()
    ids = torch.randint(0, 256, (1, 50))
    one, default = factory("weightedkv", 1), make_cache_factory("weightedkv", cache_size=BUDGET,
                                                                chunk=CHUNK)
    assert one.spec == default.spec and "compression_interval" not in one.spec
    outs = []
    for f in (one, default):
        caches = build_caches(model, 1, 256, f)
        with torch.inference_mode():
            outs.append(torch.cat([model(ids[:, t:t + 1], torch.tensor([t]), caches)
                                   for t in range(50)], dim=1))
    assert torch.equal(*outs)
    for bad, why in [(0, "between 1 and the prefill chunk"), (CHUNK + 1, "prefill chunk (8)")]:
        with pytest.raises(UserError, match=r"compression_interval"):
            factory("h2o", bad)
        try:
            factory("h2o", bad)
        except UserError as e:
            assert why in str(e) and "\n" not in str(e)
    with pytest.raises(UserError, match="needs a compressing policy"):
        make_cache_factory("full", compression_interval=4)
    layered = make_cache_factory("weightedkv,full", cache_size=BUDGET, chunk=CHUNK,
                                 layer_pattern="repeat", compression_interval=4)
    assert [f.spec.get("compression_interval") for _, _, f in layered.plan(2)] == [4, None]


@pytest.mark.parametrize("name", ["weightedkv", "lagkv"])
def test_a_graph_compiled_around_the_whole_step_passes_every_step(name):
    """A graph compiled around the whole step (the CUDA path) never hears from the host: after
    an eager step the caches are back to every position's work, so the graph passes each step
    (masked by row) and gives the eager tokens, whatever the prompt's last step decided."""
    torch._dynamo.reset()
    model = tiny_model()
    prompt = list(range(1, 30))  # chunks, then single eager steps at positions 24..28
    f = factory(name, 4)
    expected = Generator(model, max_seq_length=256, make_cache=f).generate(prompt, 40).new_ids[0]
    gen = Generator(model, max_seq_length=256, make_cache=f)
    gen.decode_fn = torch.compile(decode_one_token, backend="eager", fullgraph=True)
    assert gen.generate(prompt, 40).new_ids[0] == expected


def test_a_warm_up_compiles_both_variants():
    """Timings exclude compilation: after Session.warmup nothing compiles (the pass variant
    first runs k - 1 steps in)."""
    torch._dynamo.reset()
    model = tiny_model()
    counter = CompileCounter()
    s = Session(model, factory("weightedkv", 8), max_seq_length=256)
    s.decode_fn = compile_decode(decode_one_token, model, backend=counter, caches=s.caches)
    s.warmup()
    frames = counter.frame_count
    s.append(list(range(1, 30)))
    s.generate(30)
    assert counter.frame_count == frames


@pytest.mark.parametrize("name", ["weightedkv", "lagkv"])
def test_the_server_batcher_streams_equal_each_alone(name):
    """Continuous batching (prompt chunks read beside decode steps, rows at their own
    positions) with k = 4: every stream's tokens are those of the prompt run alone."""
    import time
    from engine.runtime.batcher import Batcher, SamplingParams
    model = tiny_model()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 23, 40, 11)]
    batcher = Batcher(model, factory(name, 4), slots=3, max_seq_length=256,
                      prefill_tokens=CHUNK).start()
    try:
        requests = []
        for i, p in enumerate(prompts):
            requests.append(batcher.submit(p, SamplingParams(max_tokens=10 + i, temperature=0)))
            time.sleep(0.005 * i)
        outs = [r.result() for r in requests]
    finally:
        batcher.stop()
    for i, (p, out) in enumerate(zip(prompts, outs)):
        alone = Generator(model, 256, make_cache=factory(name, 4)).generate(p, 10 + i)
        assert out == alone.new_ids[0], (name, len(p))
    assert batcher.stats["steps_beside_a_prompt"] > 0
