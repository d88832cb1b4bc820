"""Probe (PERFORMANCE 6zh): one prompt chunk's attention (3 KV heads, 3 query heads each, 128
tokens) over 256 float slots and 3,851 INT8 ones, against as many float slots, compiled; ms a
call. PYTHONPATH=. python docs/perf/xeon/s58/attend_micro.py DTYPE [p: profile]"""
import time, torch, sys
import model
from model import KVSegment, KVView, attend
from quantize.kv import quantize_words, split_words
torch.set_num_threads(2)
dt = getattr(torch, sys.argv[1])
B,Hkv,G,T,D,F,M = 1,3,3,128,64,256,3851
q = torch.randn(B,Hkv*G,T,D).to(dt)
kf, vf = torch.randn(B,Hkv,F,D).to(dt), torch.randn(B,Hkv,F,D).to(dt)
kw, ks = split_words(quantize_words(torch.randn(B,Hkv,M,D)))
vw, vs = split_words(quantize_words(torch.randn(B,Hkv,M,D)))
pos = torch.randint(0, 4000, (B,1,F+M))
ipos = torch.arange(2000, 2000+T).view(B,1,T,1)
def quant(q, kf, vf, kw, ks, vw, vs, pos, ipos):
    mask = (pos.unsqueeze(-2) <= ipos) & (pos.unsqueeze(-2) >= 0)
    return attend(KVView(q, [KVSegment(kf, vf), KVSegment(kw, vw, ks, vs)], mask))[0]
kd, vd = torch.randn(B,Hkv,F+M,D).to(dt), torch.randn(B,Hkv,F+M,D).to(dt)
def full(q, kd, vd, pos, ipos):
    mask = (pos.unsqueeze(-2) <= ipos) & (pos.unsqueeze(-2) >= 0)
    return attend(KVView(q, [KVSegment(kd, vd)], mask))[0]
for name, f, args in [("quant", quant, (q, kf, vf, kw, ks, vw, vs, pos, ipos)), ("full", full, (q, kd, vd, pos, ipos))]:
    g = torch.compile(f)
    for _ in range(3): g(*args)
    t = time.perf_counter()
    for _ in range(50): g(*args)
    print(name, (time.perf_counter()-t)/50*1e3, "ms")
    if len(sys.argv) > 2:
        with torch.profiler.profile() as p:
            for _ in range(10): g(*args)
        for e in sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)[:6]:
            print(f"   {e.self_cpu_time_total/1e3/10:8.3f} ms {e.key[:100]}")
