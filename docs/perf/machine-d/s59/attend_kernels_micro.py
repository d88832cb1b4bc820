"""Probe (PERFORMANCE 6zi): the decode attention kernels (kernels/decode.cpp: scores, mix) on one
layer's shapes of the default model, q [1, 3, 3, 64] against a [1, 3, S, 64] stretch, each call
on a stretch of its own (30 layers' worth read in turn, as a step reads them), µs a call.

    PYTHONPATH=. python docs/perf/machine-d/s59/attend_kernels_micro.py [DTYPE] [KERNEL]
"""
import sys
import time

import torch

import kernels

torch.set_num_threads(2)
assert kernels.available()
dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
kern = int(sys.argv[2]) if len(sys.argv) > 2 else kernels.KERNEL


def timed(fn, args) -> float:
    best = float("inf")
    for _ in range(7):
        t = time.perf_counter()
        for a in args:
            fn(*a)
        best = min(best, (time.perf_counter() - t) / len(args))
    return best


for S in (256, 1024, 4096):
    ks = [torch.randn(1, 3, S, 64).to(dtype) for _ in range(30)]
    q = torch.randn(1, 3, 3, 64).to(dtype)
    p = torch.softmax(torch.randn(1, 3, 3, S), -1)
    ts = timed(lambda k: kernels.scores(q, k, kern), [(k,) for k in ks])
    tm = timed(lambda v: kernels.mix(p, v, kern), [(v,) for v in ks])
    mb = ks[0].numel() * ks[0].element_size() / 1e6
    print(f"{dtype} kernel {kern} S={S:5d}: scores {ts * 1e6:7.1f} µs ({mb / ts / 1e3:5.1f} GB/s)"
          f"  mix {tm * 1e6:7.1f} µs ({mb / tm / 1e3:5.1f} GB/s)", flush=True)
