"""A/B of two builds of kernels/decode.cpp: PYTHONPATH=. python scores_ab.py BUILD.so, AVX2
(kernel 1) scores8 over INT8 and scores over bfloat16, one layer's shapes (3 heads, 3 rows, 64),
30 stretches in turn, medians of 15 (PERFORMANCE.md, section 6zj)."""
import sys, time, torch
import kernels  # the schemas
torch.ops.load_library(sys.argv[1])
from quantize.kv import quantize_words, split_words
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
out = []
for S in (1024, 4096):
    ws = [split_words(quantize_words(torch.randn(1, 3, S, 64, generator=g))) for _ in range(30)]
    kf = [torch.randn(1, 3, S, 64, generator=g).bfloat16() for _ in range(30)]
    q = torch.randn(1, 3, 3, 64, generator=g)
    ts, tb = [], []
    for _ in range(15):
        t = time.perf_counter()
        for w, s in ws: torch.ops.regionkv.scores8(q, w, s, 1)
        ts.append((time.perf_counter() - t) / 30 * 1e6)
        t = time.perf_counter()
        for k in kf: torch.ops.regionkv.scores(q.bfloat16(), k, 1)
        tb.append((time.perf_counter() - t) / 30 * 1e6)
    out.append(f"S={S} scores8 {sorted(ts)[7]:6.1f} bf16 {sorted(tb)[7]:6.1f}")
print(sys.argv[1][-7:], " | ".join(out))
