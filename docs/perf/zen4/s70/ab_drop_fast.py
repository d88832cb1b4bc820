"""Probe (PERFORMANCE 6zt): an upper bound on what `quantized`'s short fast stretch costs a
step outside the attend kernel: the same session with its views' fast stretch left out of
attention (wrong output; only the time matters) against the engine's, in turns in one process,
`full` beside them.   ROUNDS=8 PYTHONPATH=. python docs/perf/zen4/s70/ab_drop_fast.py DTYPE CTX
"""
import os, statistics, sys
sys.path.insert(0, "docs/perf/zen3/s46")
import model  # noqa: E402
from single_session import warm_session  # noqa: E402

DROP = False
engine_attend = model.attend


def attend(view, need_probs=False):
    if model.PROBE_DROP and len(view.segments) > 1:  # the middle's stretch alone
        n = view.segments[0].k.shape[2]
        view = model.KVView(view.q, view.segments[1:], view.mask[..., n:])
    return engine_attend(view, need_probs)


model.PROBE_DROP = False
model.attend = attend
dtype, ctx = sys.argv[1], int(sys.argv[2])
rounds = int(os.environ.get("ROUNDS", "8"))
full = warm_session("full", dtype, ctx, rounds * 3 * 24 + 50)
q = warm_session("quantized", dtype, ctx, rounds * 3 * 24 + 50)
model.PROBE_DROP = True
q.generate(4)  # compiles the variant
res = {}
for r in range(rounds):
    order = [("full", False), ("q", False), ("q", True)]
    for name, drop in (order if r % 2 == 0 else order[::-1]):
        model.PROBE_DROP = drop
        g = (full if name == "full" else q).generate(24)
        res.setdefault((name, drop), []).append(1000 * g.decode_s / (g.new_tokens - 1))
f = statistics.median(res[("full", False)])
for key, xs in res.items():
    m = statistics.median(xs)
    print(f"{key[0]:5s} drop fast {key[1]!s:5s} {dtype} {ctx}: {m:6.2f} ms a step, "
          f"full/it {f / m:.3f}  {[round(x, 2) for x in xs]}")
