"""Probe: each policy's decode step against `streaming`'s, measured interleaved.

    python scripts/interleaved_overhead.py CONTEXT [POLICY,POLICY,...] [DTYPE]   # e.g. 4096
    python scripts/interleaved_overhead.py 4096 streaming:8,weightedkv,weightedkv:8
    python scripts/interleaved_overhead.py 1024 h2o,weightedkv bfloat16

`full` may be one of them (no budget: the reference for `full / it`). A POLICY may carry `:K`,
its compression interval (docs/DESIGN.md; default 1), and `+int8`, an INT8 middle
(--kv_middle int8): `weightedkv+int8`, `weightedkv:8+int8`.

`bench.py` measures one row after another, minutes apart, and this VM's bandwidth drifts
between them by more than a policy's bookkeeping costs. Here
every policy's session reads the same CONTEXT-token prompt (bulk prompt compression, budget 256,
compiled, 2 threads, float32 unless DTYPE says; each session warmed up first, so every variant
of its compiled step is compiled before timing), then the sessions take turns: 5 rounds of 24
decode steps each, so that each round sees the machine in the same state. Prints the median ms
a step per policy and its overhead over `streaming`. Not part of the engine: PERFORMANCE.md
records what it measured.
"""
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from caches import POLICIES, make_cache_factory  # noqa: E402
from core.errors import UserError  # noqa: E402
from engine.runtime import generation as G  # noqa: E402
from engine.loading.checkpoint import load_model  # noqa: E402
from engine.cli import DTYPES  # noqa: E402
from engine.loading.default_model import resolve_checkpoint  # noqa: E402

DEFAULT = "h2o,tova,a2sf,weightedkv,weightedkv-evict,cam,lagkv,knorm,keydiff"


def main(context: int, policies: list, dtype: str) -> None:
    torch.set_num_threads(2)
    model = load_model(resolve_checkpoint(None), dtype=DTYPES[dtype])
    prompt = list(range(100, 100 + context))  # token ids; their text does not matter for speed
    sessions = {}
    for spec in ["streaming", *policies]:
        name, int8 = spec.removesuffix("+int8"), spec.endswith("+int8")
        policy, _, k = name.partition(":")
        factory = make_cache_factory("full") if policy == "full" else \
            make_cache_factory(policy, cache_size=256, prompt_compression="bulk",
                               compression_interval=int(k or 1),
                               kv_middle="int8" if int8 else "model")
        s = G.Session(model, factory, max_seq_length=context + 5 * 24 + 128, compile=True)
        s.warmup()  # compiles every variant of the step (a pass, LagKV's scoring)
        s.append(prompt)
        s.generate(8)
        sessions[spec] = s
    steps = {p: [] for p in sessions}
    for _ in range(5):
        for policy, s in sessions.items():
            g = s.generate(24)
            steps[policy].append(1000 * g.decode_s / (g.new_tokens - 1))
    base = statistics.median(steps["streaming"])
    print(f"context {context}, budget 256, {dtype}, ms a decode step (median of 5 rounds)")
    for policy, ms in steps.items():
        m = statistics.median(ms)
        over = f"{m - base:+.2f} ({100 * (m / base - 1):+.1f}%)"
        full = f"  full / it {statistics.median(steps['full']) / m:.2f}x" if "full" in steps \
            else ""
        print(f"{policy:18s} {m:6.2f}  {'(base)' if policy == 'streaming' else over}{full}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3, 4) or not sys.argv[1].isdigit():
        sys.exit("usage: python scripts/interleaved_overhead.py CONTEXT [POLICY,POLICY,...] "
                 "[float32|bfloat16]")
    names = (sys.argv[2] if len(sys.argv) >= 3 else DEFAULT).split(",")
    dtype = sys.argv[3] if len(sys.argv) == 4 else "float32"
    if dtype not in DTYPES:
        sys.exit(f"error: unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    specs = [n.removesuffix("+int8") for n in names]
    unknown = [n for n in specs if n.partition(":")[0] not in POLICIES or
               not (n.partition(":")[2] or "1").isdigit()]
    if unknown:
        sys.exit(f"error: unknown policy {unknown[0]!r}; choose from {', '.join(POLICIES)}")
    try:
        main(int(sys.argv[1]), names, dtype)
    except UserError as e:
        sys.exit(f"error: {e}")
