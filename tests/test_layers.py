"""Caches that differ by layer: budget patterns (pyramid, funnel) and layer patterns (a policy
per layer), built from one plan."""
import json

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from caches import (BUDGET_LEVELS, BUDGET_PATTERNS, LAYER_PATTERNS, POLICIES, LayeredFactory,
                    build_caches, cache_nbytes, make_cache_factory, region_sizes)
from conftest import DATA, run_cli, tiny_model, write_tiny_checkpoint
from core.errors import UserError
from engine.runtime.generation import Generator, Session, compile_decode, decode_one_token
from engine.runtime.steps import steps

KJV = DATA / "kjv_genesis_1_2.txt"  # checked in: CI has no prepared corpora


@pytest.mark.parametrize("pattern", list(BUDGET_PATTERNS))
@pytest.mark.parametrize("n_layers", [1, 2, 3, 5, 8, 24, 30, 32, 80])
@pytest.mark.parametrize("size", [16, 64, 256, 1000])
def test_every_budget_pattern_keeps_the_uniform_total(pattern, n_layers, size):
    budgets = BUDGET_PATTERNS[pattern](n_layers, size)
    assert len(budgets) == n_layers and sum(budgets) == n_layers * size
    assert len(set(budgets)) <= BUDGET_LEVELS + 1  # few shapes: few compiled graphs


def test_pyramid_falls_and_funnel_rises_with_depth():
    pyramid, funnel = BUDGET_PATTERNS["pyramid"](30, 256), BUDGET_PATTERNS["funnel"](30, 256)
    # layer 0 carries the rounding remainder (a few tokens); after it the steps are monotone
    assert pyramid[1:] == sorted(pyramid[1:], reverse=True) and funnel[1:] == sorted(funnel[1:])
    assert pyramid[1] > 1.4 * 256 and pyramid[-1] < 0.6 * 256
    assert funnel[1] < 0.6 * 256 and funnel[-1] > 1.4 * 256
    assert abs(pyramid[0] - pyramid[1]) <= 15


def test_layer_patterns_alternate_or_tile():
    assert LAYER_PATTERNS["repeat"](6, 2) == [0, 1, 0, 1, 0, 1]
    assert LAYER_PATTERNS["tile"](6, 2) == [0, 0, 0, 1, 1, 1]
    assert LAYER_PATTERNS["tile"](5, 2) == [0, 0, 0, 1, 1]
    assert LAYER_PATTERNS["repeat"](5, 3) == [0, 1, 2, 0, 1]


def _logits_and_tokens(factory, n_layer=2, prompt=40, new=30):
    model = tiny_model(n_layer=n_layer)
    gen = Generator(model, max_seq_length=256, make_cache=factory)
    g = gen.generate(list(range(1, prompt + 1)), new)
    session = Session(model, make_cache=factory, max_seq_length=256)
    session.append(list(range(1, prompt + 1)))
    return session.logits, g.new_ids[0], gen.caches


def test_full_in_every_layer_equals_the_full_cache():
    ref_logits, ref_ids, _ = _logits_and_tokens(make_cache_factory("full"))
    for pattern in LAYER_PATTERNS:
        logits, ids, caches = _logits_and_tokens(
            make_cache_factory("full,full", layer_pattern=pattern))
        assert torch.equal(logits, ref_logits) and ids == ref_ids
        assert all(type(c).__name__ == "FullCache" for c in caches)


def test_one_policy_at_a_uniform_budget_is_the_plain_cache():
    """budget_pattern uniform with one policy builds exactly the plain factory."""
    plain = make_cache_factory("weightedkv", cache_size=24, chunk=8)
    assert type(plain) is not LayeredFactory
    ref_logits, ref_ids, _ = _logits_and_tokens(plain)
    logits, ids, _ = _logits_and_tokens(make_cache_factory("weightedkv,weightedkv", cache_size=24,
                                                           chunk=8, layer_pattern="repeat"))
    assert torch.equal(logits, ref_logits) and ids == ref_ids


