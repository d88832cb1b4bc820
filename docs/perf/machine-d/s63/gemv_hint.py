"""Probe (PERFORMANCE 6zm): kernels/decode.cpp built with another prefetch hint (and distance)
for the AVX2 GEMV's weights (in /tmp/s63v/NAME), a step's GEMVs over weights in huge pages,
median of 21 passes; one build a process, so alternate the processes.

    PYTHONPATH=. python docs/perf/machine-d/s63/gemv_hint.py NAME HINT [DTYPE [AHEAD_BYTES]]
    # HINT: T0, T1, NTA
"""
import os
import statistics
import sys
import time

import torch

import kernels  # noqa: F401  (the ops' schemas)
from core.memory import empty_on_huge_pages

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "s60"))
from gemv_variants import build  # noqa: E402

name, hint = sys.argv[1], sys.argv[2]
dtype = getattr(torch, sys.argv[3]) if len(sys.argv) > 3 else torch.bfloat16
ahead = sys.argv[4] if len(sys.argv) > 4 else "8192"
src = open("kernels/decode.cpp").read()
old = "_mm_prefetch(static_cast<const char*>(p) + kAheadBytes, _MM_HINT_NTA);"
assert old in src
src = src.replace(old, old.replace("_MM_HINT_NTA", f"_MM_HINT_{hint}"))
src = src.replace("kAheadBytes = 8192;", f"kAheadBytes = {ahead};")
build(name, src, "/tmp/s63v")
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
shapes = [(960, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)] * 30 + [(49152, 576)]
ws = [torch.randn(n, k, generator=g).to(dtype) for n, k in shapes]
ws = [h.copy_(w) for h, w in zip(empty_on_huge_pages([(w.shape, w.dtype) for w in ws]), ws)]
xs = {k: torch.randn(1, k, generator=g).to(dtype) for k in (576, 1536)}
times = []
for _ in range(21):
    t = time.perf_counter()
    for w in ws:
        torch.ops.regionkv.gemv(xs[w.shape[1]], w, 1)
    times.append(time.perf_counter() - t)
nbytes = sum(w.numel() * w.element_size() for w in ws)
med = statistics.median(times)
print(f"{name:6s} hint {hint:4s} ahead {ahead:5s} {dtype}: median {med * 1e3:6.2f} ms, "
      f"{nbytes / med / 1e9:5.1f} GB/s")
