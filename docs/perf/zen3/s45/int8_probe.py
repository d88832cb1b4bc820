"""Probe (PERFORMANCE 6u): compiled reductions over INT8 codes, 30 independent layers.

    PYTHONPATH=. python docs/perf/zen3/s45/int8_probe.py SLOTS VARIANTS   # e.g. 4137 sc_base,sc_unpack

sc_*: scores q.k (bytes widened in the loop; a float32 copy and a matmul; int32 words unpacked
by shifts, model.unpacked); mx_*: the values' sum (bytes; words; words over chunks of 64 slots). Prints us a
layer. Inductor fuses the 30 layers' reductions into one loop (16 accumulators), which no
decode step has: the mx_* figures are not the step's. Not part of the engine.
Runs against the engine of commit 62d481d (s45): section 6v replaced the names it uses
(model.INT8_WORDS, model.unpacked, as_words) with words stored in the cache (quantize/kv.py).
"""
import statistics
import sys
import time

import torch

from model import as_words, unpacked

torch.set_num_threads(2)
S = int(sys.argv[1]); L, Hkv, G, D = 30, 3, 3, 64
g = torch.Generator().manual_seed(0)
qs = [torch.randn(1, Hkv, G, D, generator=g) for _ in range(L)]
ks = [torch.randint(-127, 128, (1, Hkv, S, D), generator=g, dtype=torch.int8) for _ in range(L)]
ps = [torch.rand(1, Hkv, G, S, generator=g) for _ in range(L)]
def sc_base(q, k): return (q.unsqueeze(-2) * k.unsqueeze(-3).float()).sum(-1)
def sc_wide(q, k): return q @ k.float().transpose(-1, -2)
def sc_unpack(q, k):
    return (as_words(q).unsqueeze(-3) * unpacked(k).unsqueeze(-4)).sum((-1, -2))
def mx_base(p, v): return (p.unsqueeze(-1) * v.unsqueeze(-3).float()).sum(-2)
def mx_unpack(p, v):
    y = (p[..., None, None] * unpacked(v).unsqueeze(-4)).sum(-3)  # [.., M, 4, 16]
    return y.transpose(-1, -2).reshape(*y.shape[:-2], 64)
def mx_unpack_c(p, v, n=64):
    B, H, M, S = p.shape; C = S // n; w = C * n
    u = unpacked(v)  # [B, H, S, 4, 16]
    y = 0
    if C:
        pc = p[..., :w].reshape(B, H, M, C, n).transpose(2, 3)  # [B, H, C, M, n]
        y = (pc[..., None, None] * u[:, :, :w].reshape(B, H, C, 1, n, 4, 16)).sum(-3).sum(2)
    if w < S:
        y = y + (p[..., w:, None, None] * u[:, :, w:].unsqueeze(-4)).sum(-3)
    return y.transpose(-1, -2).reshape(B, H, M, 64)
FN = dict(mx_unpack_c=lambda: [mx_unpack_c(p, k) for p, k in zip(ps, ks)], sc_base=lambda: [sc_base(q, k) for q, k in zip(qs, ks)],
          sc_wide=lambda: [sc_wide(q, k) for q, k in zip(qs, ks)],
          sc_unpack=lambda: [sc_unpack(q, k) for q, k in zip(qs, ks)],
          mx_base=lambda: [mx_base(p, k) for p, k in zip(ps, ks)],
          mx_unpack=lambda: [mx_unpack(p, k) for p, k in zip(ps, ks)])
vs_ = sys.argv[2].split(",")
steps = {v: torch.compile(FN[v], fullgraph=True, dynamic=False) for v in vs_}
outs = {v: steps[v]() for v in vs_}
for v in vs_:
    ref = outs["sc_base" if v.startswith("sc") else "mx_base"] if ("sc_base" in outs and v.startswith("sc")) or ("mx_base" in outs and v.startswith("mx")) else None
    if ref is not None: print(v, "max rel diff", max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(outs[v], ref)))
ts = {v: [] for v in vs_}
for _ in range(5):
    for v in vs_:
        t = time.perf_counter()
        for _ in range(10): steps[v]()
        ts[v].append((time.perf_counter() - t) / 10 / L * 1e6)
for v in vs_:
    print(f"S={S} {v:10s} {statistics.median(ts[v]):7.1f} us a layer  ", " ".join(f"{x:.0f}" for x in ts[v]))
