"""Probe (PERFORMANCE 6za): a prompt's first token with one-pass caches read as a wavefront
(two pieces of half the prompt, the layers at work stacked: engine.generation.layer_piece) or
in one piece of PREFILL_PIECE rows, layer after layer (6y's plan), interleaved in one process
(each round in the other order than the last) as bench.py reads it with --compile on
--compile_prefill (budget 256, chunks of 128):

    PYTHONPATH=. python docs/perf/xeon/wave_ab.py POLICY DTYPE CONTEXT [ROUNDS] [COMPRESSION]

COMPRESSION: bulk (default) or chunked. VARIANTS=wave,one (default; `one`: pieces of PREFILL_PIECE
rows, at 4k one piece; a number N: pieces of N rows); CHUNK=N
the prompt chunk (128). Prints each round's first token, s, and the medians.
"""
import os
import statistics
import sys

import torch

import engine.generation as G
from caches import make_cache_factory
from engine.checkpoint import load_model
from engine.cli import DTYPES
from engine.default_model import resolve_checkpoint

torch.set_num_threads(2)
policy, dtype, ctx = sys.argv[1], sys.argv[2], int(sys.argv[3])
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 4
compression = sys.argv[5] if len(sys.argv) > 5 else "bulk"
model = load_model(resolve_checkpoint(None), dtype=DTYPES[dtype])
factory = make_cache_factory(policy, cache_size=256, chunk=int(os.environ.get("CHUNK", 128)),
                             prompt_compression=compression)
gen = G.Generator(model, ctx + 10, make_cache=factory, compile=True, compile_prefill=True)
gen.warmup(0.0, None)
wave = G.layer_piece
plans = {"wave": wave,  # the engine's
         "one": lambda caches, chunk, rows, n_layer: max(1, G.PREFILL_PIECE // chunk) * chunk}
names = os.environ.get("VARIANTS", "wave,one").split(",")
plans.update({n: (lambda caches, chunk, rows, n_layer, v=int(n): v) for n in names
              if n.isdigit()})
prompt = [100 + (i * 7919) % 40000 for i in range(ctx)]  # token ids: their text does not matter
times = {n: [] for n in names}
for r in range(rounds + 1):
    for name in names[::1 if r % 2 else -1]:
        G.layer_piece = plans[name]
        t = gen.generate(prompt, 2, temperature=0.0).prefill_s
        if r:  # the first round compiles what the warm-up did not
            times[name].append(t)
G.layer_piece = wave
for name, ts in times.items():
    print(f"{policy} {dtype} {ctx} {compression} {name}: "
          f"{' '.join(f'{t:.3f}' for t in ts)}  median {statistics.median(ts):.3f} s")
