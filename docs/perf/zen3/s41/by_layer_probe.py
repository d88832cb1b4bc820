"""A prompt read layer by layer (Transformer.read_by_layer, pieces of 1,024) against chunk by
chunk through the model (prefill), eager, every policy's own commit (token steps included):
seconds, and the largest difference of the logits and of every cache buffer.
    python by_layer_probe.py POLICY MODE T"""
import sys, time, torch
from pathlib import Path
ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
from engine.default_model import default_checkpoint
from engine.checkpoint import load_model
from engine.tokenizer import load_tokenizer
from caches import make_cache_factory, build_caches
from engine.generation import prefill
torch.set_num_threads(2)
policy, mode, T, dt = sys.argv[1], sys.argv[2], int(sys.argv[3]), getattr(torch, sys.argv[4] if len(sys.argv) > 4 else "float32")
ck = default_checkpoint()
model = load_model(ck, dtype=dt)
tok = load_tokenizer(ck)
ids = tok.encode(open(ROOT / "data/corpora/wiki.txt").read()[:T * 8])[:T]
tokens = torch.tensor([ids])
chunk = 32
def run(by_layer, piece=1024):
    caches = build_caches(model, 1, T + 64, make_cache_factory(policy, cache_size=256, prompt_compression=mode))
    t = time.perf_counter()
    with torch.no_grad():
        if by_layer:
            for s in range(0, T, piece):
                out = model.read_by_layer(tokens[:, s:s + piece], torch.arange(s, s + piece), caches, chunk,
                                          out_idx=torch.tensor([piece - 1]))[:, -1]
        else:
            for s in range(0, T, chunk):
                out = prefill(model, caches, tokens[:, s:s + chunk].clone(), torch.arange(s, s + chunk), torch.tensor([chunk - 1]))
    return time.perf_counter() - t, out, caches
for rep in range(2):
    for bl in (False, True):
        dt_, out, caches = run(bl)
        print(f"{policy} {mode} by_layer={bl} {dt_:.2f} s", flush=True)
        if bl: b = (out, caches)
        else: a = (out, caches)
    err = (a[0] - b[0]).abs().max().item()
    st = max((x - y).abs().max().item() for ca, cb in zip(a[1], b[1]) for x, y in zip(ca.buffers(), cb.buffers()) if x.is_floating_point())
    print(" logits max diff", err, "argmax eq", a[0].argmax().item() == b[0].argmax().item(), "cache buffers max diff", st)
