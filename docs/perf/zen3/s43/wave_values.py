# The wavefront against chunk order on the default model's real weights: a wiki prompt read
# both ways (eager, float32), the last logits and every cache buffer compared.
# python docs/perf/zen3/s43/wave_values.py LENGTH POLICY[,POLICY...]
import sys, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
torch.set_num_threads(2)
from caches import make_cache_factory
from engine import generation as G
from engine.checkpoint import load_model
from engine.default_model import resolve_checkpoint
from engine.tokenizer import load_tokenizer
n = int(sys.argv[1])
model = load_model(resolve_checkpoint(None), dtype=torch.float32)
tok = load_tokenizer(resolve_checkpoint(None))
prompt = tok.encode(open(sys.path[0] + "/data/corpora/wiki.txt").read())[:n]
for policy in sys.argv[2].split(","):
    out = {}
    for by_layer in (False, True):
        G.BY_LAYER = by_layer
        s = G.Session(model, make_cache_factory(policy, cache_size=256), max_seq_length=n + 8)
        s.append(prompt)
        out[by_layer] = (s.logits.clone(), [c.state() for c in s.caches])
    (la, ca), (lb, cb) = out[False], out[True]
    diff = max((a[k].float() - b[k].float()).abs().max().item() for a, b in zip(ca, cb) for k in a)
    same_pos = all(torch.equal(a["pos"], b["pos"]) for a, b in zip(ca, cb))
    print(f"{policy} {n}: piece {G.layer_piece(s.caches, 32, n // 32 * 32, len(model.layers))}, "
          f"logits max |diff| {(la - lb).abs().max().item():.2e}, argmax equal "
          f"{bool((la.argmax(-1) == lb.argmax(-1)).all())}, cache buffers max |diff| {diff:.2e}, "
          f"same positions kept {same_pos}", flush=True)
