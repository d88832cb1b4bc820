"""Probe (PERFORMANCE 6zs): attend over a step's 30 stretches with fixed blocks of SLOTS slots
(0: attend_slots' rule) in alternating rounds of one process, scores and mix alone beside it.
Needs ab-hooks.diff applied.   SLOTS=128,0 PYTHONPATH=. python ab_slots.py [S]
"""
import os, statistics, sys, time, torch
sys.path.insert(0, "docs/perf/zen4/s69")
os.environ.setdefault("HUGE", "1")
sys.argv = [sys.argv[0], sys.argv[1] if len(sys.argv) > 1 else "4096", "1"]
import attend_probe as P
import kernels
layers = {"bfloat16": P.stretches(torch.bfloat16), "int8": P.quantized()}
q = torch.randn(1, P.H, P.M, P.D).bfloat16()
p = torch.softmax(torch.randn(1, P.H, P.M, P.S), -1)
def run(name, what):
    t = time.perf_counter()
    for lay in layers[name]:
        i8 = len(lay) == 4
        if what == "attend":
            kernels.attend(q, lay[0], lay[1], P.mask, 0.125, *(lay[2:] if i8 else (None, None)))
        elif what == "scores":
            kernels.scores8(q, lay[0], lay[2]) if i8 else kernels.scores(q, lay[0])
        else:
            kernels.mix8(p, lay[1], lay[3]) if i8 else kernels.mix(p, lay[1])
    return (time.perf_counter() - t) * 1e3
res = {}
VARS = [int(x) for x in os.environ.get("SLOTS", "128,256,512").split(",")]
for r in range(30):
    for name in layers:
        for what in ("scores", "mix"):
            res.setdefault((name, what, 0), []).append(run(name, what))
        for n in VARS:
            torch.ops.regionkv_ab.set_slots(n)
            res.setdefault((name, "attend", n), []).append(run(name, "attend"))
for (name, what, n), v in sorted(res.items()):
    print(f"{name:9s} {what:7s} {n or '':>5} median {statistics.median(v[5:]):.3f} ms")
