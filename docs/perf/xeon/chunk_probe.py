"""Probe (PERFORMANCE 6z): one layer's compiled prompt chunk step (`through_cache`: attention
over the cache and the bulk pass) and its bulk pass alone (`RegionCache.compress_bulk`), as a
bulk prompt of the default model's shapes reads them (3 KV heads of 9, head dim 64, budget 256,
chunks of 128), on random queries, keys and values:

    PYTHONPATH=. python docs/perf/xeon/chunk_probe.py POLICY [DTYPE]

Prints ms a call, the best of three runs of 60 (the chunk step, its random inputs made before
the clock starts) and of five runs of 100 (the pass, on the state after six chunks, put back
before each call and that copy's time taken off). PROF=1 adds the chunk step's events with the
most self time (KP=1: each generated kernel by name; SHAPES=1: by input shapes too).
"""
import os
import sys
import time

import torch
import torch._inductor.config as ic

from caches import make_cache_factory
from caches.region import RegionCache
from engine.generation import COMPRESS_OPTIONS
from model import rope_table, through_cache

torch.set_num_threads(2)
ic.cpp.enable_kernel_profile = bool(os.environ.get("KP"))
policy = sys.argv[1]
dtype = getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "bfloat16")
T, H, Hkv, D, LONGEST = 128, 9, 3, 64, 65536
cache = make_cache_factory(policy, cache_size=256, chunk=T, prompt_compression="bulk")(
    1, Hkv, D, LONGEST, dtype, rope_table(LONGEST, D, 1e5, None), layer_id=0)
g = torch.Generator().manual_seed(0)
step = torch.compile(through_cache, fullgraph=True, dynamic=False, options=COMPRESS_OPTIONS)
bulk = torch.compile(RegionCache.compress_bulk, fullgraph=True, dynamic=False,
                     options=COMPRESS_OPTIONS)


def chunk(i: int) -> tuple:
    shapes = ((1, H, T, D), (1, Hkv, T, D), (1, Hkv, T, D))
    return (torch.arange(i * T, (i + 1) * T).view(1, T),
            *(torch.randn(s, generator=g).to(dtype) for s in shapes))


def best_of(runs: int, n: int, f) -> float:
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t) / n)
    return best


for i in range(6):
    step(cache, *chunk(i))
held = {name: b.clone() for name, b in cache.named_buffers()}
cur = torch.full((1, 1, 1), 6 * T - 1)


def put_back():
    for name, b in cache.named_buffers():
        b.copy_(held[name])


def one_pass():
    put_back()
    bulk(cache, cur)


for _ in range(5):
    one_pass()
pass_ms = 1e3 * (best_of(5, 100, one_pass) - best_of(5, 100, put_back))
inputs = [chunk(6 + i) for i in range(180)]
it = iter(inputs)
step_ms = 1e3 * best_of(3, 60, lambda: step(cache, *next(it)))
print(f"{policy} {dtype}: chunk step {step_ms:.3f} ms, bulk pass {pass_ms:.3f} ms")
SHAPES = bool(os.environ.get("SHAPES"))
if os.environ.get("PROF"):
    more = [chunk(186 + i) for i in range(30)]
    with torch.profiler.profile(record_shapes=SHAPES) as prof:
        for x in more:
            step(cache, *x)
    events = prof.key_averages(group_by_input_shape=SHAPES)
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:20]:
        print(f"{e.self_cpu_time_total / 30e3:8.3f} ms {e.count // 30:4d}  {e.key[:100]}"
              + (f" {e.input_shapes}" if SHAPES else ""))
