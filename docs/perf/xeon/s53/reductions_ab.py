"""Probe (PERFORMANCE 6zc): scripts/decode_ab.py with bfloat16 linears read as reductions on an
AMX CPU (quantize.dense.STREAMED_DTYPES forced to every dtype) and, with `hooks`, the norms'
outputs stored for them on every block:

    PYTHONPATH=. python docs/perf/xeon/s53/reductions_ab.py POLICY CONTEXT bfloat16 VARIANTS [hooks]

graph: reductions (and stored norms with hooks); onednn: the engine's own step on AMX; the
other decode_ab variants as there.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "scripts"))
import quantize.dense as dense
dense.STREAMED_DTYPES = dense.DTYPES
import model as M
orig = dense.stream_compiled_decode
def patched(model):
    added = orig(model)
    if "hooks" in sys.argv[5:]:
        for layer in model.layers:
            for n in (layer.attention_norm, layer.ffn_norm):
                if dense._store_streamed_input not in n._forward_hooks.values():
                    n.register_forward_hook(dense._store_streamed_input)
        if dense._store_streamed_input not in model.norm._forward_hooks.values():
            model.norm.register_forward_hook(dense._store_streamed_input)
    return added
dense.stream_compiled_decode = patched
import engine.generation as G
for name in dir(G):
    if getattr(G, name) is orig:
        setattr(G, name, patched)
import decode_ab
decode_ab.main(sys.argv[1], int(sys.argv[2]), sys.argv[3], ["graph"] + sys.argv[4].split(","))
