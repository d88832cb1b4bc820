"""Probe (PERFORMANCE 6x): a compiled step with the norms before the streamed linears stored
once (quantize/dense.py's hook, which the engine registers only where oneDNN has no kernel
for the dtype), against the engine's step, in one process each.

    PYTHONPATH=. python docs/perf/xeon/stored_norms_probe.py full bfloat16 1024 100 [stored]

Prints ms a step and the kernels' ms a step (torch.profiler with Inductor's kernel profile).
"""
import sys

import torch
import torch._inductor.config as ic

from caches import make_cache_factory
from engine import generation as G
from engine.checkpoint import load_model
from engine.cli import DTYPES
from engine.default_model import resolve_checkpoint
from quantize.dense import _store_streamed_input

ic.cpp.enable_kernel_profile = True
policy, dtype, ctx, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(2)
model = load_model(resolve_checkpoint(None), dtype=DTYPES[dtype])
if sys.argv[5:] == ["stored"]:
    for norm in [m for layer in model.layers for m in (layer.attention_norm, layer.ffn_norm)] + \
            [model.norm]:
        norm.register_forward_hook(_store_streamed_input)
f = make_cache_factory("full") if policy == "full" else make_cache_factory(
    policy, cache_size=256, prompt_compression="bulk")
s = G.Session(model, f, compile=True, max_seq_length=ctx + 2 * n + 100)
s.append(list(range(100, 100 + ctx)))
s.generate(8)
g = s.generate(n)
plain = 1000 * g.decode_s / (g.new_tokens - 1)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    g = s.generate(n // 4 + 1)
kernels = [e for e in prof.key_averages() if "cpp_fused" in e.key]
once = sum(e.self_cpu_time_total for e in kernels if e.count < 2 * (n // 4)) / 1000 / (n // 4)
layer = sum(e.self_cpu_time_total for e in kernels if e.count > 2 * (n // 4)) / 1000 / (n // 4)
print(f"{sys.argv[5:] or ['engine']} ms/step {plain:.2f}; kernels once a step {once:.2f} ms, "
      f"in the blocks {layer:.2f} ms")
