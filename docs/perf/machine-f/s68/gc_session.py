"""Probe (PERFORMANCE 6zr): whether the garbage collector runs in a compiled decode step, and what
gc.freeze() after the warm-up changes: single_session.py's session, then STEPS steps; prints ms a
step and the collections of each generation during them. FREEZE=1 freezes first.

    FREEZE=0|1 PYTHONPATH=. python docs/perf/machine-f/s68/gc_session.py POLICY DTYPE CONTEXT STEPS
"""
import gc, os, sys, time
sys.path.insert(0, "docs/perf/zen3/s46")
from single_session import warm_session
n = int(sys.argv[4])
s = warm_session(sys.argv[1], sys.argv[2], int(sys.argv[3]), n)
if os.environ.get("FREEZE") == "1":
    gc.collect(); gc.freeze()
before = [st["collections"] for st in gc.get_stats()]
t = time.perf_counter()
g = s.generate(n)
after = [st["collections"] for st in gc.get_stats()]
print("freeze" if os.environ.get("FREEZE") == "1" else "plain ", "ms/step %.2f" % (1000 * g.decode_s / (g.new_tokens - 1)),
      "collections", [a - b for a, b in zip(after, before)], "frozen", gc.get_freeze_count(), flush=True)
