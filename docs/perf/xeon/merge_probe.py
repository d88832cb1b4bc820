"""Probe (PERFORMANCE 6y): weightedkv's bulk merge for one layer and chunk (3 heads, 385 slots,
128 victims, D = 64, random distinct positions), compiled, three ways: the one-hot
[victims x slots] sums that `remove_bulk` used at 6y, the right neighbour found by position
order instead (a full sort and a running min), and the neighbour by argmin with the sums by
scatter_add. 6z replaced the first in the engine by the merge by runs
(`WeightedKVCache.runs`; `chunk_probe.py` times it in the chunk step).

    python docs/perf/xeon/merge_probe.py
"""
import time

import torch

torch.set_num_threads(2)
FAR = 2**30
B, H, C, K, D = 1, 3, 385, 128, 64
g = torch.Generator().manual_seed(0)
pos = torch.stack([torch.randperm(4000, generator=g)[:C] for _ in range(H)]).view(B, H, C).int()
pos[..., -5:] = -1  # empty slots
victims = torch.stack([torch.randperm(C - 5, generator=g)[:K] for _ in range(H)]).view(B, H, K)
do = torch.rand(B, H, K, generator=g) < 0.9
s, v = torch.rand(B, H, C, generator=g), torch.randn(B, H, C, D, generator=g)


def later_survivors(pos, victims, do):  # as caches/region.py (CaM's bulk pass)
    gone = torch.zeros_like(pos, dtype=torch.bool).scatter(-1, victims, do)
    stays = (pos >= 0) & ~gone
    return stays.unsqueeze(2) & (pos.unsqueeze(2) > pos.gather(-1, victims).unsqueeze(-1))


def onehot_argmin(pos, victims, do):  # as caches/weightedkv.py had it at 6y
    later = later_survivors(pos, victims, do)
    r = torch.where(later, pos.unsqueeze(2), FAR).argmin(dim=-1, keepdim=True)
    return (torch.arange(C) == r) & do.unsqueeze(-1) & later.any(dim=-1, keepdim=True)


def onehot_sorted(pos, victims, do):
    gone = torch.zeros_like(pos, dtype=torch.bool).scatter(-1, victims, do)
    stays = (pos >= 0) & ~gone
    order = pos.topk(C, dim=-1, largest=False).indices  # slots by position
    idx = torch.arange(C)
    key = torch.where(stays.gather(-1, order), idx, C)
    nxt = key.flip(-1).cummin(-1).values.flip(-1)  # the first survivor at or after each place
    rank = torch.empty_like(order).scatter(-1, order, idx.expand_as(order))
    at = nxt.gather(-1, rank.gather(-1, victims))
    r = order.gather(-1, at.clamp(max=C - 1))
    return (idx == r.unsqueeze(-1)) & (do & (at < C)).unsqueeze(-1)


def sums_onehot(find):
    def f(pos, victims, do, s, v):
        into = find(pos, victims, do)
        w = into.float() * (s.gather(-1, victims) * do).unsqueeze(-1)
        num = w.transpose(-1, -2) @ v.gather(2, victims.unsqueeze(-1).expand(-1, -1, -1, D))
        return num, w.sum(2) + s, into.any(2)
    return f


def sums_scatter(pos, victims, do, s, v):
    later = later_survivors(pos, victims, do)
    r = torch.where(later, pos.unsqueeze(2), FAR).argmin(dim=-1)
    ok = do & later.any(dim=-1)
    s_j = torch.where(ok, s.gather(-1, victims), 0)
    v_j = v.gather(2, victims.unsqueeze(-1).expand(-1, -1, -1, D))
    num = torch.zeros_like(v).scatter_add(2, r.unsqueeze(-1).expand(-1, -1, -1, D),
                                          s_j.unsqueeze(-1) * v_j)
    return num, s.scatter_add(-1, r, s_j), torch.zeros_like(s).scatter_add(-1, r, ok.float()) > 0


args = (pos, victims, do, s, v)
runs = {"one-hot, argmin (6y)": sums_onehot(onehot_argmin),
        "one-hot, position order": sums_onehot(onehot_sorted), "scatter_add": sums_scatter}
outs = {}
for name, f in runs.items():
    c = torch.compile(f, fullgraph=True, dynamic=False)
    outs[name] = c(*args)
    for _ in range(20):
        c(*args)
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(300):
            c(*args)
        best = min(best, (time.perf_counter() - t) / 300)
    print(f"{name:26s} {best * 1e6:7.1f} us")
ref = outs["one-hot, argmin (6y)"]
for name, o in outs.items():
    print(f"{name:26s} max |num - 6y's| {(o[0] - ref[0]).abs().max():.2e}, "
          f"totals {(o[1] - ref[1]).abs().max():.2e}, merged slots equal {torch.equal(o[2], ref[2])}")
