# One stacked chunk step (update, attention, commit; compiled) and its 32 token steps, by the
# stack's height (layers at work), weightedkv at a budget of 256 on the default model.
# [POLICY=weightedkv] [DTYPE=float32] python docs/perf/zen3/s43/stack_step.py compiled|static|eager [HEIGHTS]
import sys, time, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
torch.set_num_threads(2)
from caches import make_cache_factory, build_caches
from engine import generation as G
from engine.checkpoint import load_model
from engine.default_model import resolve_checkpoint
from model import through_cache
import os
model = load_model(resolve_checkpoint(None), dtype=getattr(torch, os.environ.get("DTYPE", "float32")))
mode = sys.argv[1]  # eager / compiled / static (compiled, a graph for each height: no marks)
if mode == "static":
    torch._dynamo.maybe_mark_dynamic = lambda *a: None
caches = build_caches(model, 1, 4200, make_cache_factory(os.environ.get("POLICY", "weightedkv"), cache_size=256))
G.compile_decode(lambda *a: None, model, caches=caches)
G.compile_prompt(model)
step = through_cache if mode == "eager" else model.chunk_step
a = model.args
torch.manual_seed(0)
def run(height, at):
    own = list(caches[:height])
    stack = own[0] if height == 1 else own[0].stacked(own)
    pos = torch.arange(at, at + 32).expand(height, 32).contiguous()
    q = torch.randn(height, a.n_head, 32, a.head_dim, dtype=model.dtype); k = torch.randn(height, a.n_kv_heads, 32, a.head_dim, dtype=model.dtype); v = torch.randn_like(k)
    if height > 1:
        for t in (pos, q, k, v): torch._dynamo.maybe_mark_dynamic(t, 0)
    t0 = time.perf_counter()
    with torch.inference_mode():
        step(stack, pos, q, k, v)
    t1 = time.perf_counter()
    stack.settle([stack], pos)
    t2 = time.perf_counter()
    if height > 1: stack.unstack(own)
    return t1 - t0, t2 - t1
with torch.inference_mode():
    for at in range(0, 512, 32):  # fill
        for h in (1, 4, 16): run(h, at)
    for h in [int(h) for h in sys.argv[2].split(",")] if len(sys.argv) > 2 else (1, 2, 4, 8, 16, 30):
        ts = [run(h, 512 + 32 * i) for i in range(10)]
        st = sorted(x[0] for x in ts)[5]; tt = sorted(x[1] for x in ts)[5]
        print(f"{mode} height {h}: chunk step {st*1e3:.2f} ms, token steps {tt*1e3:.2f} ms ({tt/32*1e3:.3f} a step)", flush=True)
