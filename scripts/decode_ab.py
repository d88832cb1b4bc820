"""Probe: variants of the compiled CPU decode step on one session, measured interleaved.

    python scripts/decode_ab.py POLICY CONTEXT [DTYPE [VARIANTS]]   # e.g. full 1024 bfloat16

POLICY may carry `+int8`, an INT8 middle (--kv_middle int8): `weightedkv+int8`.

One session (budget 256 for a compressing POLICY, bulk prompt compression) reads a CONTEXT-token
prompt, then the variants take turns, 6 rounds of 24 decode steps each, so that every round
sees the machine in the same state:
    graph         the engine's step: one compiled graph a step, every block one nested region
                  in it, attention through fused reductions
    sdpa          the same with attention through SDPA / matmuls (model.REDUCE_ROWS = 0)
    regional      attention through reductions, but each block a compiled call of its own and
                  the final norm and head eager (oneDNN): the step before the one-graph step
    reorder       the engine's step compiled with Inductor's reorder_for_locality pass (on by
                  default; compile_decode turns it off since section 6e)
    asserts       the engine's step with Inductor's input size asserts (on by default;
                  compile_decode turns them off since section 6f)
    realize       the engine's step with realize_acc_reads_threshold=2: a pointwise result
                  read by a reduction is stored once instead of recomputed in its loop (the
                  normed activations of the linears and the head; section 6g)
    headout       the engine's step that also returns the final norm's output, which makes
                  Inductor store it once instead of recomputing it in the head's loop
    unstored      the engine's step without the norms' stored outputs, where the engine stores
                  them (bfloat16 without oneDNN: quantize.dense.STORE_NORMS; section 6n)
    customop      the engine's step with the norms' copies through torch.library.custom_op,
                  in the model dtype, as they were before section 6q
    onednn        the engine's step with every linear on oneDNN's packed kernel, none read as
                  a reduction over the plain weight (section 6x: on an AMX CPU oneDNN's
                  bfloat16 kernel streams faster; there the engine's own bfloat16 step since
                  6y, and this variant the same as "graph")
    unrolled      the engine's step with its blocks traced inline, not as nested regions
    cppwrap       unrolled, compiled with Inductor's cpp_wrapper: the graph's kernels and
                  extern calls driven from generated C++ instead of a Python wrapper (nested
                  regions are refused there)
    frozen        the step that --bake_weights compiles (engine.generation.baked_step): blocks
                  inline, the linears' weights baked in as constants, Inductor's C++ GEMM
                  template for each, each block's step through its cache one nested region
    frozeninline  frozen with the steps through the caches traced inline as well, as
                  --bake_weights compiled it before section 6zc
    reductions    the engine's step with its streamed linears as Inductor's reductions over the
                  plain weights instead of the GEMV kernel (kernels.LINEARS = False; the
                  engine's step before section 6zd where oneDNN has no faster kernel)
    attnreduce    the engine's step with attention's scores and mix as Inductor's reductions
                  instead of the attention kernels (kernels.ATTENTION = False; section 6zd)
    before6zd     both: the engine's step before section 6zd (with "onednn" where AMX is)
    pwcat         the engine's step with Inductor's force_pointwise_cat: every cat one
                  pointwise loop, not a buffer with a view of it per input (each a call of the
                  step's Python wrapper, per layer)
    allslots      the engine's step with the attention kernels over every stretch, however
                  short (kernels.ATTEND_SLOTS = 0; section 6zj: a 256-slot budget on AVX2)
    unfused       the engine's step with a long stretch's scores and mix as kernels of their
                  own and the softmax Inductor's between them, not one call of kernels.attend
                  (kernels.FUSED = False; the step before section 6zk)
    argmin        the engine's step with a compressing cache's free middle slot and victim
                  found by argmax / argmin and its count of middle tokens summed in int64,
                  not by mins over int32 slot numbers (the step before section 6zl;
                  weightedkv's right neighbour keeps its mins)
    smallpages    the engine's step with the weights that its GEMVs stream (every plain weight
                  and the embedding table) in copies of 4 KiB pages, not in the one mapping of
                  2 MiB pages that load_model moves them to (the step before section 6zm)
    serial        the engine's step with Inductor's own kernels generated for one thread
                  (cpp.threads = 1: no OpenMP region in them; the GEMV and attention kernels
                  keep both threads; section 6zn: slower)
    pool          the engine's step with Inductor's memory planning: a graph's buffers as
                  views of one pool allocated once a call, not an allocation each (the
                  wrapper's per-block buffers; section 6zw)
VARIANTS (comma-separated) picks some; "graph" always runs, as the reference.
Prints the median ms a step of each. Not part of the engine: docs/PERFORMANCE.md, sections 6c-6g,
record what it measured.
"""
import statistics
import sys
import types
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import model as M  # noqa: E402
import kernels  # noqa: E402
import quantize.dense as dense  # noqa: E402
import caches.region as region  # noqa: E402
from caches import POLICIES, make_cache_factory  # noqa: E402
from engine import generation as G  # noqa: E402
from engine.checkpoint import load_model  # noqa: E402
from engine.cli import DTYPES  # noqa: E402
from engine.default_model import resolve_checkpoint  # noqa: E402

