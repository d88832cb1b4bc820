"""Probe (PERFORMANCE 6zv): time to first token with the prompt's chunk graph compiled with
Inductor's cpp_wrapper (engine.generation.CHUNK_OPTIONS, 6zv's trial code, not kept) against the Python wrapper
(COMPRESS_OPTIONS), in turns in one process (each variant its own copy of the model, whose
chunk_step it sets), the order swapped every round; bench.py's first-token rows' settings.

    PYTHONPATH=. python docs/perf/zen4/s73/ab_chunk_wrapper.py streaming,quantized DTYPE CONTEXT [ROUNDS]
"""
import statistics
import sys

import torch

from bench import context_ids
from caches import make_cache_factory
from engine import generation as G
from engine.checkpoint import load_model
from engine.cli import DTYPES
from engine.default_model import resolve_checkpoint
from engine.tokenizer import load_tokenizer

policies, dtype, ctx = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
torch.set_num_threads(2)
path = resolve_checkpoint(None)
prompt = context_ids(load_tokenizer(path), ctx, None)
variants = {"C++": G.CHUNK_OPTIONS, "Python": G.COMPRESS_OPTIONS}
gens = {}
for p in policies:
    for name, options in variants.items():
        G.CHUNK_OPTIONS = options  # read by compile_prompt, which the Generator calls
        f = make_cache_factory(p, cache_size=256, prompt_compression="bulk", chunk=128)
        g = G.Generator(load_model(path, dtype=DTYPES[dtype]), ctx + 2, make_cache=f,
                        compile=True, compile_prefill=True)
        g.warmup(0.0, None)
        g.generate(prompt[:48], 2, temperature=0.0)
        gens[p, name] = g
s = {k: [] for k in gens}
for r in range(rounds):
    for p in policies:
        for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            s[p, name].append(gens[p, name].generate(prompt, 1, temperature=0.0).prefill_s)
for p in policies:
    a, b = (statistics.median(s[p, n]) for n in variants)
    print(f"{p:12s} {dtype} {ctx}: C++ wrapper {a:.3f} s, Python wrapper {b:.3f} s "
          f"({100 * (a / b - 1):+.1f}%); rounds {[round(x, 3) for x in s[p, 'C++']]} against "
          f"{[round(x, 3) for x in s[p, 'Python']]}", flush=True)
