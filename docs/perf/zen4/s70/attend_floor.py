"""Probe (PERFORMANCE 6zt): the attend op's cost a call against its stretch's length, from the
smallest (the call's fixed cost) up: a step's 30 layers, each its own bfloat16 stretch, 3 KV
heads of 3 query rows, head size 64; the median of ROUNDS steps, in µs a call.

    PYTHONPATH=. python docs/perf/zen4/s70/attend_floor.py [S,S,...] [ROUNDS]
"""
import statistics, sys, time
import torch
import kernels

assert kernels.available()
torch.set_num_threads(2)
sizes = [int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "8,64,160,600,1030,4096").split(",")]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 200
L, H, M, D = 30, 3, 3, 64
torch.manual_seed(0)
q = torch.randn(1, H, M, D).to(torch.bfloat16)
for S in sizes:
    kv = [(torch.randn(1, H, S, D).to(torch.bfloat16), torch.randn(1, H, S, D).to(torch.bfloat16))
          for _ in range(L)]
    mask = torch.ones(1, 1, 1, S, dtype=torch.bool)
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        for k, v in kv:
            kernels.attend(q, k, v, mask, 0.125)
        ts.append((time.perf_counter() - t) * 1e6 / L)
    mb = 2 * H * S * D * 2 / 1e6
    m = statistics.median(ts)
    print(f"S={S:5d}  {m:7.1f} µs a call  ({mb:.3f} MB a call, {mb * 1e3 / m:.1f} GB/s)", flush=True)
