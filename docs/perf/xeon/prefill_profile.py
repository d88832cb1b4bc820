"""Probe (PERFORMANCE 6y): where a 4k prompt's first token goes, as bench.py reads it with
--compile on --compile_prefill (budget 256, bulk prompt compression, chunks of CHUNK):

    PYTHONPATH=. python docs/perf/xeon/prefill_profile.py POLICY DTYPE CONTEXT [CHUNK]

Two untimed reads warm it, then one read under the profiler prints the events with the most
self time. Environment: KP=1 names each generated kernel (Inductor's kernel profile), TOP=N
rows, PIECE=N sets engine.generation.PREFILL_PIECE (the rows a layer's linears read at once),
COMPRESSION=chunked the default prompt path instead of bulk.
"""
import os
import sys

import torch
import torch._inductor.config as ic

import engine.generation as G
from caches import make_cache_factory
from engine.checkpoint import load_model
from engine.cli import DTYPES
from engine.default_model import resolve_checkpoint

torch.set_num_threads(2)
ic.cpp.enable_kernel_profile = bool(os.environ.get("KP"))
if os.environ.get("PIECE"):
    G.PREFILL_PIECE = int(os.environ["PIECE"])
policy, dtype, ctx = sys.argv[1], sys.argv[2], int(sys.argv[3])
chunk = int(sys.argv[4]) if len(sys.argv) > 4 else 128
model = load_model(resolve_checkpoint(None), dtype=DTYPES[dtype])
factory = make_cache_factory("full") if policy == "full" else make_cache_factory(
    policy, cache_size=256, chunk=chunk,
    prompt_compression=os.environ.get("COMPRESSION", "bulk"))
gen = G.Generator(model, ctx + 10, make_cache=factory, compile=True, compile_prefill=True)
gen.warmup(0.0, None)
prompt = [100 + (i * 7919) % 40000 for i in range(ctx)]  # token ids: their text does not matter
gen.generate(prompt if gen.prefill_chunk is None else prompt[:48], 3, temperature=0.0)
for _ in range(2):
    print("first token", round(gen.generate(prompt, 2, temperature=0.0).prefill_s, 3), "s")
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    g = gen.generate(prompt, 2, temperature=0.0)
print("under the profiler", round(g.prefill_s, 3), "s")
for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[
        :int(os.environ.get("TOP", 25))]:
    print(f"{e.self_cpu_time_total / 1e3:9.1f} ms {e.count:6d}  {e.key[:110]}")
