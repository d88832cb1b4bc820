"""Probe (PERFORMANCE 6w): where one session's compiled decode step spends its host time.

    PYTHONPATH=. python docs/perf/zen3/s47/host_split.py POLICY[+int8] DTYPE CONTEXT STEPS

As docs/perf/zen3/s46/single_session.py (one session, budget 256, bulk prompt compression), but
the STEPS timed steps run under torch.profiler with Inductor's kernel profile on, so that the
generated kernels are events of their own: prints ms a step of the events with the most self
time (the compiled graph's Python wrapper, Dynamo's cache lookup, each kind of kernel).

Then the step and a block's kernels in units of the head's kernel (the final norm and the tied
head: the same code and the same 28M weights for every policy, read once a step): this VM's
speed drifts by 10-20% between processes, and a ratio to a kernel of the same run cancels it.
"""
import sys
from pathlib import Path

import torch
import torch._inductor.config as ic

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "s46"))
from single_session import warm_session  # noqa: E402

ic.cpp.enable_kernel_profile = True
n = int(sys.argv[4])
s = warm_session(sys.argv[1], sys.argv[2], int(sys.argv[3]), n)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    g = s.generate(n + 1)
print("ms/step", 1000 * g.decode_s / (g.new_tokens - 1))
rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]
for e in rows:
    print(f"{e.self_cpu_time_total / 1000 / n:8.3f} ms/step {e.count / n:7.1f} calls/step  "
          f"{e.key[:90]}")
kernels = [e for e in prof.key_averages() if "cpp_fused" in e.key]
# The head: the largest kernel that runs once a step (the final norm may be a kernel of its own).
head = max((e for e in kernels if e.count < 2 * n), key=lambda e: e.self_cpu_time_total)
per_call = head.self_cpu_time_total / head.count / 1000
# A block: every kernel that runs in each layer, a step's worth divided by the layers.
layers = len(s.model.layers)
block = sum(e.self_cpu_time_total for e in kernels if e.count > 2 * n) / head.count / layers
print(f"head {per_call:.3f} ms; step {1000 * g.decode_s / (g.new_tokens - 1) / per_call:.3f} "
      f"heads; block {block / 1000 / per_call:.4f} heads")
