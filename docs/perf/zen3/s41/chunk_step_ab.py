"""First token of a T-token prompt (wall seconds), the bulk pass compiled as --compile does: `full`
(eager, causal), read layer by layer with each chunk step eager (`layer`) or compiled
(`layer-cstep`), or chunk by chunk through the compiled chunk graph (`compiled`).
    python chunk_step_ab.py POLICY MODE T VARIANTS"""
import sys, time, torch
from pathlib import Path
ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
from engine.default_model import default_checkpoint
from engine.checkpoint import load_model
from caches import make_cache_factory, build_caches
import engine.generation as G
import model as M
torch.set_num_threads(2)
policy, mode, T = sys.argv[1], sys.argv[2], int(sys.argv[3])
variants = sys.argv[4].split(",")
model = load_model(default_checkpoint())
tokens = torch.randint(100, 20000, (1, T), generator=torch.Generator().manual_seed(0))
cstep = torch.compile(M.through_cache, fullgraph=True, dynamic=False, options=G.COMPRESS_OPTIONS)
graph = None
def run(v):
    global graph
    caches = build_caches(model, 1, T + 64, make_cache_factory(policy, cache_size=256, prompt_compression=mode))
    G.compile_decode(G.decode_one_token, model, caches=caches)
    t = time.perf_counter()
    with torch.no_grad():
        if v == "full":
            caches = build_caches(model, 1, T + 64, make_cache_factory("full"))
            t = time.perf_counter()
            out = G.read_prompt(model, caches, tokens, torch.zeros(1, 1, dtype=torch.long), T + 64)
        elif v == "compiled":
            graph = graph or G.compile_prompt(model)
            G.BY_LAYER = False
            out = G.read_prompt(model, caches, tokens, torch.zeros(1, 1, dtype=torch.long), T + 64, prefill_fn=graph, compiled=True)
        else:
            step = cstep if v == "layer-cstep" else M.through_cache
            out = model.read_by_layer(tokens, torch.arange(T), caches, 32, torch.tensor([T-1]), step=step)[:, -1]
    return time.perf_counter() - t, out
for v in variants: run(v)
for rep in range(2):
    for v in variants:
        s, out = run(v)
        print(f"{policy} {mode} T={T} {v}: {s:.2f} s", flush=True)
