"""Probe (PERFORMANCE 6zs): the attend and scores ops over a 4k step's 30 stretches, the old
AVX-512 scores loops against the four-slot ones in alternating rounds of one process. Needs
ab-hooks.diff applied (torch.ops.regionkv_ab).   PYTHONPATH=. python ab_inproc.py [S]
"""
import os, statistics, sys, time, torch
sys.path.insert(0, "docs/perf/zen4/s69")
os.environ.setdefault("HUGE", "1")
sys.argv = [sys.argv[0], sys.argv[1] if len(sys.argv) > 1 else "4096", "1"]
import attend_probe as P  # builds its stretches and prints one pass
import kernels
layers = {"bfloat16": P.stretches(torch.bfloat16), "int8": P.quantized()}
qs = {"bfloat16": torch.randn(1, P.H, P.M, P.D).bfloat16(), "int8": torch.randn(1, P.H, P.M, P.D).bfloat16()}
p = torch.softmax(torch.randn(1, P.H, P.M, P.S), -1)
def run(name, what):
    L, q = layers[name], qs[name]
    t = time.perf_counter()
    for lay in L:
        if what == "attend":
            kernels.attend(q, lay[0], lay[1], P.mask, 0.125, *(lay[2:] if len(lay) == 4 else (None, None)))
        elif name == "int8":
            kernels.scores8(q, lay[0], lay[2])
        else:
            kernels.scores(q, lay[0])
    return (time.perf_counter() - t) * 1e3
res = {}
for r in range(40):
    for old in (0, 1):
        torch.ops.regionkv_ab.set_old(old)
        for name in layers:
            for what in ("attend", "scores"):
                res.setdefault((name, what, old), []).append(run(name, what))
for (name, what, old), v in sorted(res.items()):
    print(f"{name:9s} {what:7s} {'old ' if old else 'four'} median {statistics.median(v[5:]):.3f} ms, "
          f"quartiles {statistics.quantiles(v[5:], n=4)[0]:.3f}-{statistics.quantiles(v[5:], n=4)[2]:.3f}")