def test_mixed_layers_each_hold_their_own_policy_and_budget():
    factory = make_cache_factory("weightedkv,full", cache_size=24, chunk=8, kv_middle="int8",
                                 budget_pattern="pyramid", layer_pattern="repeat")
    n_layer = 4
    logits, ids, caches = _logits_and_tokens(factory, n_layer=n_layer, prompt=60)
    assert [type(c).__name__ for c in caches] == ["WeightedKVCache", "FullCache"] * 2
    plan = factory.budgets(n_layer)
    assert [p["policy"] for p in plan] == ["weightedkv", "full"] * 2
    budgets = BUDGET_PATTERNS["pyramid"](n_layer, 24)
    for layer, (cache, p) in enumerate(zip(caches, plan)):
        if p["policy"] == "full":
            assert p["cache_size"] is None
            continue
        assert p["cache_size"] == budgets[layer]
        assert (cache.sink, cache.window, cache.middle) == region_sizes("weightedkv",
                                                                        budgets[layer])
        assert cache.middle_int8  # the middle's settings reach the layers that have one
        assert ((cache.pos >= 0).sum(-1) <= budgets[layer]).all()  # held to its own budget
    # the bytes a plan takes are its layers' own
    model = tiny_model(n_layer=n_layer)
    one = {n: build_caches(model, 1, 256, make_cache_factory(
        n, **({} if n == "full" else dict(cache_size=b, chunk=8, kv_middle="int8"))))
        for n, b in (("full", None),)}
    expected = sum(c.nbytes for c in caches)
    assert cache_nbytes(model.args, 1, 256, torch.float32, factory) == \
        expected + caches[0].rope.numel() * 4
    assert caches[1].nbytes == one["full"][1].nbytes
    assert torch.isfinite(logits).all() and len(ids) == 30


@pytest.mark.parametrize("whole_step", [False, True])
def test_a_plan_compiles_one_block_graph_per_distinct_layer_shape(whole_step):
    """The decode step stays one compiled graph: in it, each distinct (policy, regions) shape of
    layer is one nested block region, and decoding never recompiles. Both forms: the CPU's
    single-token forward, and CUDA's whole step with sampling (traced here without CUDA
    graphs), which unrolled took minutes to compile with compression in every block."""
    torch._dynamo.reset()
    model = tiny_model(n_layer=8)
    factory = make_cache_factory("weightedkv", cache_size=24, chunk=8, budget_pattern="pyramid")
    shapes = len(set(BUDGET_PATTERNS["pyramid"](8, 24)))
    assert shapes == 4
    gen = Generator(model, max_seq_length=256, make_cache=factory)
    expected = gen.generate(list(range(1, 6)), 40).new_ids[0]
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    gen.decode_fn = compile_decode(decode_one_token, model, backend=backend, caches=gen.caches,
                                   whole_step=whole_step)
    assert gen.generate(list(range(1, 6)), 40).new_ids[0] == expected  # prompt < chunk
    gen.generate(list(range(1, 6)), 40)
    assert len(graphs) == 1
    blocks = [n.args[1] for n in graphs[0].graph.nodes if "invoke_subgraph" in str(n.target)]
    assert len(blocks) == 8 and len(set(blocks)) == shapes


@pytest.mark.parametrize("policy,options", [("full", {}), ("weightedkv", {})])
def test_a_compiled_prompt_chunk_runs_its_blocks_through_one_nested_region(policy, options):
    """--compile_prefill: a prompt chunk's graph calls one nested block region per layer, as
    the decode step does, instead of unrolling every block (which took minutes to compile with
    compression in each), and reads the prompt as the eager chunks do. Token steps run after
    the graph, every layer at once (one settle a chunk), not unrolled inside it. (Caches that
    compress a chunk in one pass read prompts layer by layer instead: the test below.)"""
    import engine.runtime.generation as G
    from caches.region import RegionCache
    torch._dynamo.reset()
    model = tiny_model(n_layer=6)
    factory = make_cache_factory(policy, **({"cache_size": 24, "chunk": 8, **options}
                                            if policy != "full" else {}))
    prompt = list(range(1, 40))
    expected = Generator(model, 128, make_cache=factory).generate(prompt, 12).new_ids[0]
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    gen = Generator(model, 128, make_cache=factory, compile_prefill=True)
    gen.prefill_fn = G.settling(torch.compile(G.prefill, backend=backend, fullgraph=True,
                                              dynamic=False))
    settles = []
    settle = RegionCache.settle
    with pytest.MonkeyPatch.context() as m:
        m.setattr(RegionCache, "settle", lambda self, waiting, input_pos: (
            settles.append(len(waiting)), settle(self, waiting, input_pos)))
        assert gen.generate(prompt, 12).new_ids[0] == expected
    # 39 tokens: 4 chunks of 8 (then 7 single tokens, each layer's step in its block region)
    token_steps = policy == "weightedkv" and not options
    assert settles == ([6] * 4 if token_steps else [])
    gen.generate(prompt + [7] * 11, 2)  # another prompt length: the same chunk graph
    assert len(graphs) == 1  # one chunk shape (full: one bucket)
    blocks = [n.args[1] for n in graphs[0].graph.nodes if "invoke_subgraph" in str(n.target)]
    assert len(blocks) == 6 and len(set(blocks)) == 1
    torch._dynamo.reset()


