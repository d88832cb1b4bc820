"""Probe (PERFORMANCE 6zm): the GEMV kernel over one decode step's weights of the default model
(30 layers of wqkv, wo, w1, w3, w2, then the tied head), read in turn as a step reads them, from
two copies in turns: in torch's pages (4 KiB: each weight is under the 2 MiB that
THP_MEM_ALLOC_ENABLE=1 would ask for) and in the huge pages that load_model moves them to
(core.memory.empty_on_huge_pages). Then bench.py's streaming probe over both kinds of pages.

    PYTHONPATH=. python docs/perf/machine-d/s63/gemv_pages.py [DTYPE] [ROUNDS]
"""
import statistics
import sys
import time

import torch

import kernels
from core.memory import empty_on_huge_pages

assert kernels.available()
torch.set_num_threads(2)
dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 15
g = torch.Generator().manual_seed(0)
shapes = [(960, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)] * 30 + [(49152, 576)]
small = [torch.randn(n, k, generator=g).to(dtype) for n, k in shapes]
huge = [h.copy_(w) for h, w in zip(empty_on_huge_pages([(w.shape, w.dtype) for w in small]), small)]
xs = {k: torch.randn(1, k, generator=g).to(dtype) for k in (576, 1536)}
nbytes = sum(w.numel() * w.element_size() for w in small)


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def step(ws):
    for w in ws:
        kernels.gemv(xs[w.shape[1]], w)


ms = {"4 KiB": [], "2 MiB": []}
for _ in range(rounds):
    ms["4 KiB"].append(timed(lambda: step(small)))
    ms["2 MiB"].append(timed(lambda: step(huge)))
print(f"{dtype}, {nbytes / 1e6:.0f} MB of weights, median of {rounds} rounds:")
for k, v in ms.items():
    med = statistics.median(v)
    print(f"  GEMVs, {k} pages: {med * 1e3:6.2f} ms, {nbytes / med / 1e9:5.1f} GB/s")
n = 64 << 20  # 256 MiB of float32: bench.py's probe
probes = {"4 KiB": torch.ones(n), "2 MiB": empty_on_huge_pages([((n,), torch.float32)])[0].fill_(1)}
best = {k: min(timed(x.sum) for _ in range(10)) for k, x in probes.items()}
for k, b in best.items():
    print(f"  streaming probe, {k} pages: {4 * n / b / 1e9:5.1f} GB/s")
