"""Probe: the compiled decode step with RegionCache's code at a git revision against the working
tree, on one session, measured interleaved.

    python scripts/region_ab.py REV POLICY CONTEXT [DTYPE]    # e.g. 0c806c8 weightedkv 1024

Loads caches/region.py as it was at REV (`git show`) beside the working tree's. One session
(budget 256, bulk prompt compression) reads a CONTEXT-token prompt; then the two variants take
turns, 6 rounds of 24 decode steps each. Before each turn, RegionCache's step methods are set
to that variant's (the policies inherit them) and the model's step graph to the variant's own
compiled graph. Prints the median ms a step of each. A probe, not part of the engine. The
figures it gave are in docs/PERFORMANCE.md, section 6e.
"""
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from caches import POLICIES, make_cache_factory  # noqa: E402
from decode_ab import interleave, own_step_graph  # noqa: E402  (scripts/, the script's own folder)
from caches.region import RegionCache  # noqa: E402
from engine import generation as G  # noqa: E402
from engine.checkpoint import load_model  # noqa: E402
from engine.cli import DTYPES  # noqa: E402
from engine.default_model import resolve_checkpoint  # noqa: E402

# The methods a decode step runs (a policy's own methods are the same in both variants).
STEP = ("update", "view", "write_v", "write_all_v", "move_to_middle", "move_left_to_middle")


def region_at(rev: str):
    shown = subprocess.run(["git", "show", f"{rev}:caches/region.py"], cwd=ROOT,
                           capture_output=True, text=True)
    if shown.returncode != 0:
        sys.exit(f"error: no caches/region.py at revision {rev!r} "
                 f"({shown.stderr.strip().splitlines()[-1]}); give a commit of this repository")
    source = shown.stdout
    path = Path(tempfile.mkdtemp()) / "region_at_rev.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("region_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dynamo looks the module up by name
    spec.loader.exec_module(module)
    return module.RegionCache


def main(rev: str, policy: str, context: int, dtype: str) -> None:
    torch.set_num_threads(2)
    methods = {rev: {n: region_at(rev).__dict__[n] for n in STEP},
               "tree": {n: RegionCache.__dict__[n] for n in STEP}}
    model = load_model(resolve_checkpoint(None), dtype=DTYPES[dtype])
    factory = make_cache_factory(policy, cache_size=256, prompt_compression="bulk")
    rounds, steps = 6, 24
    s = G.Session(model, factory, max_seq_length=context + (rounds + 1) * steps * 2 + 64,
                  compile=True)
    s.append(list(range(100, 100 + context)))  # token ids; their text does not matter for speed
    graphs = {v: own_step_graph() for v in methods}  # each variant a graph of its own

    def use(v: str) -> None:
        for name, fn in methods[v].items():
            setattr(RegionCache, name, fn)
        model.step_graph = graphs[v]

    print(f"{policy}, context {context}, {dtype}, ms a decode step (median of {rounds} rounds)")
    interleave(s, list(methods), use, rounds, steps)
    use("tree")


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5) or not sys.argv[3].isdigit():
        sys.exit("usage: python scripts/region_ab.py REV POLICY CONTEXT [float32|bfloat16]")
    dtype = sys.argv[4] if len(sys.argv) == 5 else "float32"
    if sys.argv[2] not in POLICIES or sys.argv[2] == "full":
        sys.exit(f"error: {sys.argv[2]!r} is not a region policy; choose from "
                 f"{', '.join(p for p in POLICIES if p != 'full')}")
    if dtype not in DTYPES:
        sys.exit(f"error: unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), dtype)
