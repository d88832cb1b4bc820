"""Probe (PERFORMANCE 6zt): two sessions' compiled decode steps by op, side by side, from
torch's profiler, in one process, their rounds in turns (this VM favours whichever process
runs second, 6zs): the ms a step of each op (self CPU time) for A and B, and B - A.

    KERNELS=1 TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 PYTHONPATH=. \
        python docs/perf/zen4/s70/step_diff.py full quantized DTYPE CTX [ROUNDS]
"""
import collections, os, statistics, sys
import torch._inductor.config as inductor_config
from torch.profiler import ProfilerActivity, profile
sys.path.insert(0, "docs/perf/zen3/s46")
inductor_config.cpp.enable_kernel_profile = os.environ.get("KERNELS", "0") == "1"
from single_session import warm_session  # noqa: E402

a, b, dtype, ctx = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 6
steps = 24
sess = {p: warm_session(p, dtype, ctx, 2 * rounds * steps + 50) for p in (a, b)}
ops = {p: collections.Counter() for p in (a, b)}
walls = {p: [] for p in (a, b)}
for r in range(rounds):
    for p in ((a, b) if r % 2 == 0 else (b, a)):
        s = sess[p]
        g = s.generate(steps)  # unprofiled
        walls[p].append(1000 * g.decode_s / (g.new_tokens - 1))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            s.generate(steps)
        for e in prof.key_averages():
            ops[p][e.key] += e.self_cpu_time_total / 1000 / steps / rounds
for p in (a, b):
    print(f"{p}: {statistics.median(walls[p]):.2f} ms a step unprofiled (median of {rounds}) "
          f"{[round(x, 2) for x in walls[p]]}")
keys = sorted(set(ops[a]) | set(ops[b]), key=lambda k: -abs(ops[b][k] - ops[a][k]))
print(f"{'op':70s} {a:>9s} {b:>9s}   diff")
for k in keys[:int(os.environ.get("ROWS", "20"))]:
    print(f"{k[:70]:70s} {ops[a][k]:9.3f} {ops[b][k]:9.3f} {ops[b][k] - ops[a][k]:+7.3f}")
print(f"{'total':70s} {sum(ops[a].values()):9.3f} {sum(ops[b].values()):9.3f}")
