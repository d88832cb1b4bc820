"""Run by tests/test_tp.py, alone and under torchrun: greedy tokens and streaming NLL of every
cache policy (and the INT8 middle) on one checkpoint, written as JSON by rank 0.

    python tests/tp_matrix.py CKPT OUT.json [--compile POLICY,...]
    torchrun --nproc_per_node 2 tests/tp_matrix.py CKPT OUT.json
"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caches import POLICIES, build_caches, make_cache_factory  # noqa: E402
from engine.loading.checkpoint import load_model  # noqa: E402
from engine.evaluation.perplexity import streaming_perplexity  # noqa: E402
from engine.runtime.generation import Generator  # noqa: E402
from engine.runtime.tp import finish, start  # noqa: E402

MATRIX = [(p, "model") for p in POLICIES] + [("weightedkv", "int8"), ("h2o", "int8")]


def main():
    ckpt, out = sys.argv[1], Path(sys.argv[2])
    compile_ = "--compile" in sys.argv
    only = sys.argv[sys.argv.index("--compile") + 1].split(",") if compile_ else None
    graphs = torch._dynamo.utils.counters["stats"]
    tp = start(torch.device("cpu"))
    try:
        run(ckpt, out, tp, compile_, only, graphs)
    finally:  # a group left to the interpreter's exit can abort in gloo's thread teardown
        finish(tp)


def run(ckpt, out, tp, compile_, only, graphs):
    model = load_model(ckpt, tp=tp)
    g = torch.Generator().manual_seed(0)
    V = model.args.vocab_size
    prompt = torch.randint(0, V, (45,), generator=g).tolist()
    text = torch.randint(0, V, (90,), generator=g).tolist()
    results = {}
    for policy, middle in MATRIX:
        if only and (policy not in only or middle != "model"):
            continue
        kw = {} if policy == "full" else dict(cache_size=24, chunk=8, kv_middle=middle)
        factory = make_cache_factory(policy, **kw)
        gen = Generator(model, 128, make_cache=factory, compile=compile_)
        tokens = gen.generate(prompt, 24).new_ids[0]
        before = graphs["unique_graphs"]
        # the same generation again: every graph is reused
        again = gen.generate(prompt, 24).new_ids[0] if compile_ else tokens
        caches = build_caches(model, 1, 128, factory)
        nll = streaming_perplexity(model, caches, text).nll
        results[f"{policy}/{middle}"] = {"tokens": tokens, "again": again, "nll": nll,
                                         "new_graphs": graphs["unique_graphs"] - before}
    if tp is None or tp.rank == 0:
        results["_run"] = {"kv_heads_here": model.args.n_kv_heads,
                           "graphs": graphs["unique_graphs"]}
        out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
