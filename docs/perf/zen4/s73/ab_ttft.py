"""Probe (PERFORMANCE 6zv): time to first token of several policies' 4k prompts in turns, one
process, built as bench.py's first-token rows build them (compiled steps and prompt chunks,
budget 256, bulk prompt compression, chunks of 128), the order swapped every round.

    PYTHONPATH=. python docs/perf/zen4/s73/ab_ttft.py full,quantized DTYPE CONTEXT [ROUNDS] [profile]

PYWRAP=1 (at 6zv's trial code, where engine.generation.CHUNK_OPTIONS set cpp_wrapper for the
chunk graph): the chunk graph with Inductor's Python wrapper (COMPRESS_OPTIONS).
"""
import os
import statistics
import sys

import torch

from bench import context_ids
from caches import make_cache_factory
from engine.checkpoint import load_model
from engine.cli import DTYPES
from engine.default_model import resolve_checkpoint
from engine import generation as G
from engine.generation import Generator
from engine.tokenizer import load_tokenizer

policies, dtype, ctx = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
torch.set_num_threads(2)
if os.environ.get("PYWRAP"):  # 6zv's trial only
    G.CHUNK_OPTIONS = G.COMPRESS_OPTIONS
path = resolve_checkpoint(None)
model = load_model(path, dtype=DTYPES[dtype])
prompt = context_ids(load_tokenizer(path), ctx, None)
gens = {}
for p in policies:
    f = make_cache_factory("full") if p == "full" else make_cache_factory(
        p, cache_size=256, prompt_compression="bulk", chunk=128)
    g = Generator(model, ctx + 2, make_cache=f, compile=True, compile_prefill=True)
    g.warmup(0.0, None)
    g.generate(prompt if g.prefill_chunk is None else prompt[:48], 2, temperature=0.0)
    gens[p] = g
s = {p: [] for p in policies}
for r in range(rounds):
    for p in (policies if r % 2 == 0 else policies[::-1]):
        s[p].append(gens[p].generate(prompt, 1, temperature=0.0).prefill_s)
base = statistics.median(s[policies[0]])
for p in policies:
    m = statistics.median(s[p])
    print(f"{p:12s} {dtype} {ctx}: ttft {m:.3f} s ({m / base:.3f}x {policies[0]}); rounds "
          f"{[round(x, 3) for x in s[p]]}", flush=True)
if "profile" in sys.argv[5:]:  # then each prompt once more under torch.profiler, by op
    import torch._inductor.config as ic
    ic.cpp.enable_kernel_profile = True
    for p in policies:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t = gens[p].generate(prompt, 1, temperature=0.0).prefill_s
        print(f"{p}: {t:.2f} s profiled")
        events = prof.key_averages()
        for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:14]:
            print(f"{e.self_cpu_time_total / 1000:9.1f} ms {e.count:7d} calls  {e.key[:90]}")
