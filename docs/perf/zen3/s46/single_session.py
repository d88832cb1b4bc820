"""Probe (PERFORMANCE 6v): one session's compiled decode step, alone in its process.

    PYTHONPATH=. python docs/perf/zen3/s46/single_session.py POLICY[+int8] DTYPE CONTEXT STEPS

Reads a CONTEXT-token prompt (budget 256, bulk prompt compression), decodes 8 steps to warm
up, prints READY (a cue for `perf record -p PID`), then decodes STEPS steps and prints the ms
a step. Alternating processes of two policies compares them without the other sessions'
compiled steps in the same process.
"""
import sys

import torch

from caches import make_cache_factory
from engine import generation as G
from engine.checkpoint import load_model
from engine.cli import DTYPES
from engine.default_model import resolve_checkpoint


def warm_session(policy: str, dtype: str, ctx: int, n: int) -> G.Session:
    """The session, its prompt read and 8 steps decoded (docs/perf/zen3/s47/host_split.py too)."""
    torch.set_num_threads(2)
    model = load_model(resolve_checkpoint(None), dtype=DTYPES[dtype])
    name = policy.removesuffix("+int8")
    f = make_cache_factory("full") if name == "full" else make_cache_factory(
        name, cache_size=256, prompt_compression="bulk",
        kv_middle="int8" if policy.endswith("+int8") else "model")
    s = G.Session(model, f, compile=True, max_seq_length=ctx + n + 100)
    s.append(list(range(100, 100 + ctx)))
    s.generate(8)
    return s


if __name__ == "__main__":
    n = int(sys.argv[4])
    s = warm_session(sys.argv[1], sys.argv[2], int(sys.argv[3]), n)
    print("READY", flush=True)
    g = s.generate(n)
    print("ms/step", 1000 * g.decode_s / (g.new_tokens - 1), flush=True)
