"""A/B of builds of kernels/decode.cpp (PERFORMANCE.md, section 6zj): AVX2 (kernel 1) scores
and mix over float32, bfloat16 and INT8 stretches of one layer's shapes (3 heads, 3 query
rows, head size 64), 30 stretches read in turn, µs a call, medians of 15.

    PYTHONPATH=. python docs/perf/machine-d/s60/attend_ab.py BUILD.so [SLOTS]
"""
import sys
import time

import torch

import kernels  # noqa: F401  (the ops' schemas)
from quantize.kv import quantize_words, split_words

torch.ops.load_library(sys.argv[1])
S = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
ops = torch.ops.regionkv
q = torch.randn(1, 3, 3, 64, generator=g)
p = torch.softmax(torch.randn(1, 3, 3, S, generator=g), -1)
kv = {dt: [torch.randn(1, 3, S, 64, generator=g).to(dt) for _ in range(30)]
      for dt in (torch.float32, torch.bfloat16)}
words = [split_words(quantize_words(torch.randn(1, 3, S, 64, generator=g))) for _ in range(30)]
calls = {
    "scores f32": lambda i: ops.scores(q, kv[torch.float32][i], 1),
    "scores bf16": lambda i: ops.scores(q.bfloat16(), kv[torch.bfloat16][i], 1),
    "scores8": lambda i: ops.scores8(q, *words[i], 1),
    "mix f32": lambda i: ops.mix(p, kv[torch.float32][i], 1),
    "mix bf16": lambda i: ops.mix(p, kv[torch.bfloat16][i], 1),
    "mix8": lambda i: ops.mix8(p, *words[i], 1),
}
times = {name: [] for name in calls}
for _ in range(15):
    for name, f in calls.items():
        t = time.perf_counter()
        for i in range(30):
            f(i)
        times[name].append((time.perf_counter() - t) / 30 * 1e6)
print(f"{sys.argv[1].split('/')[-1]:12s} S={S}", "  ".join(
    f"{name} {sorted(ts)[7]:6.1f}" for name, ts in times.items()))
