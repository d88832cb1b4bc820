"""Probe (PERFORMANCE 6zr): a step's 151 GEMVs through the engine's op (kernels.gemv) over the
default model's shapes in one mapping of 2 MiB pages, again and again for SECONDS, to run under
perf (each thread's share of the kernel and of OpenMP's waits) or in turns with a copy of the tree.

    PYTHONPATH=. python docs/perf/machine-f/s68/op_step_loop.py DTYPE SECONDS
"""
import time, torch, kernels, sys
from core.memory import empty_on_huge_pages
assert kernels.available()
torch.set_num_threads(2)
dtype = getattr(torch, sys.argv[1])
layer = [(960, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
shapes = layer * 30 + [(49152, 576)]
ws = empty_on_huge_pages([(s, dtype) for s in shapes])
for w in ws: w.normal_()
xs = {k: torch.randn(1, k).to(dtype) for k in (576, 1536)}
t = time.time(); n = 0
while time.time() - t < float(sys.argv[2]):
    t1 = time.perf_counter()
    for w in ws: kernels.gemv(xs[w.shape[1]], w)
    n += 1
print(n, "steps", (time.time() - t) / n * 1e3, "ms")
