# Where a compiled chunked prompt's time goes on this CPU: settle (every layer's token steps,
# stacked) against the rest. python docs/perf/zen3/s42/token_step_split.py N POLICIES
import sys, time, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
torch.set_num_threads(2)
from caches import make_cache_factory
from caches.region import RegionCache
from engine import generation as G
from engine.checkpoint import load_model
from engine.default_model import resolve_checkpoint
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
model = load_model(resolve_checkpoint(None), dtype=torch.float32)
ids = open(sys.path[0] + "/data/corpora/wiki.txt").read()
from engine.tokenizer import load_tokenizer
tok = load_tokenizer(resolve_checkpoint(None))
prompt = tok.encode(ids)[:n]
acc = {"settle": 0.0, "calls": 0, "steps": 0.0}
orig_settle, orig_steps = RegionCache.settle, RegionCache.token_steps
def settle(self, waiting, input_pos):
    if torch.compiler.is_compiling():
        return orig_settle(self, waiting, input_pos)
    t = time.perf_counter(); orig_settle(self, waiting, input_pos); acc["settle"] += time.perf_counter() - t
def token_steps(self, input_pos):
    if torch.compiler.is_compiling():
        return orig_steps(self, input_pos)
    t = time.perf_counter(); orig_steps(self, input_pos); acc["steps"] += time.perf_counter() - t; acc["calls"] += input_pos.shape[1]
RegionCache.settle, RegionCache.token_steps = settle, token_steps
for policy in sys.argv[2].split(","):
    fac = make_cache_factory(policy, cache_size=256) if policy != "full" else make_cache_factory("full")
    s = G.Session(model, fac, compile=True, compile_prefill=True, max_seq_length=n + 64)
    s.warmup() if hasattr(s, "warmup") else None
    for rep in range(2):
        s.reset() if hasattr(s, "reset") else None
        acc.update(settle=0.0, calls=0, steps=0.0)
        t = time.perf_counter(); s.append(prompt); total = time.perf_counter() - t
        print(f"{policy} {n}: prompt {total:.2f} s, settle {acc['settle']:.2f} s, token_steps {acc['steps']:.2f} s over {acc['calls']} token steps", flush=True)
