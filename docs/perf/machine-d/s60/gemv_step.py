"""Probe (PERFORMANCE 6zj): the GEMV kernel on machine D, the default model's 30 layers' weights
read in step order (wqkv, wo, w1, w3, w2; then the tied head), as a decode step reads them, the
whole sequence timed; a call's fixed cost (a weight of 8 rows); and x.sum()'s bandwidth.

    PYTHONPATH=. python docs/perf/machine-d/s60/gemv_step.py [bfloat16|float32] [THREADS]
"""
import sys
import time

import torch

LAYER = [(960, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]


def step_gemvs(gemv, dtype: torch.dtype) -> tuple[float, int]:
    """Best of 7 passes over a step's 151 GEMVs through gemv(x, w): (seconds, bytes read)."""
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(n, k, generator=g).to(dtype) for _ in range(30) for n, k in LAYER]
    ws.append(torch.randn(49152, 576, generator=g).to(dtype))  # the head
    xs = {k: torch.randn(1, k, generator=g).to(dtype) for k in (576, 1536)}
    best = float("inf")
    for _ in range(7):
        t = time.perf_counter()
        for w in ws:
            gemv(xs[w.shape[1]], w)
        best = min(best, time.perf_counter() - t)
    return best, sum(w.numel() * w.element_size() for w in ws)


def sum_bandwidth() -> float:
    """x.sum() over 1 GiB, best of 10: GB/s."""
    x = torch.ones(2**30 // 4)
    best = float("inf")
    for _ in range(10):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best / 1e9


if __name__ == "__main__":
    import kernels
    dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
    torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
    assert kernels.available()
    s, nbytes = step_gemvs(kernels.gemv, dtype)
    print(f"{dtype} {torch.get_num_threads()} threads: a step's 151 GEMVs, "
          f"{nbytes / 1e6:.0f} MB: {s * 1e3:.2f} ms, {nbytes / s / 1e9:.1f} GB/s")
    x, tiny = torch.randn(1, 576).to(dtype), torch.randn(8, 576).to(dtype)
    best = float("inf")
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(1000):
            kernels.gemv(x, tiny)
        best = min(best, (time.perf_counter() - t) / 1000)
    print(f"a call's fixed cost (8 x 576): {best * 1e6:.1f} µs")
    print(f"x.sum() over 1 GiB: {sum_bandwidth():.1f} GB/s")
