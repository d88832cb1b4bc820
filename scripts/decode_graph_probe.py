"""Probe: the CPU decode step as 30 compiled block calls against one compiled graph.

    python scripts/decode_graph_probe.py {regional,nested} POLICY DTYPE   # e.g. nested full float32

`nested` is what `engine.generation.compile_decode` does on CPU (since section 6d of
docs/PERFORMANCE.md): the model's single-token forward compiled with fullgraph=True, the block
a `torch.compiler.nested_compile_region`, so its code is compiled once and stamped out per
layer inside one graph: one guard check and one wrapper a step. `regional` is the step before
it: one compiled block step called once per layer, head and sampling eager. Prints compile
time and the median ms a decode step (5 x 16 tokens after a 1,000-token prompt, 2 threads).
Not part of the engine: PERFORMANCE.md section 6 records what it measured.
"""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from caches import make_cache_factory  # noqa: E402
from engine import generation as G  # noqa: E402
from core.errors import UserError  # noqa: E402
from engine.checkpoint import load_model  # noqa: E402
from engine.cli import DTYPES  # noqa: E402
from engine.default_model import resolve_checkpoint  # noqa: E402


def main(mode: str, policy: str, dtype: str) -> None:
    torch.set_num_threads(2)
    model = load_model(resolve_checkpoint(None), dtype=DTYPES[dtype])
    factory = make_cache_factory(policy, cache_size=256) if policy != "full" else None
    session = G.Session(model, factory, max_seq_length=2048, compile=True)
    if mode == "regional":
        model.step_graph = None
        model.block_step = torch.compile(G.run_block, fullgraph=True, dynamic=False)
    session.append(list(range(100, 1100)))
    t0 = time.perf_counter()
    session.generate(8)  # compiles
    compile_s = time.perf_counter() - t0
    steps = []
    for _ in range(5):
        g = session.generate(16)
        steps.append(1000 * g.decode_s / (g.new_tokens - 1))
    print(f"{mode} {policy} {dtype}: compile+8 {compile_s:.1f} s, decode "
          f"{statistics.median(steps):.1f} ms a step (median of {[round(x, 1) for x in steps]})")


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("regional", "nested") or sys.argv[3] not in DTYPES:
        sys.exit("usage: python scripts/decode_graph_probe.py {regional,nested} POLICY "
                 f"{{{','.join(DTYPES)}}}")
    try:
        main(*sys.argv[1:])
    except UserError as e:  # an unknown policy, a missing default model: one line
        sys.exit(f"error: {e}")
