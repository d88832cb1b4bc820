"""Probe (PERFORMANCE 6zc): the 150 block linears of the default model's shapes at one row,
bfloat16, random weights, 2 threads, weights as inputs of the compiled code (as in the engine's
unbaked step), read two ways:

    PYTHONPATH=. python docs/perf/xeon/s53/linears_probe.py independent|chain VARIANTS

independent: every linear reads the same input (one per input width), one compiled function;
  VARIANTS of rowmajor (the engine's reduction over the plain [N, K] weight), blockedB (the
  weight as [N/B, K, B], reduced over K), onednn (the engine's regionkv::packed_linear, eager)
chain: blocks as the model chains them (qkv -> o + x -> w1, w3 -> silu * -> w2 + h), one compiled
  call a block; VARIANTS of red (reductions), onednn (packed_linear), bmm (Inductor's C++ bmm
  template over a [K, N] weight at 2 rows: at one row Inductor turns a bmm into a reduction)
Prints ms a pass and the weights' bytes read per second (L=blocks, 30 by default).
"""
import os
import sys
import time

import torch

import quantize.dense  # noqa: F401  (registers regionkv::packed_linear)

torch.set_num_threads(2)
dt = torch.bfloat16
D, F, L = 576, 1536, int(os.environ.get("L", 30))
SHAPES = [(960, D), (D, D), (F, D), (F, D), (D, F)]
g = torch.Generator().manual_seed(0)
Ws = [(torch.randn(n, k, generator=g) * 0.02).to(dt) for _ in range(L) for n, k in SHAPES]
NBYTES = sum(w.numel() * w.element_size() for w in Ws)


def timed(name: str, fn, *args) -> None:
    t = time.perf_counter()
    fn(*args)
    compile_s = time.perf_counter() - t
    runs = []
    for _ in range(9):
        t = time.perf_counter()
        for _ in range(10):
            fn(*args)
        runs.append((time.perf_counter() - t) / 10)
    ms = sorted(runs)[4]
    print(f"{name:10s} first call {compile_s:5.1f} s  {ms * 1e3:6.2f} ms  "
          f"{NBYTES / ms / 1e9:5.1f} GB/s", flush=True)


def reduce(x, w):
    return (w.float() * x.float().unsqueeze(-2)).sum(-1).to(dt)


def packed(x, p):
    return torch.ops.regionkv.packed_linear(x, p, p.size(0))


def independent(variants) -> None:
    xs = {k: torch.randn(1, k, generator=g).to(dt) for k in (D, F)}
    for v in variants:
        if v == "rowmajor":
            timed(v, torch.compile(lambda xs, ws: [reduce(xs[w.shape[1]], w) for w in ws]), xs, Ws)
        elif v.startswith("blocked"):  # blocked16, blocked32, ...
            b = int(v[len("blocked"):])

            def blocked(xs, ws):
                return [(w.float().unsqueeze(0) * xs[w.shape[1]].float().view(1, 1, -1, 1))
                        .sum(-2).reshape(1, -1).to(dt) for w in ws]
            wb = [w.view(w.shape[0] // b, b, w.shape[1]).transpose(1, 2).contiguous() for w in Ws]
            timed(v, torch.compile(blocked), xs, wb)
        elif v == "onednn":
            pk = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in Ws]
            timed(v, lambda: [packed(xs[w.shape[1]], p) for w, p in zip(Ws, pk)])


def chain(variants) -> None:
    def make_block(lin):
        def block(x, w):
            a = lin(x, w[0])[..., :D].contiguous()
            o = lin(a, w[1]) + x
            h = (torch.nn.functional.silu(lin(o, w[2]).float()) * lin(o, w[3]).float()).to(dt)
            return lin(h, w[4]) + o
        return block

    for v in variants:
        if v == "bmm":
            lin, ws, rows = (lambda x, wt: torch.bmm(x, wt.unsqueeze(0))), \
                [w.t().contiguous() for w in Ws], 2
            opts = {"max_autotune": True, "max_autotune_gemm_backends": "CPP"}
        else:
            lin, ws, rows, opts = {"red": (reduce, Ws, 1, {}), "onednn": (
                packed, [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in Ws], 1, {})}[v]
        step = torch.compile(make_block(lin), options=opts)
        blocks = [ws[i:i + 5] for i in range(0, len(ws), 5)]
        x0 = torch.randn(1, rows, D, generator=g).to(dt)

        def run(x):
            for w in blocks:
                x = step(x, w)
            return x
        timed(v, run, x0)


if __name__ == "__main__":
    {"independent": independent, "chain": chain}[sys.argv[1]](sys.argv[2].split(","))
