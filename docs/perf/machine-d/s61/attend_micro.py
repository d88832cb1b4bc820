"""Probe (PERFORMANCE 6zk): kernels.attend against scores, ATen's masked softmax and mix.

    PYTHONPATH=. python docs/perf/machine-d/s61/attend_micro.py SLOTS

One layer's decode shapes of the default model (3 KV heads, 3 query rows each, head size 64)
over SLOTS cached slots, the last 10 masked, bfloat16 then float32, 2 threads: µs a call,
medians of nothing (three rounds of 200 calls each, printed).
"""
import sys
import time

import torch

import kernels

torch.set_num_threads(2)
assert kernels.available()
S = int(sys.argv[1]) if len(sys.argv) > 1 else 4105
for dt in (torch.bfloat16, torch.float32):
    q, k, v = (torch.randn(1, 3, n, 64).to(dt) for n in (3, S, S))
    mask = torch.ones(1, 1, 1, S, dtype=torch.bool)
    mask[..., -10:] = False

    def fused():
        return kernels.attend(q, k, v, mask, 0.125)

    def split():
        s = kernels.scores(q, k) * 0.125
        return kernels.mix(torch.softmax(s.masked_fill(~mask, float("-inf")), -1), v)
    for f in (fused, split):
        f()
    for _ in range(3):
        us = []
        for f in (fused, split):
            t = time.perf_counter()
            for _ in range(200):
                f()
            us.append((time.perf_counter() - t) / 200 * 1e6)
        print(f"{dt} {S} slots: attend {us[0]:.1f} us, scores + softmax + mix {us[1]:.1f} us")
