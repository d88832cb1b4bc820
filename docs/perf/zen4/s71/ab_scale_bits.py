"""Probe (PERFORMANCE 6zu): `quantized`'s INT8 scales handed to the kernels as float32 views
(before: a dtype view per stretch in the graph's wrapper, each step) against their int32 bits
(now: a view of the rows' buffer alone), in turns in one process, `full` beside them.
    ROUNDS=8 PYTHONPATH=. python docs/perf/zen4/s71/ab_scale_bits.py DTYPE CTX [POLICY]
"""
import os, statistics, sys
sys.path.insert(0, "docs/perf/zen3/s46")
import kernels  # noqa: E402
from single_session import warm_session  # noqa: E402

engine_bits = kernels.bits
kernels.PROBE_OLD = False
kernels.bits = lambda s: s if kernels.PROBE_OLD else engine_bits(s)
dtype, ctx = sys.argv[1], int(sys.argv[2])
policy = sys.argv[3] if len(sys.argv) > 3 else "quantized"
rounds = int(os.environ.get("ROUNDS", "8"))
full = warm_session("full", dtype, ctx, rounds * 3 * 24 + 50)
q = warm_session(policy, dtype, ctx, rounds * 3 * 24 + 50)
kernels.PROBE_OLD = True
q.generate(4)  # compiles the variant
res = {}
for r in range(rounds):
    order = [("full", False), ("q", True), ("q", False)]
    for name, old in (order if r % 2 == 0 else order[::-1]):
        kernels.PROBE_OLD = old
        g = (full if name == "full" else q).generate(24)
        res.setdefault((name, old), []).append(1000 * g.decode_s / (g.new_tokens - 1))
f = statistics.median(res[("full", False)])
for key, xs in res.items():
    m = statistics.median(xs)
    label = "full" if key[0] == "full" else f"{policy} {'before' if key[1] else 'now'}"
    print(f"{label:17s} {dtype} {ctx}: {m:6.2f} ms a step, full/it {f / m:.3f}  "
          f"{[round(x, 2) for x in xs]}")
