"""Probe (PERFORMANCE 6zza): one-shot first tokens (--prompt_compression snapkv, budget 256,
compiled steps and prompts, a session sized as bench.py sizes it: the context + 8) of several
policies and `full`, taking turns in one process, so that each ratio to `full`'s is read in the
same stretch of the machine.

    PYTHONPATH=. python docs/perf/xeon/s80/oneshot_turns.py DTYPE CONTEXT POLICY,... [ROUNDS]

Prints each policy's median seconds (of ROUNDS, 5) and its ratio to `full`'s median.
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

dtype, ctx, policies = sys.argv[1], int(sys.argv[2]), ["full"] + sys.argv[3].split(",")
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 5
torch.set_num_threads(2)
model = load_model(resolve_checkpoint(None), dtype=DTYPES[dtype])
prompt = list(range(100, 100 + ctx))
sessions = {}
for p in policies:
    f = make_cache_factory("full") if p == "full" else make_cache_factory(
        p, cache_size=256, prompt_compression="snapkv", chunk=128)
    sessions[p] = G.Session(model, f, compile=True, compile_prefill=True,
                            max_seq_length=ctx + 8)
    sessions[p].append(prompt)  # compiles the prompt's graph
times = {p: [] for p in policies}
for _ in range(rounds):
    for p, s in sessions.items():
        s.reset()
        t = time.perf_counter()
        s.append(prompt)
        times[p].append(time.perf_counter() - t)
full = statistics.median(times["full"])
for p in policies:
    m = statistics.median(times[p])
    print(f"{p} {dtype} {ctx}: {m:.3f} s ({m / full:.2f}x)  "
          f"({', '.join(f'{x:.3f}' for x in times[p])})")
