import statistics, sys, time, torch
import kernels
from quantize.kv import quantize_words, split_words
kernels.available(); torch.set_num_threads(2)
H, M, D = 3, 3, 64
q = torch.randn(1, H, M, D).to(torch.bfloat16)
kw, vw = (quantize_words(torch.randn(1, H, 8, D)) for _ in range(2))
(kc, ks), (vc, vs) = split_words(kw), split_words(vw)
ks, vs = ks.view(torch.int32), vs.view(torch.int32)
kb, vb = (torch.randn(1, H, 8, D).to(torch.bfloat16) for _ in range(2))
mask = torch.ones(1, 1, 1, 8, dtype=torch.bool)
op = torch.ops.regionkv.attend.default
cases = {"int8": ([kc], [vc], [ks], [vs]), "bf16": ([kb], [vb], [None], [None])}
for r in range(3):
    for name, (k, v, a, b) in cases.items():
        n = 20000
        t = time.perf_counter()
        for _ in range(n):
            op(q, k, v, a, b, mask, 0.125, 2)
        print(name, (time.perf_counter() - t) / n * 1e6, "µs")
    t = time.perf_counter()
    for _ in range(n):
        torch.ops.regionkv.gemv.default(q[0, 0, :1].view(1, 64).repeat(1, 9), kb.view(-1, 64)[:576], 2) if False else None
