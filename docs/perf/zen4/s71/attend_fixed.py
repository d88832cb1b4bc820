"""Probe (PERFORMANCE 6zu): what one attend call costs whatever its length (its op called as a
compiled graph's wrapper calls it, `torch.ops.regionkv.attend.default`, over 8 slots of an
INT8 or a bfloat16 stretch), beside a GEMV's call (8 rows), and an INT8 4k view (`quantized`'s:
a 160-slot bfloat16 stretch and a 4,181-slot INT8 one) on 1 and 2 threads: the call's fixed cost
and how its work splits. 3 KV heads of 3 query rows, head size 64; µs a call, medians.

    PYTHONPATH=. python docs/perf/zen4/s71/attend_fixed.py
"""
import statistics, time
import torch
import kernels
from quantize.kv import quantize_words, split_words

assert kernels.available()
H, M, D = 3, 3, 64
torch.manual_seed(0)
q = torch.randn(1, H, M, D).to(torch.bfloat16)
op = torch.ops.regionkv.attend.default


def int8(S):
    (kc, ks), (vc, vs) = (split_words(quantize_words(torch.randn(1, H, S, D))) for _ in range(2))
    return [kc], [vc], [ks.view(torch.int32)], [vs.view(torch.int32)]


def bf16(S):
    return ([torch.randn(1, H, S, D).to(torch.bfloat16)], [torch.randn(1, H, S, D).to(torch.bfloat16)],
            [None], [None])


def timed(f, n):
    xs = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(n):
            f()
        xs.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(xs)


x, w = torch.randn(1, D * 9).to(torch.bfloat16), torch.randn(8, D * 9).to(torch.bfloat16)
fast, mid = bf16(160), int8(4181)
view = [a + b for a, b in zip(fast, mid)]
for threads in (1, 2):
    torch.set_num_threads(threads)
    row = {}
    for name, (k, v, ks, vs) in (("int8 x 8", int8(8)), ("bf16 x 8", bf16(8))):
        mask = torch.ones(1, 1, 1, 8, dtype=torch.bool)
        row[name] = timed(lambda: op(q, k, v, ks, vs, mask, 0.125, kernels.KERNEL), 5000)
    row["gemv 8 rows"] = timed(lambda: torch.ops.regionkv.gemv.default(x, w, kernels.KERNEL), 5000)
    mask = torch.ones(1, 1, 1, 4341, dtype=torch.bool)
    row["quantized 4k view"] = timed(lambda: op(q, *view, mask, 0.125, kernels.KERNEL), 200)
    print(f"threads {threads}: " + ", ".join(f"{k} {v:.1f} µs" for k, v in row.items()), flush=True)
