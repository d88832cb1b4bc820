"""Probe (PERFORMANCE 6zc): resident memory after compiling a CPU step, with and without the
heap the compile freed given back (glibc's malloc_trim).

    PYTHONPATH=. python docs/perf/xeon/s53/trim_probe.py DTYPE POLICY [bake] [notrim]

bake: --bake_weights's step; notrim: without the engine's own malloc_trim after a baked compile
(engine.generation.release_freed_heap), as before 6zc.
Prints VmRSS (MiB) after loading, after the compile (a 1k-token prompt and 16 steps), after one
more malloc_trim(0) (its time), and after 64 more steps (their ms a step).
"""
import ctypes
import re
import sys
import time

import torch

from caches import make_cache_factory
from engine import generation as G
from engine.checkpoint import load_model
from engine.cli import DTYPES
from engine.default_model import resolve_checkpoint


def rss() -> float:
    return int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read())[1]) / 1024


if "notrim" in sys.argv:
    G.release_freed_heap = lambda: False
torch.set_num_threads(2)
model = load_model(resolve_checkpoint(None), dtype=DTYPES[sys.argv[1]])
print(f"loaded {rss():.0f}")
factory = make_cache_factory(sys.argv[2]) if sys.argv[2] == "full" else \
    make_cache_factory(sys.argv[2], cache_size=256)
s = G.Session(model, factory, compile=True, max_seq_length=1300, bake_weights="bake" in sys.argv)
s.append(list(range(100, 1124)))
s.generate(16)
print(f"compiled {rss():.0f}")
t = time.perf_counter()
ctypes.CDLL("libc.so.6").malloc_trim(0)
print(f"trimmed {rss():.0f} ({1000 * (time.perf_counter() - t):.1f} ms)")
g = s.generate(64)
print(f"after 64 more steps {rss():.0f}, {1000 * g.decode_s / (g.new_tokens - 1):.2f} ms a step")