@pytest.mark.parametrize("policy,options,graphs", [
    ("weightedkv", {"prompt_compression": "bulk"}, 2),
    ("streaming", {}, 2),
    # layers of a kind are never both at work in a wave of two pieces: no stacks
    ("weightedkv,full", {"prompt_compression": "bulk", "layer_pattern": "repeat"}, 2),
])
def test_compiled_prompts_read_layer_by_layer_compile_one_chunk_step(policy, options, graphs):
    """--compile_prefill, caches that compress a chunk in one pass: read_prompt takes the
    prompt layer by layer as a wavefront, each layer's chunks through one compiled step (a
    graph per cache kind for a cache alone and one for a stack of layers at work, whatever the
    layers or the prompt's length), and its pieces' norms, linears and MLP through one graph
    each (whatever the layer or the piece's length), with the tokens of eager prompts."""
    import engine.runtime.generation as G
    from caches.attention import through_cache
    from model import block_input, block_output
    torch._dynamo.reset()
    model = tiny_model(n_layer=4)
    factory = make_cache_factory(policy, cache_size=24, chunk=8, **options)
    prompt = list(range(1, 40))
    expected = Generator(model, 128, make_cache=factory).generate(prompt, 12).new_ids[0]
    counter = CompileCounter()
    gen = Generator(model, 128, make_cache=factory, compile_prefill=True)
    steps(model).chunk = torch.compile(through_cache, backend=counter, fullgraph=True,
                                       dynamic=False)
    steps(model).pieces = tuple(G.rows_dynamic(torch.compile(f, backend=counter, fullgraph=True,
                                                           dynamic=False))
                              for f in (block_input, block_output))
    chunk_graph = []
    gen.prefill_fn = lambda *a: chunk_graph.append(a) or G.prefill(*a)
    assert gen.generate(prompt, 12).new_ids[0] == expected
    gen.generate(prompt + [7] * 19, 2)  # another prompt length: the same graphs
    assert counter.frame_count == graphs + 2 and not chunk_graph
    torch._dynamo.reset()


def test_a_layered_session_saves_and_resumes(tmp_path):
    model = tiny_model(n_layer=4)
    factory = make_cache_factory("h2o,streaming", cache_size=20, chunk=4,
                                 layer_pattern="tile", budget_pattern="funnel")
    session = Session(model, make_cache=factory, max_seq_length=256)
    session.append(list(range(1, 50)))
    session.save(tmp_path / "s.session")
    expected = session.generate(20).new_ids[0]
    loaded = Session.load(tmp_path / "s.session", model)
    assert type(loaded.make_cache) is LayeredFactory
    assert loaded.make_cache.budgets(4) == factory.budgets(4)
    assert loaded.generate(20).new_ids[0] == expected


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="weightedkv,full"), "give a `layer_pattern`"),
    (dict(name="weightedkv", layer_pattern="repeat"), "two or more policies"),
    (dict(name="weightedkv", budget_pattern="triangle"), "unknown `budget_pattern` 'triangle'"),
    (dict(name="weightedkv,full", layer_pattern="zigzag"), "unknown `layer_pattern` 'zigzag'"),
    (dict(name="weightedkv,nope", layer_pattern="repeat"), "unknown cache policy 'nope'"),
    (dict(name="full", budget_pattern="pyramid"), "keeps every token"),
    (dict(name="weightedkv", budget_pattern="pyramid", cache_size=256, window=124),
     "layer"),
    (dict(name="streaming,full", layer_pattern="repeat", kv_middle="int8"), "middle"),
    (dict(name="streaming,full", layer_pattern="repeat", forgetting_factor=0.5),
     "forgetting_factor"),
])
def test_bad_plans_are_one_line_errors(kwargs, message):
    kwargs = dict(kwargs)
    name = kwargs.pop("name")
    with pytest.raises(UserError, match=message) as e:
        make_cache_factory(name, **kwargs).layers(30)
    assert "\n" not in str(e.value)


