"""Probe (PERFORMANCE 6zj): kernels/decode.cpp built with other GEMV rows a pass and prefetch
distances, a step's GEMVs timed as gemv_step.py does (bfloat16 unless DTYPE), one build a
process, in /tmp/s60v/NAME.

    PYTHONPATH=. python docs/perf/machine-d/s60/gemv_variants.py NAME ROWS AHEAD_BYTES [DTYPE]
"""
import sys, time, os, re, torch
from torch.utils.cpp_extension import load
import kernels  # schemas only
name, rows, ahead = sys.argv[1], sys.argv[2], sys.argv[3]
dtype = getattr(torch, sys.argv[4]) if len(sys.argv) > 4 else torch.bfloat16
src = open("kernels/decode.cpp").read()
src = src.replace("constexpr int64_t kRows = 4;", f"constexpr int64_t kRows = {rows};")
src = src.replace("constexpr int64_t kAheadBytes = 8192;", f"constexpr int64_t kAheadBytes = {ahead};")
d = f"/tmp/s60v/{name}"  # noqa: E501
os.makedirs(d, exist_ok=True)
open(f"{d}/decode.cpp", "w").write(src)
import shutil; shutil.copy("kernels/attention.h", d)
load(f"rkv_{name}", [f"{d}/decode.cpp"], extra_cflags=["-O3", "-fopenmp", "-DREGIONKV_HEADER=0"],
     extra_ldflags=["-fopenmp"], is_python_module=False, build_directory=d, verbose=False)
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
LAYER = [(960, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
ws = [torch.randn(n, k, generator=g).to(dtype) for _ in range(30) for n, k in LAYER]
head = torch.randn(49152, 576, generator=g).to(dtype)
xs = {k: torch.randn(1, k, generator=g).to(dtype) for k in (576, 1536)}
nbytes = sum(w.numel() * w.element_size() for w in ws) + head.numel() * head.element_size()
gemv = torch.ops.regionkv.gemv
best = float("inf")
for _ in range(9):
    t = time.perf_counter()
    for w in ws:
        gemv(xs[w.shape[1]], w, 1)
    gemv(xs[576], head, 1)
    best = min(best, time.perf_counter() - t)
x = torch.ones(2**28)
sb = min((lambda t: (x.sum(), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(8))
print(f"{name:10s} rows {rows} ahead {ahead:5s} {dtype}: {best*1e3:6.2f} ms {nbytes/best/1e9:5.1f} GB/s; sum {x.numel()*4/sb/1e9:5.1f} GB/s; ratio {nbytes/best/(x.numel()*4/sb):.2f}")
