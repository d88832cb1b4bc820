# KeyDiff's score alone, compiled, on a stack of B layers' caches at a budget of 256 (3 KV
# heads, 289 slots, head dim 64; the middle from slot 160), random keys:
#   v0 the score before section 6t (every key's norm each step, dots over every slot)
#   v1 v0 with dots over the middle only       v6 1/|k| given, dots over every slot
#   v3 1/|k| given, dots over the middle (the engine's token step since 6t)
#   v5 |k| given (inverted in the step), dots over the middle
#   v4 v1 with the weights as 1 / sqrt of a sum of squares (another rounding: not equal)
# PYTHONPATH=. python docs/perf/zen3/s44/score_probe.py B DTYPE v0,v1,v3,v5,v6   [OPTS='{...}' Inductor options]
# Prints the median ms of a call (200 calls, 7 rounds) and whether its scores equal v0's.
import json, os, sys, time
import torch
torch.set_num_threads(2)
from caches.region import coarse
B, H, C, D, NF = int(sys.argv[1]), 3, 289, 64, 160
OPTS = json.loads(os.environ.get("OPTS", "{}"))
dt = getattr(torch, sys.argv[2])
def v0(k, pos, inv0):
    keys = k.float()
    inv = 1 / keys.norm(dim=-1).clamp(min=1e-12)
    valid = pos >= 0
    anchor = (keys * torch.where(valid, inv, 0.0).unsqueeze(-1)).sum(2, keepdim=True) / valid.sum(-1)[..., None, None].clamp(min=1)
    return -coarse((keys * anchor).sum(-1) * inv / anchor.norm(dim=-1).clamp(min=1e-12))[..., NF:]
def v1(k, pos, inv0):  # dots over the middle only
    keys = k.float()
    inv = 1 / keys.norm(dim=-1).clamp(min=1e-12)
    valid = pos >= 0
    anchor = (keys * torch.where(valid, inv, 0.0).unsqueeze(-1)).sum(2, keepdim=True) / valid.sum(-1)[..., None, None].clamp(min=1)
    m = keys[..., NF:, :]
    return -coarse((m * anchor).sum(-1) * inv[..., NF:] / anchor.norm(dim=-1).clamp(min=1e-12))
def v3(k, pos, inv):  # norms given (a stat)
    keys = k.float()
    valid = pos >= 0
    anchor = (keys * torch.where(valid, inv, 0.0).unsqueeze(-1)).sum(2, keepdim=True) / valid.sum(-1)[..., None, None].clamp(min=1)
    m = keys[..., NF:, :]
    return -coarse((m * anchor).sum(-1) * inv[..., NF:] / anchor.norm(dim=-1).clamp(min=1e-12))
def v4(k, pos, inv0):  # weights materialized by a reduction kernel that also counts
    keys = k.float()
    sq = (keys * keys).sum(-1)
    valid = pos >= 0
    w = torch.where(valid, 1 / sq.sqrt().clamp(min=1e-12), 0.0)
    anchor = (keys * w.unsqueeze(-1)).sum(2, keepdim=True) / valid.sum(-1)[..., None, None].clamp(min=1)
    m = keys[..., NF:, :]
    return -coarse((m * anchor).sum(-1) * w[..., NF:] / anchor.norm(dim=-1).clamp(min=1e-12))
def v6(k, pos, inv):  # inv given, dots over every slot
    keys = k.float()
    valid = pos >= 0
    anchor = (keys * torch.where(valid, inv, 0.0).unsqueeze(-1)).sum(2, keepdim=True) / valid.sum(-1)[..., None, None].clamp(min=1)
    return -coarse((keys * anchor).sum(-1) * inv / anchor.norm(dim=-1).clamp(min=1e-12))[..., NF:]
def v5(k, pos, nrm):  # norms given (a stat), inverted here
    keys = k.float()
    valid = pos >= 0
    inv = 1 / nrm.clamp(min=1e-12)
    anchor = (keys * torch.where(valid, inv, 0.0).unsqueeze(-1)).sum(2, keepdim=True) / valid.sum(-1)[..., None, None].clamp(min=1)
    m = keys[..., NF:, :]
    return -coarse((m * anchor).sum(-1) * inv[..., NF:] / anchor.norm(dim=-1).clamp(min=1e-12))
k = torch.randn(B, H, C, D).to(dt); pos = torch.randint(-1, 4000, (B, H, C), dtype=torch.int32)
inv = 1 / k.float().norm(dim=-1).clamp(min=1e-12)
nrm = k.float().norm(dim=-1)
ref = torch.compile(v0, dynamic=False)(k, pos, inv)
for name in sys.argv[3].split(","):
    f = globals()[name]
    g = torch.compile(f, dynamic=False, options=OPTS)
    with torch.inference_mode():
        a3 = nrm if name == 'v5' else inv
        out = g(k, pos, a3)
        for _ in range(20): g(k, pos, a3)
        ts = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(200): g(k, pos, a3)
            ts.append((time.perf_counter() - t) / 200)
    print(name, B, f"{sorted(ts)[3]*1e3:.3f} ms", "equal" if torch.equal(out, ref) else f"maxdiff {(out-ref).abs().max().item()}", flush=True)
