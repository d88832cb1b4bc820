"""Probe (PERFORMANCE 6zz, 6zza): where a one-shot prompt's time goes (--prompt_compression
snapkv, budget 256, compiled steps and prompts), under torch.profiler after one read that
compiles. The session holds CONTEXT + ROOM tokens: 200, room to keep every token in the middle
(6zz); 8, as bench.py sizes it, so that the middle must choose (6zza).

    PYTHONPATH=. python docs/perf/xeon/s78/oneshot_profile.py POLICY DTYPE CONTEXT [ROOM]
"""
import sys
import time

import torch

from caches import make_cache_factory
from engine import generation as G
from engine.checkpoint import load_model
from engine.cli import DTYPES
from engine.default_model import resolve_checkpoint

policy, dtype, ctx = sys.argv[1], sys.argv[2], int(sys.argv[3])
room = int(sys.argv[4]) if len(sys.argv) > 4 else 200
torch.set_num_threads(2)
model = load_model(resolve_checkpoint(None), dtype=DTYPES[dtype])
f = make_cache_factory("full") if policy == "full" else make_cache_factory(
    policy, cache_size=256, prompt_compression="snapkv", chunk=128)
s = G.Session(model, f, compile=True, compile_prefill=True, max_seq_length=ctx + room)
prompt = list(range(100, 100 + ctx))
s.append(prompt)
for _ in range(2):
    s.reset()
    t = time.perf_counter()
    s.append(prompt)
    print(f"{policy} {dtype} {ctx}: {time.perf_counter() - t:.3f} s")
s.reset()
with torch.profiler.profile() as prof:
    s.append(prompt)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
