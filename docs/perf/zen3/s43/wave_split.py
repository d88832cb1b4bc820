# Where a wavefront prompt's time goes: the chunk steps (update, attention, commit; compiled),
# settle (the stacked token steps and the stack's copies) and the rest (linears, norms).
# python docs/perf/zen3/s43/wave_split.py LENGTH POLICY PIECE[,PIECE...]
import sys, time, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
torch.set_num_threads(2)
from caches import make_cache_factory
from caches.region import RegionCache
from engine import generation as G
from engine.checkpoint import load_model
from engine.default_model import resolve_checkpoint
from engine.tokenizer import load_tokenizer
n, policy, pieces = int(sys.argv[1]), sys.argv[2], [int(p) for p in sys.argv[3].split(",")]
model = load_model(resolve_checkpoint(None), dtype=torch.float32)
tok = load_tokenizer(resolve_checkpoint(None))
prompt = tok.encode(open(sys.path[0] + "/data/corpora/wiki.txt").read())[:n]
acc = dict.fromkeys(("settle", "steps", "chunk_step", "step_calls", "settles"), 0.0)
orig_settle, orig_steps = RegionCache.settle, RegionCache.token_steps
def settle(self, waiting, input_pos):
    t = time.perf_counter(); orig_settle(self, waiting, input_pos)
    acc["settle"] += time.perf_counter() - t; acc["settles"] += 1
def token_steps(self, input_pos):
    t = time.perf_counter(); orig_steps(self, input_pos)
    acc["steps"] += time.perf_counter() - t; acc["step_calls"] += input_pos.shape[1]
RegionCache.settle, RegionCache.token_steps = settle, token_steps
s = G.Session(model, make_cache_factory(policy, cache_size=256), compile=True,
              compile_prefill=True, max_seq_length=n + 64)
step = model.chunk_step
def chunk_step(*a):
    t = time.perf_counter(); y = step(*a); acc["chunk_step"] += time.perf_counter() - t
    return y
model.chunk_step = chunk_step
for rep in range(3):
    for piece in pieces:
        G.layer_piece = lambda caches, chunk, rows, n_layer, v=piece: v
        s.reset()
        for k in acc:
            acc[k] = 0.0
        t = time.perf_counter(); s.append(prompt); total = time.perf_counter() - t
        print(f"{policy} {n} piece {piece} (round {rep}): prompt {total:.2f} s, chunk steps "
              f"{acc['chunk_step']:.2f} s, settle {acc['settle']:.2f} s ({acc['settles']:.0f} "
              f"calls; token steps {acc['steps']:.2f} s over {acc['step_calls']:.0f}), rest "
              f"{total - acc['chunk_step'] - acc['settle']:.2f} s", flush=True)
