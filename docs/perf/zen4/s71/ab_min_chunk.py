"""Probe (PERFORMANCE 6zu): the compiled step's Inductor loops with OpenMP where a thread gets at
least 512 elements (Inductor's default `cpp.min_chunk_size`) against CHUNK, in turns in one
process, for `full` and POLICY: each session compiled with its own options (the step graph's).
    ROUNDS=8 PYTHONPATH=. python docs/perf/zen4/s71/ab_min_chunk.py DTYPE CTX CHUNK [POLICY]
"""
import os, statistics, sys
sys.path.insert(0, "docs/perf/zen3/s46")
from engine import generation as G  # noqa: E402
from single_session import warm_session  # noqa: E402

dtype, ctx, chunk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
policy = sys.argv[4] if len(sys.argv) > 4 else "quantized"
rounds = int(os.environ.get("ROUNDS", "8"))
base = dict(G.STEP_OPTIONS)
sess = {}
for name in ("full", policy):
    for c in (512, chunk):
        G.STEP_OPTIONS.clear()
        G.STEP_OPTIONS.update(base, **{"cpp.min_chunk_size": c})
        sess[(name, c)] = warm_session(name, dtype, ctx, rounds * 24 + 50)
G.STEP_OPTIONS.clear()
G.STEP_OPTIONS.update(base)
res = {k: [] for k in sess}
for r in range(rounds):
    for key in (list(sess) if r % 2 == 0 else list(sess)[::-1]):
        g = sess[key].generate(24)
        res[key].append(1000 * g.decode_s / (g.new_tokens - 1))
f = statistics.median(res[("full", 512)])
for (name, c), xs in res.items():
    m = statistics.median(xs)
    print(f"{name:10s} min_chunk {c:6d} {dtype} {ctx}: {m:6.2f} ms a step, full(512)/it "
          f"{f / m:.3f}  {[round(x, 2) for x in xs]}", flush=True)
