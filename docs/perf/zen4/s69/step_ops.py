"""Probe (PERFORMANCE 6zs): where one session's compiled decode step goes, by op, from torch's
profiler: a POLICY session (docs/perf/zen3/s46/single_session.py's warm-up) decodes STEPS steps
under the profiler; prints the ms a step and the ops' self CPU time a step.

    PYTHONPATH=. python docs/perf/zen4/s69/step_ops.py POLICY[+int8] DTYPE CONTEXT [STEPS]
"""
import os
import sys
import time

import torch
import torch._inductor.config as inductor_config
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "docs/perf/zen3/s46")
from single_session import warm_session  # noqa: E402

# KERNELS=1: each of Inductor's C++ kernels a profiler event of its own (recompiles: set
# TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 with it)
inductor_config.cpp.enable_kernel_profile = os.environ.get("KERNELS", "0") == "1"
policy, dtype, ctx = sys.argv[1], sys.argv[2], int(sys.argv[3])
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 48
s = warm_session(policy, dtype, ctx, 3 * steps)
t = time.perf_counter()
g = s.generate(steps)
print(f"{policy} {dtype} {ctx}: {1000 * g.decode_s / (g.new_tokens - 1):.2f} ms a step, "
      f"unprofiled", flush=True)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    g = s.generate(steps)
print(f"{policy}: {1000 * g.decode_s / (g.new_tokens - 1):.2f} ms a step, profiled")
rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
for e in rows[:int(os.environ.get("ROWS", "25"))]:
    print(f"{e.self_cpu_time_total / 1000 / steps:8.3f} ms a step  {e.count / steps:6.1f} calls  "
          f"{e.key[:90]}")
