"""Probe (PERFORMANCE 6zj): the GEMV kernel on machine D, the default model's 30 layers' weights
read in step order (wqkv, wo, w1, w3, w2; then the tied head), as a decode step reads them, each
call timed alone and the whole sequence; and a call's fixed cost (a weight of 8 rows).

    PYTHONPATH=. python docs/perf/machine-d/s60/gemv_step.py [bfloat16|float32] [THREADS]
"""
import sys
import time

import torch

import kernels

dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
assert kernels.available()
g = torch.Generator().manual_seed(0)
LAYER = [(960, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
ws = [torch.randn(n, k, generator=g).to(dtype) for _ in range(30) for n, k in LAYER]
head = torch.randn(49152, 576, generator=g).to(dtype)
xs = {k: torch.randn(1, k, generator=g).to(dtype) for k in (576, 1536)}
nbytes = sum(w.numel() * w.element_size() for w in ws) + head.numel() * head.element_size()
best = float("inf")
for _ in range(7):
    t = time.perf_counter()
    for w in ws:
        kernels.gemv(xs[w.shape[1]], w)
    kernels.gemv(xs[576], head)
    best = min(best, time.perf_counter() - t)
print(f"{dtype} {torch.get_num_threads()} threads: a step's {len(ws) + 1} GEMVs, "
      f"{nbytes / 1e6:.0f} MB: {best * 1e3:.2f} ms, {nbytes / best / 1e9:.1f} GB/s")
tiny = torch.randn(8, 576, generator=g).to(dtype)
best = float("inf")
for _ in range(7):
    t = time.perf_counter()
    for _ in range(1000):
        kernels.gemv(xs[576], tiny)
    best = min(best, (time.perf_counter() - t) / 1000)
print(f"a call's fixed cost (8 x 576): {best * 1e6:.1f} µs")
x = torch.empty(2**30 // 4)
x.fill_(1.0)
best = float("inf")
for _ in range(10):
    t = time.perf_counter()
    x.sum()
    best = min(best, time.perf_counter() - t)
print(f"x.sum() over 1 GiB: {x.numel() * 4 / best / 1e9:.1f} GB/s")
