"""Probe (PERFORMANCE 6zy): one policy's first token at a CONTEXT-token prompt, as bench.py's
first-token rows read it (budget 256, bulk prompt compression, chunks of 128, compiled steps
and prompt chunks), alone in its process.

    PYTHONPATH=. python docs/perf/xeon/s77/ttft_probe.py POLICY DTYPE CONTEXT [ROUNDS]

Reads the prompt once to compile, then ROUNDS (3) times more; prints each read's seconds and
their median. Alternating processes of two trees compare their code.
"""
import statistics
import sys
import time

import torch

from caches import make_cache_factory
from engine import generation as G
from engine.checkpoint import load_model
from engine.cli import DTYPES
from engine.default_model import resolve_checkpoint

policy, dtype, ctx = sys.argv[1], sys.argv[2], int(sys.argv[3])
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
torch.set_num_threads(2)
model = load_model(resolve_checkpoint(None), dtype=DTYPES[dtype])
f = make_cache_factory("full") if policy == "full" else make_cache_factory(
    policy, cache_size=256, prompt_compression="bulk", chunk=128)
s = G.Session(model, f, compile=True, compile_prefill=True, max_seq_length=ctx + 200)
prompt = list(range(100, 100 + ctx))
s.append(prompt)  # compiles the prompt's graphs
times = []
for _ in range(rounds):
    s.reset()
    t = time.perf_counter()
    s.append(prompt)
    times.append(time.perf_counter() - t)
print(f"{policy} {dtype} {ctx}: {statistics.median(times):.3f} s  "
      f"({', '.join(f'{x:.3f}' for x in times)})")
