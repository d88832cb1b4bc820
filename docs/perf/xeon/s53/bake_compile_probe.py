"""Probe (PERFORMANCE 6zc): how long --bake_weights compiles a step, and its speed after.

    PYTHONPATH=. python docs/perf/xeon/s53/bake_compile_probe.py MODE [POLICY]

MODE: engine (the engine's baked step: each block's step through its cache one nested region,
kernel templates parsed once), stock (the same with Inductor parsing its templates on every
render), inline (the engine's template parsing, every block's cache step inline: the baked step
before 6zc). A 1k-token prompt (budget 256 for a compressing POLICY, bulk prompt compression),
then 3 steps (the compile) and 48 timed; bfloat16, 2 threads. Inductor config overrides:
CFG="name=value,...".
"""
import ast
import contextlib
import os
import sys
import time

import torch
import torch._inductor.config as icfg

import quantize.dense as dense
from caches import make_cache_factory
from engine import generation as G
from engine.checkpoint import load_model
from engine.cli import DTYPES
from engine.default_model import resolve_checkpoint

mode = sys.argv[1]
policy = sys.argv[2] if len(sys.argv) > 2 else "full"
for kv in filter(None, os.environ.get("CFG", "").split(",")):
    k, v = kv.split("=")
    setattr(icfg, k, ast.literal_eval(v))
if mode == "stock":
    dense._templates_parsed_once = contextlib.nullcontext
if mode == "inline":
    G.run_inline_step.__defaults__ = (G.run_block,)
torch.set_num_threads(2)
model = load_model(resolve_checkpoint(None), dtype=DTYPES["bfloat16"])
factory = make_cache_factory("full") if policy == "full" else \
    make_cache_factory(policy, cache_size=256, prompt_compression="bulk")
s = G.Session(model, factory, compile=True, max_seq_length=1300, bake_weights=True)
s.append(list(range(100, 1124)))
t = time.perf_counter()
s.generate(3)
compile_s = time.perf_counter() - t
g = s.generate(48)
print(f"{mode} {os.environ.get('CFG', '')} {policy}: compile {compile_s:.1f} s, "
      f"{1000 * g.decode_s / (g.new_tokens - 1):.2f} ms a step, tokens {g.new_ids[0][:8]}")
