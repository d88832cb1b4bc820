"""Probe (section 6u): the compiled CPU step's attention reductions against their shapes
before, interleaved on one session (scripts/decode_ab.py's rounds: 6 of 24 steps, medians).

    PYTHONPATH=. python docs/perf/zen3/s45/attn_ab.py POLICY DTYPE CONTEXT bytes

graph: the engine's step (INT8 codes read as int32 words where model.int8_words says); bytes:
the step traced without them (codes widened byte by byte), as before 6u. In attn-ab.txt's
`full` rows the engine also summed float values over chunks of 64 slots (`graph`) against one
sum (`bytes`): a variant measured, then dropped. A compressing POLICY has budget 256 and reads
its prompt in bulk; POLICY+int8 has an INT8 middle (--kv_middle int8).
Runs against the engine of commit 62d481d (s45): section 6v replaced the names it uses
(model.INT8_WORDS, model.unpacked, as_words) with words stored in the cache (quantize/kv.py).
"""
import sys

import torch

sys.path.insert(0, "scripts")
import decode_ab as A  # noqa: E402
import model as M  # noqa: E402
from caches import make_cache_factory  # noqa: E402
from engine import generation as G  # noqa: E402
from engine.checkpoint import load_model  # noqa: E402
from engine.cli import DTYPES  # noqa: E402
from engine.default_model import resolve_checkpoint  # noqa: E402

torch.set_num_threads(2)
policy, dtype, ctx = sys.argv[1], sys.argv[2], int(sys.argv[3])
variants = sys.argv[4].split(",") if len(sys.argv) > 4 else ["bytes"]
model = load_model(resolve_checkpoint(None), dtype=DTYPES[dtype])
name = policy.removesuffix("+int8")
f = make_cache_factory("full") if name == "full" else \
    make_cache_factory(name, cache_size=256, prompt_compression="bulk",
                       kv_middle="int8" if policy.endswith("+int8") else "model")
s = G.Session(model, f, compile=True, max_seq_length=ctx + 1200)
s.append(list(range(100, 100 + ctx)))
graph = model.step_graph
own = {v: A.own_step_graph() for v in variants}
words = M.INT8_WORDS


def use(v):  # read when a graph is traced
    M.INT8_WORDS = words and v != "bytes"
    model.step_graph = own.get(v, graph)


print(policy, dtype, ctx)
A.interleave(s, ["graph"] + variants, use, 6, 24)
