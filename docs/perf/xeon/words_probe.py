"""Probe (PERFORMANCE 6x): one layer's INT8 scores over 4,096 slots, compiled, with the words
in float32 tensors viewed as int32 in the loop (float), in int32 tensors (int32), or float
words with Inductor's vectors at 256 bits (simd256).

    PYTHONPATH=. python docs/perf/xeon/words_probe.py float|int32|simd256
"""
import sys, time, torch
import torch._inductor.config as ic
from quantize.kv import codes, quantize_words, split_words
torch.set_num_threads(2)
variant = sys.argv[1]
if variant == "simd256":
    ic.cpp.simdlen = 256
S, Hkv, G, D = 4096, 3, 3, 64
rows = quantize_words(torch.randn(1, Hkv, S, D))  # the bits; held as the variant says
rows = rows.view(torch.int32 if variant == "int32" else torch.float32)
q = torch.randn(1, Hkv, G, D)

def scores(q, rows):  # model.KVSegment.scores' reduction, on the engine's own unpacking
    w, s = split_words(rows)
    kw = codes(w)
    sc = (q.unflatten(-1, (4, -1)).unsqueeze(-3) * kw.unsqueeze(-4)).sum((-1, -2))
    return sc * s.transpose(-1, -2)
f = torch.compile(scores, dynamic=False)
ref = scores(q, rows)
out = f(q, rows)
print("max err", (out - ref).abs().max().item())
for _ in range(3): f(q, rows)
best = 1e9
for r in range(5):
    t = time.perf_counter()
    for _ in range(100): f(q, rows)
    best = min(best, (time.perf_counter() - t) / 100)
print(variant, "%.1f us per layer's scores over %d slots" % (best * 1e6, S))
