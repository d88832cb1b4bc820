"""Probe (PERFORMANCE 6zs): attend over a step's 30 stretches in 4 KiB pages against the same
in 2 MiB pages (core.memory.empty_on_huge_pages), alternating in one process.
    PYTHONPATH=. python ab_huge.py [S]
"""
import os, statistics, sys, time, torch
sys.path.insert(0, "docs/perf/zen4/s69")
sys.argv = [sys.argv[0], sys.argv[1] if len(sys.argv) > 1 else "4096", "1"]
os.environ["HUGE"] = "0"
import attend_probe as P
import kernels
plain = {"bfloat16": P.stretches(torch.bfloat16), "int8": P.quantized()}
P.HUGE = True
huge = {"bfloat16": P.stretches(torch.bfloat16), "int8": P.quantized()}
q = torch.randn(1, P.H, P.M, P.D).bfloat16()
def run(L):
    t = time.perf_counter()
    for lay in L:
        kernels.attend(q, lay[0], lay[1], P.mask, 0.125, *(lay[2:] if len(lay) == 4 else (None, None)))
    return (time.perf_counter() - t) * 1e3
res = {}
for r in range(40):
    for name in plain:
        for where, sets in (("4 KiB", plain), ("2 MiB", huge)):
            res.setdefault((name, where), []).append(run(sets[name]))
for (name, where), v in sorted(res.items()):
    print(f"S={P.S} {name:9s} attend, pages {where}: median {statistics.median(v[5:]):.3f} ms")
