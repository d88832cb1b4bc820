"""Probe: what --compile_prefill costs to compile and saves on a first token.

    python scripts/compiled_prefill_probe.py POLICY:COMPRESSION:PREFILL[,...] [DTYPE]
        e.g. full:-:compiled,streaming:bulk:compiled,streaming:bulk:eager

For each spec, on the default model (budget 256 for a compressing POLICY, COMPRESSION chunked
or bulk; PREFILL compiled or eager, the decode step compiled either way, 2 threads, bfloat16
unless DTYPE says): a fresh Generator warms up (compiles the decode step and a prompt chunk)
and reads an 80-token prompt, which is the compile time printed; then the first token of a
1024-token prompt, best of 2. Run it under TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 to compile from
cold. Not part of the engine: docs/PERFORMANCE.md section 6h records what it measured.
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from caches import POLICIES, make_cache_factory  # noqa: E402
from engine.checkpoint import load_model  # noqa: E402
from engine.cli import DTYPES  # noqa: E402
from engine.default_model import resolve_checkpoint  # noqa: E402
from engine.generation import Generator  # noqa: E402


def main(specs: list, dtype: str) -> None:
    torch.set_num_threads(2)
    model = load_model(resolve_checkpoint(None), dtype=DTYPES[dtype])
    prompt = [100 + i % 1000 for i in range(1024)]
    print(f"{dtype}, 1024-token prompt; compile s (decode step and prompt chunk), first token s")
    for policy, compression, mode in specs:
        torch.compiler.reset()
        factory = make_cache_factory("full") if policy == "full" else \
            make_cache_factory(policy, cache_size=256, prompt_compression=compression)
        gen = Generator(model, 1100, make_cache=factory, compile=True,
                        compile_prefill=mode == "compiled")
        t = time.perf_counter()
        gen.warmup()
        gen.generate(prompt[:80], 2)
        warm = time.perf_counter() - t
        ttft = min(gen.generate(prompt, 2).prefill_s for _ in range(2))
        print(f"{policy:12s} {compression:8s} {mode:9s} compile {warm:6.1f}  first token "
              f"{ttft:5.2f}", flush=True)


def parse(text: str) -> list:
    specs = []
    for spec in text.split(","):
        parts = spec.split(":")
        if len(parts) != 3 or parts[0] not in POLICIES or parts[2] not in ("compiled", "eager") \
                or (parts[0] != "full" and parts[1] not in ("chunked", "bulk")):
            sys.exit(f"error: bad spec {spec!r}; write POLICY:COMPRESSION:PREFILL, e.g. "
                     f"streaming:bulk:compiled or full:-:eager")
        specs.append(tuple(parts))
    return specs


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python scripts/compiled_prefill_probe.py POLICY:COMPRESSION:PREFILL[,...] "
                 "[float32|bfloat16]")
    dtype = sys.argv[2] if len(sys.argv) == 3 else "bfloat16"
    if dtype not in DTYPES:
        sys.exit(f"error: unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    main(parse(sys.argv[1]), dtype)
