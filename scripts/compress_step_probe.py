"""Probe: one layer's compression step, per policy, in microseconds.

    python scripts/compress_step_probe.py [POLICY,POLICY,...] [DTYPE] [step|bulk|eager]

`bulk` times the bulk pass instead (the one a prompt chunk with `--prompt_compression bulk`
takes, here at the position after the prompt, where no chunk is waiting: the same ops, on
the same shapes) and prints its compile time too. `eager` times the token step uncompiled, as
`generate.py` runs it without --compile (every decode step, and every prompt token of a policy
that keeps the token steps).

Each policy's session reads a 1k-token prompt (budget 256, bulk prompt compression, 2 threads,
bfloat16 unless DTYPE says), then layer 0's cache runs the compiled compression step (the one
that prompt chunks use, with the engine's Inductor options) 7 x 300 times at the next position;
prints the median time a call. A call includes the compiled function's own call cost (about 20
us here), the same for every policy, so differences between policies are the bookkeeping's.
A policy with a schedule (LagKV) runs its scoring variant at every call; each policy's
graph is compiled afresh, so no policy pays for another's guards. Not part of the engine:
docs/PERFORMANCE.md section 6g records what it measured.
"""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from caches import POLICIES, make_cache_factory  # noqa: E402
from caches.region import RegionCache  # noqa: E402
from engine import generation as G  # noqa: E402
from engine.checkpoint import load_model  # noqa: E402
from engine.cli import DTYPES  # noqa: E402
from engine.default_model import resolve_checkpoint  # noqa: E402

DEFAULT = "streaming,h2o,tova,a2sf,weightedkv,weightedkv-evict,cam,lagkv,knorm,keydiff"


def main(policies: list, dtype: str, what: str) -> None:
    torch.set_num_threads(2)
    model = load_model(resolve_checkpoint(None), dtype=DTYPES[dtype])
    fn = RegionCache.compress_bulk if what == "bulk" else RegionCache.compress_step
    name = {"step": "compression step", "bulk": "bulk pass", "eager": "eager token step"}[what]
    print(f"budget 256, {dtype}, one layer's {name}, us a call (median of 7 x 300)"
          + ("; compile s" if what == "bulk" else ""))
    for policy in policies:
        # A fresh cache of compiled code per policy: Dynamo tries the guards of every earlier
        # policy's graph first, which would charge later policies a few us each.
        torch._dynamo.reset()
        step = torch.inference_mode()(fn) if what == "eager" else \
            torch.compile(fn, fullgraph=True, dynamic=False, options=G.COMPRESS_OPTIONS)
        s = G.Session(model, make_cache_factory(policy, cache_size=256, prompt_compression="bulk"),
                      max_seq_length=1400)
        s.append(list(range(100, 1124)))
        cache, cur = s.caches[0], torch.tensor([[[1124]]])
        t = time.perf_counter()
        step(cache, cur)
        compile_s = time.perf_counter() - t
        for _ in range(10):
            step(cache, cur)
        runs = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(300):
                step(cache, cur)
            runs.append((time.perf_counter() - t) / 300 * 1e6)
        print(f"{policy:18s} {statistics.median(runs):6.1f}"
              + (f" {compile_s:6.1f}" if what == "bulk" else ""), flush=True)


if __name__ == "__main__":
    names = (sys.argv[1] if len(sys.argv) >= 2 else DEFAULT).split(",")
    dtype = sys.argv[2] if len(sys.argv) >= 3 else "bfloat16"
    what = sys.argv[3] if len(sys.argv) >= 4 else "step"
    if len(sys.argv) > 4 or dtype not in DTYPES or what not in ("step", "bulk", "eager"):
        sys.exit("usage: python scripts/compress_step_probe.py [POLICY,POLICY,...] "
                 "[float32|bfloat16] [step|bulk|eager]")
    unknown = [n for n in names if not issubclass(POLICIES.get(n, object), RegionCache)]
    if unknown:
        sys.exit(f"error: {unknown[0]!r} is not a compressing policy; choose from "
                 f"{', '.join(n for n, p in POLICIES.items() if issubclass(p, RegionCache))}")
    main(names, dtype, what)
