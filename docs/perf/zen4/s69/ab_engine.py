"""Probe (PERFORMANCE 6zs): sessions' decode steps with the attention kernels' two variants in
turns, one process: rounds alternate before (the old AVX-512 scores loops, 128-slot attend
blocks) and after (scores by fours, attend_slots' rule), the order swapped every round. Needs
ab-hooks.diff applied.   ROUNDS=10 PYTHONPATH=. python ab_engine.py full:4096,quantized:4096 DTYPE
"""
import statistics, sys, torch
sys.path.insert(0, "docs/perf/zen3/s46")
from single_session import warm_session
import kernels
specs = sys.argv[1].split(",")  # POLICY:CTX
dtype = sys.argv[2]
sessions = {sp: warm_session(sp.split(":")[0], dtype, int(sp.split(":")[1]), int(__import__("os").environ.get("ROUNDS", "6")) * 2 * 24 + 50) for sp in specs}
def set_variant(after):
    torch.ops.regionkv_ab.set_old(0 if after else 1)
    torch.ops.regionkv_ab.set_slots(0 if after else 128)
res = {}
for r in range(int(__import__("os").environ.get("ROUNDS", "6"))):
    for sp, s in sessions.items():
        for after in ((0, 1) if r % 2 == 0 else (1, 0)):
            set_variant(after)
            g = s.generate(24)
            res.setdefault((sp, after), []).append(1000 * g.decode_s / (g.new_tokens - 1))
for sp in specs:
    b, a = statistics.median(res[(sp, 0)]), statistics.median(res[(sp, 1)])
    print(f"{sp:16s} {dtype}: before {b:6.2f}  after {a:6.2f} ms a step ({100 * (a / b - 1):+.1f}%)"
          f"  rounds before {[round(x, 2) for x in res[(sp, 0)]]} after {[round(x, 2) for x in res[(sp, 1)]]}")