def test_a_pattern_that_does_not_fit_the_layer_count():
    factory = make_cache_factory("weightedkv,h2o,streaming", cache_size=32, layer_pattern="tile")
    with pytest.raises(UserError, match="assigns 3 policies to 2 layers"):
        build_caches(tiny_model(n_layer=2), 1, 64, factory)
    # a pyramid's last layers are the first to fall below sink + window + 1
    with pytest.raises(UserError, match=r"gives layer \d+ \(weightedkv\) \d+ tokens"):
        make_cache_factory("weightedkv", cache_size=40, window=20,
                           budget_pattern="pyramid").layers(8)


def test_policies_listed_by_layer_cover_every_policy():
    for name in POLICIES:
        if name == "full":
            continue
        factory = make_cache_factory(f"{name},full", cache_size=32, layer_pattern="repeat")
        assert [p["policy"] for p in factory.budgets(2)] == [name, "full"]


@pytest.fixture(scope="module")
def tiny_ckpt(default_checkpoint, tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("layers") / "ckpt", default_checkpoint,
                                 vocab_size=49152, n_layer=4, dim=64, n_head=4, n_kv_heads=2,
                                 head_dim=16, intermediate_size=128, tie_embeddings=True)


def test_generate_and_eval_take_patterns_and_report_the_budgets(tiny_ckpt):
    out = run_cli("generate.py", "--checkpoint_path", tiny_ckpt, "--cache", "weightedkv,full",
                  "--layer_pattern", "repeat", "--budget_pattern", "pyramid", "--cache_size", 32,
                  "--prompt", "In the beginning " * 20, "--max_new_tokens", 8, "--json")
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)
    budgets = BUDGET_PATTERNS["pyramid"](4, 32)
    assert row["layers"] == [{"policy": "weightedkv", "cache_size": budgets[0]},
                             {"policy": "full", "cache_size": None},
                             {"policy": "weightedkv", "cache_size": budgets[2]},
                             {"policy": "full", "cache_size": None}]
    assert row["budget_pattern"] == "pyramid" and row["layer_pattern"] == "repeat"
    out = run_cli("eval.py", "ppl", "--checkpoint_path", tiny_ckpt, "--cache", "h2o",
                  "--budget_pattern", "funnel", "--cache_size", 32, "--max_tokens", 80,
                  "--text_file", KJV)
    assert out.returncode == 0, out.stderr
    assert "note: layers 0 h2o" in out.stderr and "ppl" in out.stdout
    out = run_cli("generate.py", "--checkpoint_path", tiny_ckpt, "--cache", "weightedkv,full",
                  "--prompt", "hi", "--max_new_tokens", 2)
    assert out.returncode == 2 and out.stderr.startswith("error: ") and \
        "--layer_pattern" in out.stderr and out.stderr.count("\n") == 1
    out = run_cli("generate.py", "--checkpoint_path", tiny_ckpt, "--cache", "weightedkv,bogus",
                  "--layer_pattern", "repeat", "--prompt", "hi")
    assert out.returncode == 2 and "unknown cache policy 'bogus'" in out.stderr


def test_eval_scores_what_follows_a_one_shot_prompt(tiny_ckpt):
    out = run_cli("eval.py", "ppl", "--checkpoint_path", tiny_ckpt, "--cache", "h2o",
                  "--cache_size", 24, "--prompt_compression", "snapkv", "--max_tokens", 90,
                  "--prompt_tokens", 60, "--text_file", KJV, "--json")
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)
    assert row["tokens"] == 30 and row["prompt_tokens"] == 60
    assert row["prompt_compression"] == "snapkv"
    out = run_cli("eval.py", "ppl", "--checkpoint_path", tiny_ckpt, "--max_tokens", 90,
                  "--prompt_tokens", 90, "--text_file", KJV)
    assert out.returncode == 2 and "--prompt_tokens 90 must be between 0 and 89" in out.stderr
