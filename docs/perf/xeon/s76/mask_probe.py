# Probe (PERFORMANCE 6zx): a region mask (0 <= pos <= now) in forms Inductor compiles differently, in a
# prompt chunk's masked softmax ([2, 3, 384, 385], the stack height dynamic), ms a call:
#     python mask_probe.py   (acting as AVX2: ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
#     TORCHINDUCTOR_CPP_MARCH=x86-64-v3 TORCHINDUCTOR_CACHE_DIR=<its own>)
import time, torch
torch.set_num_threads(2)
def make(variant):
    def f(s, pos, ip):
        B, H, C = pos.shape
        T = ip.shape[1]
        now = ip.view(B, 1, T, 1)
        p4 = pos.unsqueeze(-2)
        if variant == "i64":
            m = (p4 >= 0) & (p4 <= now)
        elif variant == "i32":
            m = (p4 >= 0) & (p4 <= now.to(torch.int32))
        elif variant == "i32not":
            n32 = now.to(torch.int32)
            m = ~((p4 < 0) | (p4 > n32))
        elif variant == "i32where":
            n32 = now.to(torch.int32)
            m = torch.where(p4 >= 0, p4 <= n32, False)
        elif variant == "i32u":  # one unsigned-style compare: pos in [0, now] iff (pos <= now) & (pos >= 0)
            n32 = now.to(torch.int32)
            m = (p4.to(torch.float32) <= n32.to(torch.float32)) & (p4 >= 0)
        elif variant == "i32min":
            n32 = now.to(torch.int32)
            m = torch.minimum(p4, n32 - p4) >= 0
        G = s.shape[2] // T
        m = m.unsqueeze(2).expand(-1, -1, G, -1, -1).flatten(2, 3)
        p = torch.softmax((s / 8.0).masked_fill(~m, float("-inf")), dim=-1)
        return p, p.to(torch.bfloat16)
    return torch.compile(f, fullgraph=True)
B = 2
s = torch.randn(B, 3, 384, 385); pos = torch.randint(-1, 4000, (B, 3, 385), dtype=torch.int32)
ip = torch.arange(3000, 3128).expand(B, 128).contiguous()
for t in (s, pos, ip): torch._dynamo.mark_dynamic(t, 0)
vs = ("i64", "i32", "i32not", "i32where", "i32u", "i32min")
fs = {v: make(v) for v in vs}
ref = fs["i64"](s, pos, ip)[0]
for v, f in fs.items(): print(v, torch.allclose(f(s, pos, ip)[0], ref, equal_nan=True))
for r in range(3):
    for v, f in fs.items():
        t = time.perf_counter()
        for _ in range(300): f(s, pos, ip)
        print(v, f"{(time.perf_counter()-t)/300*1e3:.3f}", end="  ")
    print()
