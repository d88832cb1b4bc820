"""Probe (PERFORMANCE 6zf): where a one-shot prompt's first token goes (POLICY, default
`quantized`; 4k tokens, --prompt_compression snapkv, budget 256, a session of 4,300 positions,
so that `quantized`'s middle holds every prompt token), split into the read itself and the
pieces of the compression:

    python docs/perf/xeon/s56/snap_time.py DTYPE [POLICY]     # e.g. bfloat16 h2o

Prints each of three reads' first-token seconds and the seconds in each timed function.
"""
import sys, time, collections, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
import caches.snapkv as S
from caches.region import RegionCache
import engine.generation as G
from caches import make_cache_factory
from engine.checkpoint import load_model
from engine.cli import DTYPES
from engine.default_model import resolve_checkpoint
torch.set_num_threads(2)
T = collections.defaultdict(float)
def timed(name, fn):
    def w(*a, **k):
        t = time.perf_counter(); r = fn(*a, **k); T[name] += time.perf_counter() - t; return r
    return w
S.observation_votes = timed("votes", S.observation_votes)
S.keep_middle = timed("keep", S.keep_middle)
RegionCache.load_prompt = timed("load_prompt", RegionCache.load_prompt)
S.PromptCapture.__init__ = timed("capture_init", S.PromptCapture.__init__)
S.prefill_whole = timed("prefill_whole", S.prefill_whole)
G.prefill_whole = S.prefill_whole if hasattr(G, "prefill_whole") else None
dtype = sys.argv[1]
model = load_model(resolve_checkpoint(None), dtype=DTYPES[dtype])
policy = sys.argv[2] if len(sys.argv) > 2 else "quantized"
f = make_cache_factory(policy, cache_size=256, prompt_compression="snapkv")
gen = G.Generator(model, 4300, make_cache=f, compile=True)
gen.warmup(0.0, None)
prompt = [100 + (i * 7919) % 40000 for i in range(4096)]
for i in range(3):
    T.clear()
    g = gen.generate(prompt, 2, temperature=0.0)
    print(round(g.prefill_s, 3), {k: round(v, 3) for k, v in T.items()})
