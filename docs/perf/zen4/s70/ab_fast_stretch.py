"""Probe (PERFORMANCE 6zt): `quantized`'s short fast stretch (sink + window + staging slots)
through Inductor's loops (kernels.ATTEND_SLOTS = 512, the engine's) against through the attend
kernel too (ATTEND_SLOTS = SLOTS), in turns in one process, `full` beside them.

    ROUNDS=8 PYTHONPATH=. python docs/perf/zen4/s70/ab_fast_stretch.py DTYPE CTX [SLOTS]
"""
import os, statistics, sys
sys.path.insert(0, "docs/perf/zen3/s46")
from single_session import warm_session  # noqa: E402
import kernels  # noqa: E402

dtype, ctx = sys.argv[1], int(sys.argv[2])
low = int(sys.argv[3]) if len(sys.argv) > 3 else 128
rounds = int(os.environ.get("ROUNDS", "8"))
full = warm_session("full", dtype, ctx, rounds * 3 * 24 + 50)
q = warm_session("quantized", dtype, ctx, rounds * 3 * 24 + 50)
kernels.ATTEND_SLOTS = low
q.generate(4)  # compiles the variant
kernels.ATTEND_SLOTS = 512
res = {}
for r in range(rounds):
    order = [("full", 512), ("q", 512), ("q", low)]
    for name, slots in (order if r % 2 == 0 else order[::-1]):
        kernels.ATTEND_SLOTS = slots
        g = (full if name == "full" else q).generate(24)
        res.setdefault((name, slots), []).append(1000 * g.decode_s / (g.new_tokens - 1))
f = statistics.median(res[("full", 512)])
for key, xs in res.items():
    m = statistics.median(xs)
    print(f"{key[0]:5s} ATTEND_SLOTS={key[1]:4d} {dtype} {ctx}: {m:6.2f} ms a step, "
          f"full/it {f / m:.3f}  {[round(x, 2) for x in xs]}")
