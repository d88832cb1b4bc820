"""Probe (PERFORMANCE 6zj): the GEMV kernel over one weight read again and again (in cache),
1 and 2 threads, bfloat16 and float32.

    PYTHONPATH=. python docs/perf/machine-d/s60/gemv_incache.py
"""
import time

import torch

import kernels

assert kernels.available()
for threads in (1, 2):
    torch.set_num_threads(threads)
    for dtype in (torch.bfloat16, torch.float32):
        for n, k in [(384, 576), (1536, 576)]:
            w, x = torch.randn(n, k).to(dtype), torch.randn(1, k).to(dtype)
            best = 1e9
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(300):
                    kernels.gemv(x, w)
                best = min(best, (time.perf_counter() - t) / 300)
            b = w.numel() * w.element_size()
            print(f"{threads}t {dtype} {n}x{k} ({b / 1024:.0f} KiB): {best * 1e6:7.1f} µs "
                  f"{b / best / 1e9:5.1f} GB/s")
