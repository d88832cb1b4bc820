"""Probe (PERFORMANCE 6zh): SDPA under a mask every head shares, folded (3 query heads a KV
head into the rows) against enable_gqa with the mask broadcast; eager and compiled, ms a call.
PYTHONPATH=. python docs/perf/xeon/s58/gqa_micro.py DTYPE"""
import time, torch, sys
import torch.nn.functional as F
torch.set_num_threads(2)
dt = getattr(torch, sys.argv[1])
B,Hkv,G,T,D,S = 1,3,3,128,64,4107
q = torch.randn(B,Hkv*G,T,D).to(dt); k = torch.randn(B,Hkv,S,D).to(dt); v = torch.randn(B,Hkv,S,D).to(dt)
pos = torch.randint(-1, 4000, (B,1,S)); ipos = torch.arange(2000, 2000+T).view(B,1,T,1)
def fold(q, k, v, pos, ipos):
    mask = (pos.unsqueeze(-2) <= ipos) & (pos.unsqueeze(-2) >= 0)
    m = mask.unsqueeze(2).expand(-1, -1, G, -1, -1).flatten(2, 3)
    return F.scaled_dot_product_attention(q.reshape(B,Hkv,G*T,D), k, v, attn_mask=m).view(B,Hkv*G,T,D)
def gqa(q, k, v, pos, ipos):
    mask = (pos.unsqueeze(-2) <= ipos) & (pos.unsqueeze(-2) >= 0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
def gqa_add(q, k, v, pos, ipos):
    mask = (pos.unsqueeze(-2) <= ipos) & (pos.unsqueeze(-2) >= 0)
    m = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
ref = fold(q,k,v,pos,ipos)
for name, f in [("fold", fold), ("gqa", gqa), ("gqa_add", gqa_add)]:
    for comp in (False, True):
        g = torch.compile(f) if comp else f
        out = g(q,k,v,pos,ipos)
        print(name, comp, "maxdiff", (out.float()-ref.float()).abs().max().item())
        for _ in range(3): g(q,k,v,pos,ipos)
        t = time.perf_counter()
        for _ in range(30): g(q,k,v,pos,ipos)
        print(name, comp, (time.perf_counter()-t)/30*1e3, "ms")
        with torch.profiler.profile() as p: g(q,k,v,pos,ipos)
        print("   ", [e.key[:60] for e in sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)[:4]])
