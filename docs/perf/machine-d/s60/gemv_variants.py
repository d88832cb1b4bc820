"""Probe (PERFORMANCE 6zj): kernels/decode.cpp built with other GEMV rows a pass and prefetch
distances (in /tmp/s60v/NAME), a step's GEMVs timed as gemv_step.py does, bfloat16 unless
DTYPE; one build a process.

    PYTHONPATH=. python docs/perf/machine-d/s60/gemv_variants.py NAME ROWS AHEAD_BYTES [DTYPE]
"""
import os
import shutil
import sys

import torch
from torch.utils.cpp_extension import load

import kernels  # noqa: F401  (the ops' schemas)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemv_step import step_gemvs, sum_bandwidth  # noqa: E402


def build(name: str, src: str, root: str = "/tmp/s60v") -> None:
    """Build kernels/decode.cpp's text `src` in root/NAME and load its ops (regionkv::...)."""
    d = f"{root}/{name}"
    os.makedirs(d, exist_ok=True)
    open(f"{d}/decode.cpp", "w").write(src)
    shutil.copy("kernels/attention.h", d)
    load(f"rkv_{name}", [f"{d}/decode.cpp"],
         extra_cflags=["-O3", "-fopenmp", "-DREGIONKV_HEADER=0"], extra_ldflags=["-fopenmp"],
         is_python_module=False, build_directory=d, verbose=False)


if __name__ == "__main__":
    name, rows, ahead = sys.argv[1], sys.argv[2], sys.argv[3]
    dtype = getattr(torch, sys.argv[4]) if len(sys.argv) > 4 else torch.bfloat16
    src = open("kernels/decode.cpp").read()
    src = src.replace("constexpr int64_t kRows = 4;", f"constexpr int64_t kRows = {rows};")
    src = src.replace("constexpr int64_t kAheadBytes = 8192;",
                      f"constexpr int64_t kAheadBytes = {ahead};")
    build(name, src)
    torch.set_num_threads(2)
    s, nbytes = step_gemvs(lambda x, w: torch.ops.regionkv.gemv(x, w, 1), dtype)
    bw = sum_bandwidth()
    print(f"{name:10s} rows {rows} ahead {ahead:5s} {dtype}: {s * 1e3:6.2f} ms "
          f"{nbytes / s / 1e9:5.1f} GB/s; sum {bw:5.1f} GB/s; ratio {nbytes / s / 1e9 / bw:.2f}")
