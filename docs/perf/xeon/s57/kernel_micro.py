"""Probe (PERFORMANCE 6zg): the attention kernels alone at a 4k stretch (3 KV heads, 3 query
rows a head), microseconds a call, from the tree it runs in:

    PYTHONPATH=. python docs/perf/xeon/s57/kernel_micro.py
"""
import sys, time, torch
torch.set_num_threads(2)
import kernels
from quantize.kv import quantize_words, split_words
assert kernels.available()
g = torch.Generator().manual_seed(0)
rows = quantize_words(torch.randn(1, 3, 4096, 64, generator=g))
words, scale = split_words(rows)
q = torch.randn(1, 3, 3, 64, generator=g)
k = torch.randn(1, 3, 4096, 64, generator=g)
def t(f, n=2000):
    for _ in range(50): f()
    s = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - s) / n * 1e6
qb, kb = q.bfloat16(), k.bfloat16()
p = torch.softmax(q @ k.transpose(-1, -2), -1)
print(f"scores8 {t(lambda: kernels.scores8(q, words, scale)):.1f} us  "
      f"scores bf16 {t(lambda: kernels.scores(qb, kb)):.1f} us  "
      f"scores f32 {t(lambda: kernels.scores(q, k)):.1f} us  mix8 "
      f"{t(lambda: kernels.mix8(p, words, scale)):.1f} us")
