"""Probe: the GEMV kernel (kernels/decode.cpp) against oneDNN's inner product, per linear shape of
the default model, each weight read from DRAM (enough copies read in turn to pass the caches).

    PYTHONPATH=. python docs/perf/xeon/s54/gemv_shapes.py [float32|bfloat16] [ROWS]
"""
import sys
import time

import torch

import kernels as gemv

SHAPES = [(960, 576), (576, 576), (1536, 576), (3072, 576), (576, 1536), (49152, 576)]


def timed(fn, ws, x) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for w in ws:
            fn(x, w)
        best = min(best, (time.perf_counter() - t) / len(ws))
    return best


def main(dtype: torch.dtype, rows: int) -> None:
    torch.set_num_threads(2)
    assert gemv.available()
    kernels = sorted({gemv.AVX2, gemv.KERNEL})
    print(f"{dtype}, {rows} row(s); µs a call and GB/s of weight read")
    for n, k in SHAPES:
        nbytes = n * k * dtype.itemsize
        ws = [torch.randn(n, k).to(dtype) for _ in range(max(2, int(600e6 / nbytes)))]
        x = torch.randn(rows, k).to(dtype)
        line = f"[{n:5d}, {k:4d}]"
        for kern in kernels:
            dt = timed(lambda x, w: gemv.gemv(x, w, kern), ws, x)
            line += f"  kernel {kern}: {dt * 1e6:7.1f} µs {nbytes / dt / 1e9:5.1f} GB/s"
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in ws]
        dt = timed(lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""),
                   packed, x)
        print(line + f"  oneDNN: {dt * 1e6:7.1f} µs {nbytes / dt / 1e9:5.1f} GB/s", flush=True)


if __name__ == "__main__":
    main(getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16"),
         int(sys.argv[2]) if len(sys.argv) > 2 else 1)
