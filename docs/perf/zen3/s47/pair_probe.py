"""Probe (PERFORMANCE 6w): the compiled CPU step with its blocks two to a nested region (15
region calls a step instead of 30), against the engine's one block a region.

    PYTHONPATH=. python docs/perf/zen3/s47/pair_probe.py P[+int8] DTYPE CONTEXT STEPS pair|single

As docs/perf/zen3/s46/single_session.py (prints READY, for `perf record -p PID`, then ms a
step); `single` is the engine's step.
"""
import sys
from pathlib import Path

import torch

import model as M

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "s46"))

PAIR = sys.argv[5] == "pair"


def run_pair(la, lb, x, input_pos, ca, cb):
    return lb(la(x, input_pos, ca), input_pos, cb)


pair_region = torch.compiler.nested_compile_region(run_pair)
orig_run = M.Transformer.run


def run(self, idx, input_pos, caches, out_idx=None):
    if not (PAIR and torch.compiler.is_compiling() and idx.shape[1] == 1):
        return orig_run(self, idx, input_pos, caches, out_idx)
    x = self.tok_embeddings(idx)
    L = list(zip(self.layers, caches))
    assert len(L) % 2 == 0, "two blocks a region needs an even number of layers"
    for (la, ca), (lb, cb) in zip(L[0::2], L[1::2]):
        x = pair_region(la, lb, x, input_pos, ca, cb)
    return M.run_head(self.norm, self.output, x)


M.Transformer.run = run
from single_session import warm_session  # noqa: E402

n = int(sys.argv[4])
s = warm_session(sys.argv[1], sys.argv[2], int(sys.argv[3]), n)
print("READY", flush=True)
g = s.generate(n)
print("ms/step", 1000 * g.decode_s / (g.new_tokens - 1), flush=True)