VARIANTS = ("graph", "sdpa", "regional", "reorder", "asserts", "realize", "headout", "unstored",
            "customop", "onednn", "unrolled", "cppwrap", "frozen", "frozeninline",
            "reductions", "attnreduce", "before6zd", "pwcat", "allslots", "unfused", "argmin",
            "smallpages", "serial", "pool")


@torch.library.custom_op("decode_ab::stored", mutates_args=())
def custom_stored(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@custom_stored.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def argmax_first(mask: torch.Tensor) -> torch.Tensor:  # region.first_index before 6zl
    return mask.int().argmax(dim=-1)


def argmin_ties(score: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # argmin_oldest
    best = score.min(dim=-1, keepdim=True).values
    return torch.where(score == best, pos, region.FAR).argmin(dim=-1)


def sum_int64(self, valid, score, victim):  # RegionCache.must_remove before 6zl
    return valid.sum(-1) > self.middle


def run_step_out(model, idx, input_pos, caches):
    """The step as model.run, returning the final norm's output beside the logits."""
    x = model.tok_embeddings(idx)
    for layer, cache in zip(model.layers, caches):
        x = model.block_step(layer, x, input_pos, cache)
    h = model.norm(x)
    return model.output(h).float(), h


def main(policy: str, context: int, dtype: str, variants=VARIANTS) -> None:
    torch.set_num_threads(2)
    model = load_model(resolve_checkpoint(None), dtype=DTYPES[dtype])
    name, int8 = policy.removesuffix("+int8"), policy.endswith("+int8")
    factory = make_cache_factory("full") if name == "full" else \
        make_cache_factory(name, cache_size=256, prompt_compression="bulk",
                           kv_middle="int8" if int8 else "model")
    rounds, steps = 6, 24
    s = G.Session(model, factory, compile=True,
                  max_seq_length=context + (rounds + 1) * steps * len(variants) + 64)
    s.append(list(range(100, 100 + context)))  # token ids; their text does not matter for speed
    graph, nested = model.step_graph, model.block_step
    regional = torch.compile(G.run_block, fullgraph=True, dynamic=False)
    reorder = own_step_graph({**G.STEP_OPTIONS, "reorder_for_locality": True})
    asserts = own_step_graph({**G.STEP_OPTIONS, "size_asserts": True})
    realize = own_step_graph({**G.STEP_OPTIONS, "realize_acc_reads_threshold": 2})
    unstored, customop, engine_stored = own_step_graph(), own_step_graph(), dense.stored
    onednn, engine_streamed = own_step_graph(), dense.streamed
    reductions, attnreduce, before6zd = own_step_graph(), own_step_graph(), own_step_graph()
    pwcat = own_step_graph({**G.STEP_OPTIONS, "force_pointwise_cat": True})
    allslots, engine_slots = own_step_graph(), kernels.ATTEND_SLOTS
    unfused, argmin = own_step_graph(), own_step_graph()
    serial = own_step_graph({**G.STEP_OPTIONS, "cpp.threads": 1})
    pool = own_step_graph({**G.STEP_OPTIONS, "memory_planning": True})
    engine_region = region.first_index, region.argmin_oldest, region.RegionCache.must_remove
    unrolled, cppwrap = own_step_graph(), own_step_graph({**G.STEP_OPTIONS, "cpp_wrapper": True})
    streamed = [m for m in model.modules() if isinstance(m, dense.PackedLinear) and
                m.plain is not None and m.plain.data_ptr() != table(model).data_ptr()]
    huge = [m.plain for m in streamed] + [table(model).data]
    small = [t.clone() for t in huge]  # torch's allocator: 4 KiB pages
    frozen = G.baked_step(model)  # --bake_weights
    inline = torch.compile(run_all_inline, fullgraph=True, dynamic=False,
                           backend=model.baking_backend)

    def frozeninline(*args):
        with dense.baking():
            return inline(*args)
    out = torch.compile(run_step_out, fullgraph=True, dynamic=False, options=G.STEP_OPTIONS)

    def headout(*args):
        return out(*args)[0]

    def use(variant: str) -> None:
        M.REDUCE_ROWS = 0 if variant == "sdpa" else 16  # read when a graph is traced
        dense.STORE_NORMS = variant != "unstored"
        dense.stored = custom_stored if variant == "customop" else engine_stored
        dense.streamed = (lambda x: False) if variant == "onednn" else engine_streamed
        kernels.LINEARS = variant not in ("reductions", "before6zd")
        kernels.ATTENTION = variant not in ("attnreduce", "before6zd")
        kernels.ATTEND_SLOTS = 0 if variant == "allslots" else engine_slots
        kernels.FUSED = variant != "unfused"
        (region.first_index, region.argmin_oldest, region.RegionCache.must_remove) = \
            (argmax_first, argmin_ties, sum_int64) if variant == "argmin" else engine_region
        if variant == "before6zd" and dense._AMX and model.dtype == torch.bfloat16 and \
                model.layers[0].attention.wqkv.onednn:
            dense.streamed = lambda x: False  # oneDNN's bfloat16 linears, as then
        model.step_graph = {"regional": None, "reorder": reorder, "asserts": asserts,
                            "realize": realize, "headout": headout,
                            "unstored": unstored, "customop": customop,
                            "onednn": onednn, "unrolled": unrolled,
                            "cppwrap": cppwrap, "frozen": frozen,
                            "frozeninline": frozeninline,
                            "reductions": reductions, "attnreduce": attnreduce,
                            "before6zd": before6zd, "pwcat": pwcat,
                            "allslots": allslots, "unfused": unfused,
                            "argmin": argmin, "serial": serial,
                            "pool": pool}.get(variant, graph)
        pages = small if variant == "smallpages" else huge
        for m, w in zip(streamed, pages):
            m.plain = w
        table(model).data = pages[-1]
        if model.args.tie_embeddings and model.output.plain is not None:
            model.output.plain = pages[-1]
        model.block_step = {"regional": regional, "unrolled": G.run_block,
                            "cppwrap": G.run_block}.get(variant, nested)

    print(f"{policy}, context {context}, {dtype}, ms a decode step (median of {rounds} rounds)")
    interleave(s, variants, use, rounds, steps)
    use("graph")


def table(model):
    return model.tok_embeddings.weight


def run_all_inline(model, idx, input_pos, caches):
    return G.run_inline_step(model, idx, input_pos, caches, block=G.run_block)


def own_step_graph(options: dict = G.STEP_OPTIONS) -> Callable:
    """The engine's step compiled from a copy of its code, with these Inductor options (the
    engine's by default): dynamo keeps compiled graphs per code object, so this graph lives
    beside the engine's instead of replacing it."""
    code = G.run_step.__code__.replace()
    return torch.compile(types.FunctionType(code, G.run_step.__globals__), fullgraph=True,
                         dynamic=False, options=options)


def interleave(s: G.Session, variants, use, rounds: int, steps: int) -> None:
    """Each variant (after `use(variant)`) decodes `steps` steps from session s in turn, for
    `rounds` rounds, after a warm-up that compiles its graph; prints the median ms a step."""
    for v in variants:
        use(v)
        s.generate(4)
    ms = {v: [] for v in variants}
    for _ in range(rounds):
        for v in variants:
            use(v)
            g = s.generate(steps)
            ms[v].append(1000 * g.decode_s / (g.new_tokens - 1))
    for v, m in ms.items():
        print(f"{v:12s} {statistics.median(m):6.2f}   {' '.join(f'{x:.1f}' for x in m)}")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4, 5) or not sys.argv[2].isdigit():
        sys.exit("usage: python scripts/decode_ab.py POLICY CONTEXT [float32|bfloat16 [VARIANTS]]")
    dtype = sys.argv[3] if len(sys.argv) >= 4 else "float32"
    picked = ["graph"] + [v for v in sys.argv[4].split(",") if v != "graph"] \
        if len(sys.argv) == 5 else list(VARIANTS)
    if set(picked) - set(VARIANTS):
        sys.exit(f"error: unknown variant {sorted(set(picked) - set(VARIANTS))[0]!r}; choose "
                 f"from {', '.join(VARIANTS)}")
    if sys.argv[1].removesuffix("+int8") not in POLICIES:
        sys.exit(f"error: unknown policy {sys.argv[1]!r}; choose from {', '.join(POLICIES)}")
    if dtype not in DTYPES:
        sys.exit(f"error: unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    main(sys.argv[1], int(sys.argv[2]), dtype, picked)
