"""Probe (PERFORMANCE 6x): one [49152, 576] matrix-vector product (the tied head's shape) from
DRAM: 20 weights read in turn, so that none is in the cache, as the compiled step's reduction,
oneDNN's packed inner product, F.linear, and W.sum() for the bandwidth; float32 and bfloat16.

    python docs/perf/xeon/gemv_dram_probe.py
"""
import time, torch
import torch.nn.functional as F
torch.set_num_threads(2)
N, K, COPIES = 49152, 576, 20   # 20 weights: 1.1 GB float32, 566 MB bfloat16, read in turn
def bench(fn, args):
    for a in args[:3]: fn(*a)
    best = 1e9
    for _ in range(4):
        t = time.perf_counter()
        for a in args: fn(*a)
        best = min(best, (time.perf_counter() - t) / len(args))
    return best
for dt in (torch.float32, torch.bfloat16):
    Ws = [torch.randn(N, K).to(dt) for _ in range(COPIES)]; x = torch.randn(1, K).to(dt)
    nbytes = Ws[0].numel() * Ws[0].element_size()
    red = torch.compile(lambda W, x: (W.float() * x.float().unsqueeze(-2)).sum(-1).to(x.dtype))
    packs = [torch.ops.mkldnn._reorder_linear_weight(W, None) for W in Ws]
    pk = lambda x, p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
    summ = lambda W: W.sum()
    for name, fn, args in [("reduction", red, [(W, x) for W in Ws]),
                           ("onednn packed", pk, [(x, p) for p in packs]),
                           ("F.linear", F.linear, [(x, W) for W in Ws]),
                           ("W.sum()", summ, [(W,) for W in Ws])]:
        t = bench(fn, args)
        print(f"{dt} {name:14s} {t*1e3:6.2f} ms  {nbytes/t/1e9:5.1f} GB/s")
    del Ws, packs
