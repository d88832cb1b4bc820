"""read_prompt with BY_LAYER on/off (eager, or compiled chunks): first-token seconds at T."""
import sys, time, torch
from pathlib import Path
ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
from engine.default_model import default_checkpoint
from engine.checkpoint import load_model
from engine.tokenizer import load_tokenizer
from caches import make_cache_factory, build_caches
import engine.generation as G
torch.set_num_threads(2)
policy, mode, T = sys.argv[1], sys.argv[2], int(sys.argv[3])
variants = sys.argv[4].split(",")  # layer, chunk, compiled
pieces = [int(x) for x in sys.argv[5].split(",")] if len(sys.argv) > 5 else [1024]
ck = default_checkpoint()
model = load_model(ck)
tok = load_tokenizer(ck)
ids = tok.encode(open(ROOT / "data/corpora/wiki.txt").read()[:T * 8])[:T]
tokens = torch.tensor([ids])
graph = None
def run(v, piece):
    global graph
    G.BY_LAYER = v == "layer"; G.PREFILL_PIECE = piece
    fn = G.prefill
    if v == "compiled":
        graph = graph or G.compile_prompt(model); fn = graph
    caches = build_caches(model, 1, T + 64, make_cache_factory(policy, cache_size=256, prompt_compression=mode))
    t = time.perf_counter()
    with torch.no_grad():
        out = G.read_prompt(model, caches, tokens, torch.zeros(1, 1, dtype=torch.long), T + 64, prefill_fn=fn, compiled=v == "compiled")
    return time.perf_counter() - t, out
if "compiled" in variants: run("compiled", 1024)  # compile outside the timing
ref = None
for rep in range(2):
    for v in variants:
        for piece in (pieces if v == "layer" else [0]):
            s, out = run(v, piece)
            ref = out if ref is None else ref
            print(f"{policy} {mode} T={T} {v} piece={piece}: {s:.2f} s  dlogits={(out-ref).abs().max().item():.2e}", flush=True)
