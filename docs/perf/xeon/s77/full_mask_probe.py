"""Probe (PERFORMANCE 6zy): `full`'s mask for a prompt chunk that does not start at 0 (a
session's later turn), as caches/full.py builds it, against one comparison.

    PYTHONPATH=. python docs/perf/xeon/s77/full_mask_probe.py DTYPE [T] [S]

`FullCache.update` without its fresh-prompt path, compiled as the chunk graph compiles it:
the default model's shapes (9 query heads, 3 KV heads, head dim 64), T new tokens after
S - T - 200 held ones, in a static buffer of S slots. Two variants of the mask over the int64
positions: (pos <= now) & (pos >= 0), and min(pos, now - pos) >= 0; then SDPA over the whole
buffer (model.attend's path for one stretch). Prints ms a call, variants in turns, 5 rounds.
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from model import fold

torch.set_num_threads(2)
dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[sys.argv[1]]
T = int(sys.argv[2]) if len(sys.argv) > 2 else 512
S = int(sys.argv[3]) if len(sys.argv) > 3 else 4296
H, Hkv, D = 9, 3, 64
start = S - T - 200
q = torch.randn(1, Hkv, (H // Hkv) * T, D, dtype=dtype)
k, v = (torch.randn(1, Hkv, S, D, dtype=dtype) for _ in range(2))
pos = torch.full((1, 1, S), -1, dtype=torch.long)
pos[..., :start + T] = torch.arange(start + T)
input_pos = torch.arange(start, start + T).view(1, T)


def step(form):
    def f(q, k, v, pos, input_pos):
        held = pos.unsqueeze(-2)
        now = input_pos.view(1, 1, -1, 1)
        mask = (held <= now) & (held >= 0) if form == "and" else torch.minimum(held, now - held) >= 0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=fold(mask, H // Hkv))
    return torch.compile(f, fullgraph=True, dynamic=False)


forms = {name: step(name) for name in ("and", "min")}
out = {name: f(q, k, v, pos, input_pos) for name, f in forms.items()}
assert torch.equal(out["and"], out["min"])
times = {name: [] for name in forms}
for _ in range(5):
    for name, f in forms.items():
        t = time.perf_counter()
        for _ in range(20):
            f(q, k, v, pos, input_pos)
        times[name].append(1000 * (time.perf_counter() - t) / 20)
print(f"{sys.argv[1]}, T {T}, S {S}: ms a call, median of 5 rounds of 20")
for name, ts in times.items():
    print(f"  {name:4s} {statistics.median(ts):8.3f}  ({', '.join(f'{x:.3f}' for x in ts)})")
