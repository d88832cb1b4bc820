"""Probe: compile time of the whole-step graph (CUDA's form of the decode step) on CPU.

    python scripts/whole_step_compile.py POLICY [unrolled]     # e.g. weightedkv

Compiles `decode_one_token` whole, sampling included, as `compile_decode(whole_step=True)`
does (on CUDA it is then replayed as a CUDA graph; here it runs as Inductor's C++), on the
default model in float32 with a budget of 64 for a compressing POLICY, and prints the seconds
to the first decoded token (a cold compile: Inductor's caches are off) and the ms a step after
it. `unrolled` traces the 30 blocks inline, as the step was compiled before every block became
one nested region. Not part of the engine: docs/PERFORMANCE.md, section 6e, records what it
measured.
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from caches import POLICIES, make_cache_factory  # noqa: E402
from engine import generation as G  # noqa: E402
from engine.checkpoint import load_model  # noqa: E402
from engine.default_model import resolve_checkpoint  # noqa: E402


def main(policy: str, unrolled: bool) -> None:
    torch.set_num_threads(2)
    torch._inductor.config.force_disable_caches = True  # a cold compile, as on a fresh machine
    model = load_model(resolve_checkpoint(None))
    factory = make_cache_factory("full") if policy == "full" else \
        make_cache_factory(policy, cache_size=64)
    s = G.Session(model, factory, max_seq_length=512)
    s.decode_fn = G.compile_decode(G.decode_one_token, model, caches=s.caches, whole_step=True)
    if unrolled:
        model.block_step = None  # the blocks inline in the traced step
    s.append(list(range(100, 105)))
    t = time.perf_counter()
    s.generate(2)
    compile_s = time.perf_counter() - t
    g = s.generate(96)  # past the budget: every step compresses
    print(f"{policy}, whole step, {'unrolled' if unrolled else 'nested blocks'}: "
          f"compile {compile_s:.1f} s, {1000 * g.decode_s / (g.new_tokens - 1):.1f} ms a step")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[1] not in POLICIES or \
            sys.argv[2:] not in ([], ["unrolled"]):
        sys.exit(f"usage: python scripts/whole_step_compile.py POLICY [unrolled]; "
                 f"POLICY one of {', '.join(POLICIES)}")
    main(sys.argv[1], len(sys.argv) == 3)
