"""Probe (PERFORMANCE 6zk): where a compressing policy's compiled prompt spends its time.

    PYTHONPATH=. python docs/perf/machine-d/s61/prefill_profile.py POLICY DTYPE CONTEXT \
        [nowiden8] [shapes]

One session as bench.py's first-token rows make it (budget 256, bulk prompt compression,
prompt chunks of 128, compiled steps and prompt chunks) reads a CONTEXT-token prompt once to
compile, then again under torch.profiler (Inductor's kernels as events of their own): prints
the prompt's seconds and the events with the most self time, in ms for the whole prompt.
nowiden8: INT8 stretches widened by Inductor's loop (quantize.kv.widen), not kernels.widen8.
shapes: the events by op and input shapes, 40 of them (6zl).
"""
import sys
import time

import torch
import torch._inductor.config as ic

from caches import make_cache_factory
from engine import generation as G
from engine.checkpoint import load_model
from engine.cli import DTYPES
from engine.default_model import resolve_checkpoint

ic.cpp.enable_kernel_profile = True
shapes = "shapes" in sys.argv[4:]
if "nowiden8" in sys.argv[4:]:
    import kernels
    kernels.serve_widen = lambda words: False
policy, dtype, ctx = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.set_num_threads(2)
model = load_model(resolve_checkpoint(None), dtype=DTYPES[dtype])
f = make_cache_factory("full") if policy == "full" else make_cache_factory(
    policy, cache_size=256, prompt_compression="bulk", chunk=128)
s = G.Session(model, f, compile=True, compile_prefill=True, max_seq_length=ctx + 200)
prompt = list(range(100, 100 + ctx))
s.append(prompt)  # compiles the prompt's graphs
s.reset()
cpu = torch.profiler.ProfilerActivity.CPU
with torch.profiler.profile(activities=[cpu], record_shapes=shapes) as prof:
    t = time.perf_counter()
    s.append(prompt)
    print(f"prompt {time.perf_counter() - t:.2f} s (profiled)")
events = prof.key_averages(group_by_input_shape=shapes)
for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:40 if shapes else 16]:
    where = f"{e.key[:60]} {str(e.input_shapes)[:200]}" if shapes else e.key[:100]
    print(f"{e.self_cpu_time_total / 1000:9.1f} ms {e.count:7d} calls  {where}")
