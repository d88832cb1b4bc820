"""Probe (PERFORMANCE 6z): one layer's compiled decode attention as the step's reductions read
it (3 KV heads, 3 query rows each, head dim 64, bfloat16 keys and values over S slots), its
scores and its mix alone, and SDPA on the same shapes; then the variants 6z measured: one
reduction a query row (`rows`), and the keys laid out along the slots (`keys along slots`);
and those 6zc measured: the scores through regionkv::exact_matmul (oneDNN, float32 out), and
the slots as the outer loop (scores [B, S, Hkv, G]):

    python docs/perf/xeon/decode_attention_probe.py [S]

Prints µs a call (the best of five runs of 200) and the bytes of K and V read per second.
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import quantize.dense  # noqa: E402, F401  (registers regionkv::exact_matmul)

torch.set_num_threads(2)
S = int(sys.argv[1]) if len(sys.argv) > 1 else 4120
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


def mix(q, k, v):
    p = torch.full((1, 3, 3, S), 1.0 / S)
    return (p.unsqueeze(-1) * v.unsqueeze(-3).float()).sum(-2)


def sdpa(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def scores_rows(q, k, v):  # one reduction a query row: Inductor reads each key once for all
    return torch.stack([(row.float().unsqueeze(-2) * k.float()).sum(-1) for row in q.unbind(-2)],
                       dim=-2)


def attention_rows(q, k, v):
    p = torch.softmax(scores_rows(q, k, v) / 8, -1)
    return torch.stack([(row.unsqueeze(-1) * v.float()).sum(-2) for row in p.unbind(-2)], dim=-2)


kt = k.transpose(-1, -2).contiguous()  # [1, 3, 64, S]


def scores_along_slots(q, k, v):
    return (q.float().unsqueeze(-1) * kt.unsqueeze(-3).float()).sum(-2)


def scores_rows_along_slots(q, k, v):
    return torch.stack([(row.float().unsqueeze(-1) * kt.float()).sum(-2) for row in q.unbind(-2)],
                       dim=-2)


def scores_exact_matmul(q, k, v):
    return torch.ops.regionkv.exact_matmul(q, k.transpose(-1, -2))


def attention_exact_matmul(q, k, v):
    p = torch.softmax(scores_exact_matmul(q, k, v) / 8, -1)
    return (p.unsqueeze(-1) * v.unsqueeze(-3).float()).sum(-2)


def scores_slots_outer(q, k, v):  # [B, S, Hkv, G]
    return (k.transpose(1, 2).unsqueeze(3).float() * q.unsqueeze(1).float()).sum(-1)


def attention_slots_outer(q, k, v):
    p = torch.softmax(scores_slots_outer(q, k, v) / 8, 1)
    return (p.unsqueeze(-1) * v.transpose(1, 2).unsqueeze(3).float()).sum(1)


def attention_slots_outer_back(q, k, v):  # scores slots-outer, the rest in the step's layout
    p = torch.softmax(scores_slots_outer(q, k, v).permute(0, 2, 3, 1) / 8, -1)
    return (p.unsqueeze(-1) * v.unsqueeze(-3).float()).sum(-2)


for name, f, nbytes in (("attention", attention, 2), ("scores", scores, 1), ("mix", mix, 1),
                        ("sdpa", sdpa, 2), ("attention, rows", attention_rows, 2),
                        ("scores, rows", scores_rows, 1),
                        ("scores, keys along slots", scores_along_slots, 1),
                        ("scores, rows, keys along slots", scores_rows_along_slots, 1),
                        ("scores, exact_matmul", scores_exact_matmul, 1),
                        ("attention, exact_matmul", attention_exact_matmul, 2),
                        ("scores, slots outer", scores_slots_outer, 1),
                        ("attention, slots outer", attention_slots_outer, 2),
                        ("attention, slots outer, back", attention_slots_outer_back, 2)):
    c = torch.compile(f, fullgraph=True, dynamic=False)
    for _ in range(20):
        c(q, k, v)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(200):
            c(q, k, v)
        best = min(best, (time.perf_counter() - t) / 200)
    print(f"{name:30s} {best * 1e6:7.1f} µs  {nbytes * k.numel() * 2 / best / 1e9:5.1f} GB/s")
