"""Probe (PERFORMANCE 6zg): CaM's bulk pass alone, compiled, at a 4k prompt's shapes (3 KV
heads, 386 slots, 128 victims):

    python docs/perf/xeon/s57/cam_micro.py DTYPE [p]      # p: a profile by kernel too
"""
import sys, time, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from caches.cam import CaMCache
from model import rope_table
torch.set_num_threads(2)
import torch._inductor.config as ic0
ic0.cpp.enable_kernel_profile = len(sys.argv) > 2
dt = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
rope = rope_table(4096, 64, 10000.0, None)
c = CaMCache(1, 3, 64, 4096, dt, rope, sink=4, window=253, middle=0, chunk=128,
             prompt_compression="bulk")
B, H, C = c.pos.shape
print("C", C)
g = torch.Generator().manual_seed(0)
# contiguous positions as in a prompt: sinks 0..3, the ring 1000..1380
c.pos[..., :4] = torch.arange(4).int()
c.pos[..., 4:] = (1000 + torch.randperm(C - 4, generator=g)).int()
c.acc.copy_(torch.rand(B, H, C, generator=g)); c.v.copy_(torch.randn(c.v.shape, generator=g))
victims = torch.argsort(torch.where(c.pos >= 1000, c.pos, 10**6))[..., :128]
do = torch.ones(B, H, 128, dtype=torch.bool)
fn = torch.compile(c.remove_bulk)
state = [x.clone() for x in (c.pos, c.acc, c.v)]
def once():
    for x, s in zip((c.pos, c.acc, c.v), state): x.copy_(s)
    fn(victims, do, torch.full((B, 1, 1), 1400))
for _ in range(3): once()
t = time.perf_counter(); n = 200
for _ in range(n): once()
print(f"{(time.perf_counter() - t) / n * 1e3:.3f} ms a pass")
import torch._inductor.config as ic
if len(sys.argv) > 2:
    with torch.profiler.profile() as prof:
        for _ in range(50): once()
    for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:14]:
        print(f"{e.self_cpu_time_total / 50e3:8.3f} ms {e.count // 50:4d}  {e.key[:110]}")
