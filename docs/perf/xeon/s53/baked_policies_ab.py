"""Probe (PERFORMANCE 6zc): policies' baked steps interleaved in one process, so that their
ratio sees the machine in the same state (bench.py's rows run one after another).

    PYTHONPATH=. python docs/perf/xeon/s53/baked_policies_ab.py CONTEXT POLICIES [inline]

One session per policy (budget 256, bulk prompt compression; `full` uncompressed), bfloat16,
--bake_weights; 6 rounds of 24 steps each, policies in turn; prints each one's median ms a
step and its ratio to the first policy's. inline: every block's cache step traced inline (the
baked step before 6zc).
"""
import statistics
import sys

import torch

from caches import make_cache_factory
from engine import generation as G
from engine.checkpoint import load_model
from engine.cli import DTYPES
from engine.default_model import resolve_checkpoint

context, policies = int(sys.argv[1]), sys.argv[2].split(",")
if "inline" in sys.argv[3:]:
    G.run_inline_step.__defaults__ = (G.run_block,)
torch.set_num_threads(2)
model = load_model(resolve_checkpoint(None), dtype=DTYPES["bfloat16"])
rounds, steps = 6, 24
sessions = {}
for p in policies:
    factory = make_cache_factory("full") if p == "full" else \
        make_cache_factory(p, cache_size=256, prompt_compression="bulk")
    s = G.Session(model, factory, compile=True, bake_weights=True,
                  max_seq_length=context + (rounds + 1) * steps + 64)
    s.append(list(range(100, 100 + context)))
    s.generate(4)  # compiles
    sessions[p] = s
ms = {p: [] for p in policies}
for _ in range(rounds):
    for p, s in sessions.items():
        g = s.generate(steps)
        ms[p].append(1000 * g.decode_s / (g.new_tokens - 1))
base = statistics.median(ms[policies[0]])
for p, m in ms.items():
    print(f"{p:12s} {statistics.median(m):6.2f} ms  {statistics.median(m) / base:5.3f}x   "
          + " ".join(f"{x:.1f}" for x in m))
