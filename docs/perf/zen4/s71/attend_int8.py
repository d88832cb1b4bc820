"""Probe (PERFORMANCE 6zu): the attend op over `quantized`'s 4k view (a 160-slot bfloat16 fast
stretch and a 4,181-slot INT8 middle) against `full`'s (4,096 bfloat16 slots), each from
memory (a step's 30 layers, each its own buffers) and from cache (one layer's buffers 30
times): whether a call is bound by its reads or by its work. 3 KV heads of 3 query rows,
head size 64; the median of ROUNDS steps, in µs a call.

    PYTHONPATH=. python docs/perf/zen4/s71/attend_int8.py [ROUNDS]
"""
import statistics, sys, time
import torch
import kernels
from quantize.kv import quantize_words, split_words

assert kernels.available()
torch.set_num_threads(2)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
L, H, M, D = 30, 3, 3, 64
torch.manual_seed(0)
q = torch.randn(1, H, M, D).to(torch.bfloat16)


def layer(kind):
    if kind == "full":
        return [(torch.randn(1, H, 4096, D).to(torch.bfloat16),
                 torch.randn(1, H, 4096, D).to(torch.bfloat16), None, None)]
    fast = [torch.randn(1, H, 160, D).to(torch.bfloat16) for _ in range(2)]
    kw, vw = (quantize_words(torch.randn(1, H, 4181, D)) for _ in range(2))
    (kc, ks), (vc, vs) = split_words(kw), split_words(vw)
    return [(fast[0], fast[1], None, None), (kc, vc, ks, vs)]


for kind in ("full", "quantized"):
    layers = [layer(kind) for _ in range(L)]
    S = sum(s[0].shape[2] for s in layers[0])
    mask = torch.ones(1, 1, 1, S, dtype=torch.bool)
    mb = sum(2 * H * s[0].shape[2] * (D * 2 if s[2] is None else D + 4) for s in layers[0]) / 1e6
    for where, ls in (("memory", layers), ("cache", [layers[0]] * L)):
        ts = []
        for _ in range(rounds):
            t = time.perf_counter()
            for st in ls:
                kernels.attend_over(q, st, mask, 0.125)
            ts.append((time.perf_counter() - t) * 1e6 / L)
        m = statistics.median(ts)
        print(f"{kind:9s} from {where:6s} {m:7.1f} µs a call ({mb:.3f} MB, {mb * 1e3 / m:.1f} "
              f"GB/s)", flush=True)
