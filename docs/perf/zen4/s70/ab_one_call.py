"""Probe (PERFORMANCE 6zt): `quantized`'s view attended as before (the INT8 middle through the
attend kernel, the fast stretch through Inductor's loops, the two combined by their
log-sum-exps in the graph) against now (one attend call over both), in turns in one process,
`full` beside them.   ROUNDS=8 PYTHONPATH=. python docs/perf/zen4/s70/ab_one_call.py DTYPE CTX
"""
import math, os, statistics, sys
import torch
sys.path.insert(0, "docs/perf/zen3/s46")
import kernels  # noqa: E402
import model  # noqa: E402
from single_session import warm_session  # noqa: E402

engine_attend = model.attend


def before(view, need_probs):
    """model.attend's fused branch as it was: each stretch its own part."""
    q, segments, mask = view
    B, H, T, D = q.shape
    Hkv = segments[0].k.shape[1]
    qg = q.reshape(B, Hkv, H // Hkv * T, D)
    if need_probs or not any(s.fuses(qg, s.k.shape[2]) for s in segments):
        return None
    parts = []
    for seg, m in zip(segments, mask.split([s.k.shape[2] for s in segments], dim=-1)):
        if seg.fuses(qg, seg.k.shape[2]):
            parts.append(kernels.attend(qg, seg.k, seg.v, m, 1 / math.sqrt(D), seg.k_scale,
                                        seg.v_scale))
            continue
        s = (seg.scores(qg) / math.sqrt(D)).masked_fill(~model.fold(m, qg.shape[-2] // m.shape[-2]),
                                                        float("-inf"))
        top = s.amax(-1, keepdim=True)
        top = torch.where(top == float("-inf"), 0.0, top)
        e = torch.exp(s - top)
        total = e.sum(-1, keepdim=True)
        parts.append((torch.where(total > 0, seg.mix(e) / total, 0.0),
                      (top + total.log()).squeeze(-1)))
    y = parts[0][0]
    if len(parts) > 1:
        lse = torch.stack([lse for _, lse in parts])
        w = torch.exp(lse - lse.amax(0)).unsqueeze(-1)
        y = sum(wi * yi for wi, (yi, _) in zip(w, parts)) / w.sum(0)
    return y.to(q.dtype).view(B, H, T, D), None


def attend(view, need_probs=False):
    if model.PROBE_OLD:
        out = before(view, need_probs)
        if out is not None:
            return out
    return engine_attend(view, need_probs)


model.PROBE_OLD = False
model.attend = attend
dtype, ctx = sys.argv[1], int(sys.argv[2])
rounds = int(os.environ.get("ROUNDS", "8"))
full = warm_session("full", dtype, ctx, rounds * 3 * 24 + 50)
q = warm_session("quantized", dtype, ctx, rounds * 3 * 24 + 50)
model.PROBE_OLD = True
q.generate(4)  # compiles the variant
res = {}
for r in range(rounds):
    order = [("full", False), ("q", True), ("q", False)]
    for name, old in (order if r % 2 == 0 else order[::-1]):
        model.PROBE_OLD = old
        g = (full if name == "full" else q).generate(24)
        res.setdefault((name, old), []).append(1000 * g.decode_s / (g.new_tokens - 1))
f = statistics.median(res[("full", False)])
for key, xs in res.items():
    m = statistics.median(xs)
    label = "full" if key[0] == "full" else ("quantized before" if key[1] else "quantized now")
    print(f"{label:17s} {dtype} {ctx}: {m:6.2f} ms a step, full/it {f / m:.3f}  "
          f"{[round(x, 2) for x in xs]}")
