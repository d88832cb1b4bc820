"""Probe (PERFORMANCE 6zo): the engine's GEMV op (kernels.gemv, called from Python as a
compiled step's wrapper calls it) over the default model's shapes in 2 MiB pages, as
gemv_ceiling.cpp reads them from C++: the head alone, the 30 layers, a whole step; best of 9.

    PYTHONPATH=. python docs/perf/machine-d/s65/gemv_op.py [DTYPE [ROWS]]   # ROWS of x: 1, 2
"""
import sys
import time

import torch

import kernels
from core.memory import empty_on_huge_pages

assert kernels.available()
torch.set_num_threads(2)
dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
g = torch.Generator().manual_seed(0)
layer = [(960, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 1
xs = {k: torch.randn(rows, k, generator=g).to(dtype) for k in (576, 1536)}
for name, shapes in {"head": [(49152, 576)], "layers": layer * 30,
                     "step": layer * 30 + [(49152, 576)]}.items():
    plain = [torch.randn(n, k, generator=g).to(dtype) for n, k in shapes]
    ws = [h.copy_(w) for h, w in
          zip(empty_on_huge_pages([(w.shape, w.dtype) for w in plain]), plain)]
    nbytes = sum(w.numel() * w.element_size() for w in ws)
    best = float("inf")
    for _ in range(9):
        t = time.perf_counter()
        for w in ws:
            kernels.gemv(xs[w.shape[1]], w)
        best = min(best, time.perf_counter() - t)
    print(f"{str(dtype)[6:]:8s} x{rows} {name:6s} {nbytes // 1000000:4d} MB, {len(ws)} calls: "
          f"{best * 1e3:7.3f} ms {nbytes / best / 1e9:5.1f} GB/s (best of 9)")
