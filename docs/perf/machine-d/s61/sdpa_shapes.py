"""Probe (PERFORMANCE 6zk): ATen's SDPA at the last 4k prompt chunk's shapes (128 tokens,
9 query heads, 3 KV heads, 4,200 slots, bfloat16, eager, 2 threads), with and without a mask:
ms a call, mean of 5 (`sdpa-shapes.txt`).

    python docs/perf/machine-d/s61/sdpa_shapes.py
"""
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(2)
S, dt = 4200, torch.bfloat16
q9 = torch.randn(1, 9, 128, 64).to(dt)
k, v = (torch.randn(1, 3, S, 64).to(dt) for _ in "kv")
qg = q9.reshape(1, 3, 384, 64)  # 3 query heads a KV head folded into the rows
m = torch.rand(1, 1, 128, S) > 0.01
mg = m.unsqueeze(2).expand(1, 1, 3, 128, S).flatten(2, 3)
cases = {
    "folded+mask": lambda: F.scaled_dot_product_attention(qg, k, v, attn_mask=mg),
    "gqa+mask": lambda: F.scaled_dot_product_attention(q9, k, v, attn_mask=m, enable_gqa=True),
    "folded nomask": lambda: F.scaled_dot_product_attention(qg, k, v),
    "folded floatmask": lambda: F.scaled_dot_product_attention(  # the mask built in the call
        qg, k, v, attn_mask=torch.zeros(1, 1, 384, S, dtype=dt).masked_fill(~mg, -torch.inf)),
    "flash lse nomask":
        lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qg, k, v),
}
for name, f in cases.items():
    f()
    t = time.perf_counter()
    for _ in range(5):
        f()
    print(f"{name:18s} {(time.perf_counter() - t) / 5 * 1000:8.1f} ms")
