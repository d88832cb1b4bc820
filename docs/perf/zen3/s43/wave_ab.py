# A token-step policy's prompt read chunk by chunk (`chunk`) or as a wavefront of pieces of N
# rows (engine.generation.WAVE_PIECE = N), or `full`'s prompt, interleaved rounds, compiled session with compiled
# prompt steps. python docs/perf/zen3/s43/wave_ab.py LENGTH POLICY chunk,64,128,256 [ROUNDS] [DTYPE]
import sys, time, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
torch.set_num_threads(2)
from caches import make_cache_factory
from engine import generation as G
from engine.checkpoint import load_model
from engine.default_model import resolve_checkpoint
from engine.tokenizer import load_tokenizer
n, policy, variants = int(sys.argv[1]), sys.argv[2], sys.argv[3].split(",")
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 2
dtype = getattr(torch, sys.argv[5]) if len(sys.argv) > 5 else torch.float32
model = load_model(resolve_checkpoint(None), dtype=dtype)
tok = load_tokenizer(resolve_checkpoint(None))
prompt = tok.encode(open(sys.path[0] + "/data/corpora/wiki.txt").read())[:n]
fac = make_cache_factory(policy, cache_size=256)
s = G.Session(model, fac, compile=True, compile_prefill=True, max_seq_length=n + 64)
full = G.Session(model, make_cache_factory("full"), compile=True, compile_prefill=True,
                 max_seq_length=n + 64) if "full" in variants else None
times = {v: [] for v in variants}
for r in range(rounds + 1):  # round 0 compiles
    for v in variants:
        G.BY_LAYER = v != "chunk"
        if v not in ("chunk", "full"):  # the piece itself, whatever layer_piece would take
            G.layer_piece = lambda caches, chunk, rows, n_layer, v=int(v): v
        run = full if v == "full" else s
        run.reset()
        t = time.perf_counter(); run.append(prompt); dt = time.perf_counter() - t
        print(f"round {r} {policy} {n} {v}: {dt:.2f} s", flush=True)
        if r:
            times[v].append(dt)
for v in variants:
    print(f"{policy} {n} {v}: median {sorted(times[v])[len(times[v]) // 2]:.2f} s  {times[v]}")
