"""Probe (PERFORMANCE 6zo): what a call costs from Python on this machine, in µs (best of 5
passes of 20,000 calls): the GEMV op on a weight of 8 rows (nearly all of it the call), an eager
torch.empty and x.add(1), and the two calls a compiled step's Python wrapper makes for its
buffers and views (Inductor's empty_strided_cpu, whose buffer is freed at once here, and
reinterpret_tensor).

    PYTHONPATH=. python docs/perf/machine-d/s65/call_costs.py
"""
import time

import torch
from torch._C._dynamo.guards import _empty_strided_cpu, _reinterpret_tensor

import kernels

assert kernels.available()
torch.set_num_threads(2)


def us(fn, n: int = 20000) -> float:
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6


x, w = torch.randn(1, 576).bfloat16(), torch.randn(8, 576).bfloat16()
gemv = torch.ops.regionkv.gemv.default
buf = _empty_strided_cpu((1, 3, 1, 64), (192, 64, 64, 1), torch.float32)
for name, fn in [("regionkv::gemv, 8 x 576 bfloat16", lambda: gemv(x, w, kernels.KERNEL)),
                 ("torch.empty(1, 8)", lambda: torch.empty(1, 8)),
                 ("x.add(1)", lambda: x.add(1)),
                 ("empty_strided_cpu((1, 3, 1), ...), freed", lambda: _empty_strided_cpu(
                     (1, 3, 1), (3, 1, 3), torch.int32)),
                 ("reinterpret_tensor", lambda: _reinterpret_tensor(buf, (1, 3, 1, 32),
                                                                    (192, 64, 64, 1), 32)),
                 ("a Python call of nothing", lambda: None)]:
    print(f"{name:44s} {us(fn):6.2f} µs")
