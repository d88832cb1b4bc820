"""Probe (PERFORMANCE 6zj): the GEMV kernel per linear shape of the default model, enough
copies read in turn to pass the caches, bfloat16; "minus 7 µs" takes a call's fixed cost out.

    PYTHONPATH=. python docs/perf/machine-d/s60/gemv_shapes_dram.py [THREADS]
"""
import sys
import time

import torch

import kernels

assert kernels.available()
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
g = torch.Generator().manual_seed(0)
for n, k, copies in [(960, 576, 40), (576, 576, 60), (1536, 576, 30), (576, 1536, 30),
                     (49152, 576, 2)]:
    ws = [torch.randn(n, k, generator=g).to(torch.bfloat16) for _ in range(copies)]
    x = torch.randn(1, k, generator=g).to(torch.bfloat16)
    best = 1e9
    for _ in range(7):
        t = time.perf_counter()
        for w in ws:
            kernels.gemv(x, w)
        best = min(best, (time.perf_counter() - t) / copies)
    b = n * k * 2
    print(f"{n}x{k}: {best * 1e6:8.1f} µs {b / best / 1e9:5.1f} GB/s "
          f"(minus 7 µs: {b / (best - 7e-6) / 1e9:5.1f})")
