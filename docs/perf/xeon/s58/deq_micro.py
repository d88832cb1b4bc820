"""Probe (PERFORMANCE 6zh): widening one 4k middle's INT8 K (3 heads x 3,851 slots x 64) to
DTYPE, compiled, four ways; us a call. PYTHONPATH=. python docs/perf/xeon/s58/deq_micro.py DTYPE"""
import time, torch, sys
from quantize.kv import codes, quantize_words, split_words
torch.set_num_threads(2)
dt = getattr(torch, sys.argv[1])
B,H,S,D = 1,3,3851,64
x = torch.randn(B,H,S,D)
rows = quantize_words(x)
words, scale = split_words(rows)
def shifts(w, s): return (codes(w).flatten(-2) * s).to(dt)
def bytes_(w, s):
    b = w.view(torch.int8).unflatten(-1, (-1, 4)).transpose(-1, -2).flatten(-2)
    return (b.float() * s).to(dt)
def cat4(w, s):
    w = w.view(torch.int32)
    b = torch.cat([(w << 24) >> 24, (w << 16) >> 24, (w << 8) >> 24, w >> 24], dim=-1)
    return (b.float() * s).to(dt)
def cat4f(w, s):
    w = w.view(torch.int32)
    return torch.cat([(((w << c) >> 24).float() * s).to(dt) for c in (24, 16, 8)] + [((w >> 24).float() * s).to(dt)], dim=-1)
ref = shifts(words, scale)
for name, f in [("shifts", shifts), ("bytes", bytes_), ("cat4", cat4), ("cat4f", cat4f)]:
    g = torch.compile(f)
    out = g(words, scale)
    print(name, "equal", torch.equal(out, ref))
    for _ in range(3): g(words, scale)
    t = time.perf_counter()
    for _ in range(200): g(words, scale)
    print(name, (time.perf_counter()-t)/200*1e6, "us")
