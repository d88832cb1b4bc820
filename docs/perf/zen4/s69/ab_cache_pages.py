"""Probe (PERFORMANCE 6zs): one policy's decode step with its caches in 2 MiB pages (what
caches.build_caches gives on CPU) against the same caches copied to plain memory, two sessions
in one process, in alternating rounds of 24 steps (the order swapped every round).

    PYTHONPATH=. python docs/perf/zen4/s69/ab_cache_pages.py POLICY DTYPE CONTEXT [ROUNDS]
"""
import statistics
import sys

import torch

sys.path.insert(0, "docs/perf/zen3/s46")
from single_session import warm_session  # noqa: E402

policy, dtype, ctx = sys.argv[1], sys.argv[2], int(sys.argv[3])
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 8
huge = warm_session(policy, dtype, ctx, 2 * rounds * 24 + 50)
plain = warm_session(policy, dtype, ctx, 2 * rounds * 24 + 50)
for cache in plain.caches:  # every buffer a plain copy (torch's allocator: 4 KiB pages)
    for name, t in list(cache._buffers.items()):
        if t is not None:
            cache._buffers[name] = t.clone()
plain.generate(8)  # the step recompiles if its inputs' layout changed
ms = {"2 MiB": [], "4 KiB": []}
for r in range(rounds):
    order = [("2 MiB", huge), ("4 KiB", plain)]
    for where, s in (order if r % 2 == 0 else order[::-1]):
        g = s.generate(24)
        ms[where].append(1000 * g.decode_s / (g.new_tokens - 1))
a, b = statistics.median(ms["2 MiB"]), statistics.median(ms["4 KiB"])
print(f"{policy} {dtype} {ctx}: caches in 2 MiB pages {a:.2f}, in 4 KiB pages {b:.2f} ms a step "
      f"({100 * (a / b - 1):+.1f}%); rounds {[round(x, 2) for x in ms['2 MiB']]} against "
      f"{[round(x, 2) for x in ms['4 KiB']]}")
