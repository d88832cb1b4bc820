"""Probe: decode attention over a static K/V buffer, four ways, for the GPU's bandwidth gap.

    python scripts/attention_probe.py [--device cuda] [--contexts 1024,4096] [--shapes 8b|135m]
                                      [--model CKPT] [--parts 1,2]

A decode step attends one query a head over the whole static buffer with a mask (empty and
future slots masked). SDPA's kernels that take a mask split their work by row, head and block
of queries: 8 blocks of work for Llama-3-8B's shapes on a GPU with 132 multiprocessors, which
would explain attention's ~120 GB/s there (docs/PERFORMANCE.md, sections 7-7c). Since 7d the
engine splits the slots on CUDA instead. The variants, each behind the engine's
`attend` signature:
    engine   the engine's attend as it is (split-K on CUDA, model.SPLIT_SLOTS; reductions on
             the CPU's compiled step)
    sdpa     the engine's attend without split-K: SDPA with the mask on CUDA
    reduce   the engine's attention as reductions (its CPU path), on any device
    splitk   the engine's split-K path on any device (model.split_attend, SPLIT slots): the
             slots cut into chunks, each chunk's max, sum and weighted values (matmuls in the
             model dtype, one batch over the chunks), then combined by their maxima
    flex     torch's flex_attention, the mask as a score_mod (FlexDecoding on CUDA)

Part 1: the shapes' layers of random K/V at each context (the buffer holds context + 65
slots, as bench.py's), one compiled function a variant that attends every layer once (a CUDA
graph on CUDA); prints us a layer, the K/V read rate, each variant's largest difference from a
float64 reference and, on CUDA, its three costliest GPU kernels.
Part 2 (--model CKPT): `full` decoding on CKPT through the engine with each variant, as
bench.py's row (`bench_engine`: ms a step, median of 2 runs of 64 steps) and its share of the
bandwidth that bench.py measures.
Not part of the engine; what it measured goes in docs/PERFORMANCE.md.
"""
import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import model as M  # noqa: E402
from bench import int_list  # noqa: E402
from engine.cli import positive_int  # noqa: E402
from engine.runtime.generation import sync  # noqa: E402

SPLIT = 256  # slots a chunk in splitk
VARIANTS = ("engine", "sdpa", "reduce", "splitk", "flex")
SHAPES = {"8b": dict(heads=32, kv_heads=8, head_dim=128, layers=32),
          "135m": dict(heads=9, kv_heads=3, head_dim=64, layers=30)}


