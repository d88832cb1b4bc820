"""Probe (PERFORMANCE 6zc): one layer's compiled decode attention (3 KV heads x 3 query rows,
head dim 64, bfloat16 keys and values over S slots) as the engine's step computes it, against
its scores through regionkv::exact_matmul (oneDNN, float32 out) and against the slots as the
outer loop (scores [B, S, Hkv, G]):

    PYTHONPATH=. python docs/perf/xeon/s53/decode_attention_variants.py S
"""
import sys
import time

import torch

import quantize.dense  # noqa: F401  (registers regionkv::exact_matmul)

torch.set_num_threads(2)
S = int(sys.argv[1])
g = torch.Generator().manual_seed(0)
q = torch.randn(1, 3, 3, 64, generator=g).bfloat16()
k = torch.randn(1, 3, S, 64, generator=g).bfloat16()
v = torch.randn(1, 3, S, 64, generator=g).bfloat16()


def attention(q, k, v):  # as model.KVSegment.scores / mix for few rows (REDUCE_ROWS)
    s = (q.float().unsqueeze(-2) * k.unsqueeze(-3).float()).sum(-1) / 8
    p = torch.softmax(s, -1)
    return (p.unsqueeze(-1) * v.unsqueeze(-3).float()).sum(-2)


def scores(q, k, v):
    return (q.float().unsqueeze(-2) * k.unsqueeze(-3).float()).sum(-1)


def scores_mm(q, k, v):
    return torch.ops.regionkv.exact_matmul(q, k.transpose(-1, -2))


def attention_mm(q, k, v):
    p = torch.softmax(torch.ops.regionkv.exact_matmul(q, k.transpose(-1, -2)) / 8, -1)
    return (p.unsqueeze(-1) * v.unsqueeze(-3).float()).sum(-2)


def scores_slots_outer(q, k, v):  # [B, S, Hkv, G]
    return (k.transpose(1, 2).unsqueeze(3).float() * q.unsqueeze(1).float()).sum(-1)


def attention_slots_outer(q, k, v):
    p = torch.softmax(scores_slots_outer(q, k, v) / 8, 1)
    return (p.unsqueeze(-1) * v.transpose(1, 2).unsqueeze(3).float()).sum(1)


def attention_slots_outer_back(q, k, v):  # scores slots-outer, the rest in the engine's layout
    p = torch.softmax(scores_slots_outer(q, k, v).permute(0, 2, 3, 1) / 8, -1)
    return (p.unsqueeze(-1) * v.unsqueeze(-3).float()).sum(-2)


ref = attention(q.double(), k.double(), v.double())
for name, f, nbytes in (("attention", attention, 2), ("scores", scores, 1),
                        ("scores, exact_matmul", scores_mm, 1),
                        ("attention, exact_matmul", attention_mm, 2),
                        ("scores, slots outer", scores_slots_outer, 1),
                        ("attention, slots outer", attention_slots_outer, 2),
                        ("attention, slots outer, back", attention_slots_outer_back, 2)):
    c = torch.compile(f, fullgraph=True, dynamic=False)
    for _ in range(20):
        out = c(q, k, v)
    err = ((out.double() - ref).abs().max() / ref.abs().max()).item() \
        if out.shape == ref.shape else float("nan")
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(200):
            c(q, k, v)
        best = min(best, (time.perf_counter() - t) / 200)
    print(f"S={S} {name:30s} {best * 1e6:7.1f} us  {nbytes * k.numel() * 2 / best / 1e9:5.1f} GB/s"
          f"  rel. err {err:.1e}")