def flex(q, k, v, mask):
    from torch.nn.attention.flex_attention import flex_attention
    G = mask.shape[1]

    def score_mod(score, b, h, qi, kv):  # h: a query head; mask rows are KV heads or one
        return torch.where(mask[b, h // (q.shape[1] // G), qi, kv], score, float("-inf"))
    return flex_attention(q, k, v, score_mod=score_mod, enable_gqa=q.shape[1] != k.shape[1])


ENGINE_ATTEND, ENGINE_REDUCES, ENGINE_REDUCE_ROWS = M.attend, M.reduces, M.REDUCE_ROWS
ENGINE_SPLIT = dict(M.SPLIT_SLOTS)


def use(variant: str):
    """Set the model's attention to `variant` (read when a step is traced); returns `attend`."""
    M.attend, M.reduces, M.SPLIT_SLOTS, M.REDUCE_ROWS = (ENGINE_ATTEND, ENGINE_REDUCES,
                                                         ENGINE_SPLIT, ENGINE_REDUCE_ROWS)
    if variant == "sdpa":
        M.SPLIT_SLOTS = {}
    elif variant == "reduce":  # the CPU's rule, on any device
        M.reduces = lambda q, int8: torch.compiler.is_compiling() and (
            int8 or q.shape[-2] <= M.REDUCE_ROWS)
    elif variant == "splitk":  # the engine's split-K path (model.split_attend)
        M.SPLIT_SLOTS, M.REDUCE_ROWS = {"cpu": SPLIT, "cuda": SPLIT}, 0
    elif variant == "flex":
        M.attend = flex_attend
    return M.attend


def flex_attend(view, need_probs=False):
    """The decode case (one float segment with a mask, no probabilities) through flex; the rest
    through the engine's attend."""
    q, segments, mask = view
    if need_probs or mask is None or len(segments) != 1 or segments[0].k_scale is not None:
        return ENGINE_ATTEND(view, need_probs)
    return flex(q, segments[0].k, segments[0].v, mask).to(q.dtype), None


def last_line(e: Exception) -> str:
    """The innermost error's message: a compile failure wraps it in lines of advice."""
    lines = [x for x in str(e).splitlines() if x.strip()]
    named = [x for x in lines if x.split(":")[0].endswith(("Error", "Exception"))]
    return (named or lines or [""])[-1][:200]


def top_kernels(f, q, device) -> str:
    """On CUDA, the three GPU kernels that take the most time in a call (which SDPA kernel the
    engine's variant gets)."""
    if device.type != "cuda":
        return ""
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            f(q)
            sync(device)
    except Exception as e:  # the probe's figures stand without the names
        return f"  (profiler: {last_line(e)})"
    ev = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[:3]
    return "  " + "; ".join(f"{e.key[:60]} {e.self_device_time_total:.0f}us" for e in ev)


def part1(args, shape, device, dtype) -> None:
    H, Hkv, D, L = shape["heads"], shape["kv_heads"], shape["head_dim"], shape["layers"]
    print(f"part 1: attention alone, {L} layers, {H} heads ({Hkv} KV), head_dim {D}, {dtype}")
    print(f"{'context':>8} {'variant':>8} {'us/layer':>9} {'GB/s':>8} {'max diff':>9}")
    g = torch.Generator(device="cpu").manual_seed(0)
    for ctx in args.contexts:
        S = ctx + 65
        ks = [torch.randn(1, Hkv, S, D, generator=g).to(device, dtype) for _ in range(L)]
        vs = [torch.randn(1, Hkv, S, D, generator=g).to(device, dtype) for _ in range(L)]
        q = torch.randn(1, H, 1, D, generator=g).to(device, dtype)
        pos = torch.arange(S, device=device).view(1, 1, S)
        pos = torch.where(pos <= ctx, pos, -1)  # the slots after the query's are empty
        mask = ((pos <= ctx) & (pos >= 0)).unsqueeze(-2)  # [1, 1, 1, S]
        kv_bytes = 2 * L * ks[0].numel() * ks[0].element_size()
        ref = M.attend(M.KVView(q.double(), [M.KVSegment(ks[0].double(), vs[0].double())],
                                mask))[0]
        for variant in args.variants:
            attend = use(variant)

            def layers(q):
                return [attend(M.KVView(q, [M.KVSegment(k, v)], mask))[0] for k, v in zip(ks, vs)]
            torch.compiler.reset()
            f = torch.compile(layers, fullgraph=True, dynamic=False,
                              mode="reduce-overhead" if device.type == "cuda" else None)
            try:
                for _ in range(3):
                    y = f(q)
                sync(device)
                diff = (y[0].double() - ref).abs().max().item()
                runs = []
                for _ in range(5):
                    t0 = time.perf_counter()
                    for _ in range(args.iters):
                        f(q)
                    sync(device)
                    runs.append((time.perf_counter() - t0) / args.iters)
                kernels = top_kernels(f, q, device)  # while the variant is the one traced
            except Exception as e:  # a variant a backend cannot compile: say so, go on
                print(f"{ctx:>8} {variant:>8} failed: {type(e).__name__}: {last_line(e)}")
                continue
            finally:
                use("engine")
            t = statistics.median(runs)
            print(f"{ctx:>8} {variant:>8} {t / L * 1e6:9.1f} {kv_bytes / t / 1e9:8.1f} "
                  f"{diff:9.2e}{kernels}", flush=True)


def part2(args, device, dtype) -> None:
    import bench
    from caches import make_cache_factory
    from engine.loading.checkpoint import load_model
    from engine.loading.default_model import resolve_checkpoint
    path = resolve_checkpoint(args.model)
    model = load_model(path, dtype=dtype, device=device)
    runs = argparse.Namespace(new_tokens=64, repeats=2, compile_prefill=False)
    print(f"part 2: full decode on {path}, {dtype}, bench.py's row (64 steps, median of 2)")
    bandwidth = bench.machine_bandwidth_gbs(device)
    print(f"measured bandwidth {bandwidth:.0f} GB/s")
    print(f"{'context':>8} {'variant':>8} {'ms/step':>8} {'GB/s':>7} {'% bw':>5} {'compile s':>9}")
    for ctx in args.contexts:
        prompt = [100 + i % 1000 for i in range(ctx)]
        for variant in args.variants:
            use(variant)  # read when the step is traced
            try:  # bench_engine compiles each row from scratch
                row = bench.bench_engine(model, "full", make_cache_factory("full"), {}, ctx,
                                         prompt, runs, True, device)
            except Exception as e:
                print(f"{ctx:>8} {variant:>8} failed: {type(e).__name__}: {last_line(e)}")
                continue
            finally:
                use("engine")
            print(f"{ctx:>8} {variant:>8} {row['decode_ms_per_token']:8.2f} "
                  f"{row['bandwidth_gbs']:7.0f} {100 * row['bandwidth_gbs'] / bandwidth:5.0f} "
                  f"{row['compile_s']:9.1f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--contexts", type=int_list("positive token counts"), default=[1024, 4096])
    p.add_argument("--shapes", default="8b", choices=tuple(SHAPES))
    p.add_argument("--parts", default="1,2", help="which parts to run (2 needs --model)")
    p.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS),
                   help=f"which of {','.join(VARIANTS)} to run")
    p.add_argument("--iters", type=positive_int, default=20, help="calls a timed run")
    p.add_argument("--model", help="a checkpoint for part 2 (full decode through the engine), "
                   "as bench.py's --checkpoint_path; 'default' for the default model")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this torch sees no GPU; run with --device cpu")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if device.type == "cpu":
        torch.set_num_threads(2)
    if "1" in args.parts:
        part1(args, SHAPES[args.shapes], device, dtype)
    if args.model and "2" in args.parts:
        args.model = None if args.model == "default" else args.model
        part2(args, device, dtype)


if __name__ == "__main__":
    main()
