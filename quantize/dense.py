"""Float linears in oneDNN's packed weight layout, for CPU decode.

    pack_dense_linears(model)    # on its final device and dtype: nn.Linear -> PackedLinear

A float32 or bfloat16 `F.linear` on CPU goes to a GEMM that re-reads the [N, K] weight with a
layout made for large M. At decode, M is the batch (1 to 4 rows), and on the CPUs of this pool
that GEMM runs the 545 MB Qwen head at 40 ms for one row and 89 ms for two, and two-row steps
cost twice one-row steps. oneDNN's inner-product kernel on a weight reordered once into its
blocked layout streams the weight near the memory bandwidth: 19 ms for one row, 24 ms for two
(docs/PERFORMANCE.md). The same results up to float rounding (summation order).

The packed weight is an opaque `torch._mkldnn` tensor. Inductor takes such a weight only as a
frozen constant, and the blocks share one compiled graph with their weights as inputs, so the
call goes through an op of the engine's own (`regionkv::packed_linear`) that compiled code
calls as it is.

    stream_compiled_decode(model)   # before compiling a decode step of at most 2 rows

Inside a compiled decode step, 150 small oneDNN calls a token each pay a fixed setup (~16 µs),
and oneDNN streams short rows at 14-20 GB/s. A compiled step of one or two rows reads a plain
copy of each block linear's weight instead (a tied head: the embedding table itself) through
the engine's own GEMV kernel (`kernels.gemv`: a band of rows a thread, prefetched; 23-31 GB/s
on machine C), float32 and bfloat16 alike. Where the kernels
do not build, the plain weight is read as a reduction (y = (W * x).sum(-1)) that Inductor
generates, fuses into the block's graph and splits over the threads, at 21-25 GB/s; on a CPU
with AMX, where oneDNN's bfloat16 kernel streams faster than that reduction,
bfloat16 linears then stay on oneDNN (`STREAMED_DTYPES`). Eager prompt
chunks and steps of more rows stay on oneDNN, faster there: `stream_compiled_decode` keeps the
plain copy next to the packed weight, memory for speed, only when a compiled few-row decode
asks for it.

A CPU without oneDNN's kernel for the dtype (AVX2-only CPUs have no bfloat16 one) keeps the
plain weight alone: its compiled few-row steps take the same kernel (or reduction), calls of 8
rows or more (prompt chunks) a float32 GEMM over the weight widened for the call, and the rest
F.linear.
ATen's own bfloat16 GEMM is 2.6-4.1x slower there at 32 rows and 4.4x at 1,024, while
widening costs more than it saves below 8 rows.
"""
from __future__ import annotations

import functools
import warnings
from contextlib import contextmanager
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from core import kernels
from core.memory import empty_on_huge_pages

DTYPES = (torch.float32, torch.bfloat16)
STREAM_ROWS = 2  # the reduction reads the weight once per row: from 4 rows on, oneDNN wins
# Without oneDNN (plain weights), from this many rows on a float32 GEMM over the weight widened
# for the call beats ATen's bfloat16 one on an AVX2-only CPU; below, widening costs more.
WIDEN_ROWS = 8
# Whether the norms before plain-only streamed linears store their output (read when a step is
# traced; scripts/decode_ab.py turns it off to measure the step without it).
STORE_NORMS = True
# The dtypes whose oneDNN linears a compiled few-row step reads as reductions: not bfloat16 on
# a CPU with AMX tiles, where oneDNN's kernel streams faster (machine B, AVX512-BF16 without
# AMX, measured the reverse: docs/PERFORMANCE.md, 6b).
_AMX = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
STREAMED_DTYPES = (torch.float32,) if _AMX else DTYPES

# True while a compiled step whose linear weights are baked into its graph runs (`baking`):
# its trace reads it, and dynamo guards on it, so that graph and the others never mix.
_BAKING = False


@contextmanager
def baking():
    global _BAKING
    _BAKING = True
    try:
        yield
    finally:
        _BAKING = False


def streamed(x: Tensor) -> bool:
    """Whether x, a linear's input, is read by a compiled step of at most STREAM_ROWS rows:
    where the plain weights stream as a reduction."""
    return torch.compiler.is_compiling() and x.numel() <= STREAM_ROWS * x.shape[-1]


def kerneled(x: Tensor, plain: Tensor) -> bool:
    """Whether x, a linear's input in a compiled step, goes through the GEMV kernel: up to
    GEMV_ROWS rows (a verify step's tokens too), the weight read once for all of them."""
    return torch.compiler.is_compiling() and x.dtype == plain.dtype and \
        x.numel() <= kernels.GEMV_ROWS * x.shape[-1] and kernels.serve_linears()


# The engine's own ops, defined on the dispatcher directly: a compiled step calls them from its
# wrapper in a few us, where torch.library.custom_op's Python layers took ~8-16
_LIB = torch.library.Library("regionkv", "DEF")

# regionkv::packed_linear(x, weight, out_features): x @ W^T with W in oneDNN's layout, opaque to
# Inductor (it takes such a weight only as a frozen constant).
_LIB.define("packed_linear(Tensor x, Tensor weight, int out_features) -> Tensor")
_LIB.impl("packed_linear", lambda x, weight, out_features: torch.ops.mkldnn._linear_pointwise(
    x, weight, None, "none", [], ""), "CompositeExplicitAutograd")
torch.library.register_fake(
    "regionkv::packed_linear",
    lambda x, weight, out_features: x.new_empty(*x.shape[:-1], out_features), lib=_LIB)


def packed_linear(x: Tensor, weight: Tensor, out_features: int) -> Tensor:
    return torch.ops.regionkv.packed_linear(x, weight, out_features)


# regionkv::unpacked(weight, out_features, in_features): the plain [out, in] weight of one in
# oneDNN's layout. In a step whose weights are baked in (baking_backend), Inductor folds
# it once, at compile time, into the weight its own GEMM kernel reads.
_LIB.define("unpacked(Tensor weight, int out_features, int in_features) -> Tensor")
_LIB.impl("unpacked", lambda weight, out_features, in_features: weight.to_dense(),
          "CompositeExplicitAutograd")
torch.library.register_fake(
    "regionkv::unpacked",
    lambda weight, out_features, in_features: weight.new_empty(out_features, in_features),
    lib=_LIB)


class PackedLinear(nn.Module):
    """y = x @ W^T (+ bias) with W held in oneDNN's layout, or (onednn=False: no kernel for
    the dtype on this CPU) plain only. Its state dict holds the plain weight, as nn.Linear's
    does (the checkpoint format, and what a peer model loads)."""

    def __init__(self, linear: nn.Linear, onednn: bool = True):
        super().__init__()
        w = linear.weight.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(w, None)
                             if onednn else None, persistent=False)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach())
        # stream_compiled_decode's copy; without oneDNN, the weight itself (a tied head's: the
        # embedding table)
        self.register_buffer("plain", None if onednn else w, persistent=False)

    @property
    def weight(self) -> Tensor:
        return self.packed.to_dense() if self.plain is None else self.plain

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"bias={self.bias is not None}, kernel={'onednn' if self.onednn else 'float32'}"

    @property
    def onednn(self) -> bool:
        return self.packed is not None

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        destination[prefix + "weight"] = self.weight
        if self.bias is not None:
            destination[prefix + "bias"] = self.bias

    def forward(self, x: Tensor) -> Tensor:
        if _BAKING and torch.compiler.is_compiling():  # a GEMM over the weight as a constant
            w = self.plain if self.plain is not None else torch.ops.regionkv.unpacked(
                self.packed, self.out_features, self.in_features)
            y = F.linear(x, w)
        elif self.plain is not None and kerneled(x, self.plain):
            y = kernels.gemv(x, self.plain)
        elif self.plain is not None and streamed(x):
            # float32 products summed in float32, rounded once, as oneDNN does
            y = (self.plain.float() * x.float().unsqueeze(-2)).sum(-1).to(x.dtype)
        elif self.onednn:
            y = packed_linear(x, self.packed, self.out_features)
        elif x.numel() >= WIDEN_ROWS * self.in_features:
            y = F.linear(x.float(), self.plain.float()).to(x.dtype)
        else:
            y = F.linear(x, self.plain)
        return y if self.bias is None else y + self.bias


# regionkv::exact_matmul(a, b): a.float() @ b.float() for bfloat16 a, b [..., M, K], [..., K, N]:
# float32 products and sums, which oneDNN computes from the bfloat16 values themselves when
# allowed to (its bf16 math mode, exact here: the inputs are bfloat16 already). On a CPU with AMX
# that takes attention's scores over a prompt chunk 2.4x faster than float32.
# The mode is global: set for the call only.
def _exact_matmul(a: Tensor, b: Tensor) -> Tensor:
    mode = torch.backends.mkldnn.matmul.fp32_precision
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    try:
        return a.float() @ b.float()
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = mode


_LIB.define("exact_matmul(Tensor a, Tensor b) -> Tensor")
_LIB.impl("exact_matmul", _exact_matmul, "CPU")
torch.library.register_fake(
    "regionkv::exact_matmul",
    lambda a, b: a.new_empty(*a.shape[:-1], b.shape[-1], dtype=torch.float32), lib=_LIB)


# From this many rows of a on, exact_matmul's call (the mode set and reset, oneDNN's reorders)
# costs less than the float32 product saves: 59 against 48 µs at 48 rows, 64 against 80 at 96
# (3 heads over 385 keys, machine C).
EXACT_ROWS = 64


def exact_matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b in float32 for a, b in the model dtype (same batch shape)."""
    if _AMX and a.dtype == b.dtype == torch.bfloat16 and a.device.type == "cpu" and \
            a.shape[-2] >= EXACT_ROWS:
        return torch.ops.regionkv.exact_matmul(a, b)
    return a.float() @ b.float()


# regionkv::stored(x): a copy that Inductor cannot inline (below); 61 calls a step.
_LIB.define("stored(Tensor x) -> Tensor")
_LIB.impl("stored", lambda x: x.clone(), "CPU")  # only CPU steps store norms
torch.library.register_fake("regionkv::stored", lambda x: torch.empty_like(x), lib=_LIB)


def stored(x: Tensor) -> Tensor:
    return torch.ops.regionkv.stored(x)


def _store_streamed_input(norm: nn.Module, args, out: Tensor) -> Tensor:
    # A forward hook on a norm whose output the streamed reductions read. Inductor inlines a
    # pointwise producer into the loop of each reduction that reads it, so every weight row
    # widens the activation and the norm weight again (3 bfloat16 loads and conversions for
    # 1); an opaque copy makes it store the row once. It pays where the cores bound the step
    # (machine A, bfloat16: 6-10% a step), not where the copy's call (61 a step) costs more
    if STORE_NORMS and streamed(out) and not kernels.serve_linears():  # a kernel stores it
        return stored(out)
    return out


def pack_dense_linears(model: nn.Module) -> nn.Module:
    """In place: every float nn.Linear on CPU becomes a PackedLinear: in oneDNN's layout if a
    probe against F.linear passes, else plain (a CPU or build without the kernel for the dtype:
    every bfloat16 linear on an AVX2-only CPU). A head tied to the embedding gets its own packed
    copy; the table stays."""
    if not torch.backends.mkldnn.is_available():
        return model
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is not nn.Linear or child.weight.device.type != "cpu" or \
                    child.weight.dtype not in DTYPES:
                continue
            try:
                packed = PackedLinear(child)
                _probe(child, packed)
            except RuntimeError:
                packed = PackedLinear(child, onednn=False)
            setattr(module, child_name, packed)
    return model


def stream_compiled_decode(model: nn.Module) -> int:
    """Keep a plain weight next to every PackedLinear of the model's blocks (a copy), and of a
    head tied to the embedding (the table itself), which a compiled step of at most
    STREAM_ROWS rows reads through the GEMV kernel (every dtype), or where it does not build
    as a reduction (the dtypes in STREAMED_DTYPES). An untied head stays on oneDNN: a copy of a
    large vocabulary's head costs more memory than its step saves. Without oneDNN for the
    dtype, the norms before those linears store their output once in such a step (a forward
    hook). Returns the bytes added."""
    dtypes = DTYPES if kernels.serve_linears() else STREAMED_DTYPES

    def streams(linear) -> bool:  # oneDNN's only, of a dtype that streams faster
        return isinstance(linear, PackedLinear) and linear.plain is None and \
            linear.packed.dtype in dtypes
    copied = [m for m in model.layers.modules() if streams(m)]
    homes = empty_on_huge_pages([((m.out_features, m.in_features), m.packed.dtype)
                                 for m in copied])
    added = 0
    for module, home in zip(copied, homes):
        module.plain = home.copy_(module.packed.to_dense())
        added += home.numel() * home.element_size()
    head, table = model.output, model.tok_embeddings.weight
    if model.args.tie_embeddings and streams(head) and table.dtype == head.packed.dtype:
        head.plain = table.detach()  # the same storage: no bytes added
    # Where oneDNN has no kernel for the dtype (bfloat16 on an AVX2-only CPU), the norms before
    # the streamed linears store their output for them (_store_streamed_input).
    def plain_only(linear):
        return isinstance(linear, PackedLinear) and not linear.onednn
    norms = [n for layer in model.layers if plain_only(layer.attention.wqkv)
             for n in (layer.attention_norm, layer.ffn_norm)]
    if plain_only(head):
        norms.append(model.norm)
    for norm in norms:
        if _store_streamed_input not in norm._forward_hooks.values():
            norm.register_forward_hook(_store_streamed_input)
    return added


def baking_backend(model: nn.Module, options: dict) -> Callable:
    """A torch.compile backend for a decode step that bakes the model's linear weights into the
    graph as constants (Inductor's freezing) and leaves every other input an input: the caches,
    which other code writes between steps. Over a constant weight Inductor's C++ GEMM template
    applies (max_autotune), a kernel generated into the graph for each linear's shape, with no
    call of its own and its weight packed once at compile time: on an AMX CPU it streams
    bfloat16 weights at about 25 GB/s where oneDNN's 151 calls a step pay 16 µs each. The graph
    holds its own packed copy of the weights:
    they must not change after it compiles (a new model gets its own backend and graph).
    `backend.baked` counts the inputs the last graph baked in, `backend.graphs` the graphs."""
    from torch._inductor.compile_fx import compile_fx
    patches = {**options, "freezing": True, "max_autotune": True,
               "max_autotune_gemm_backends": "CPP,ATEN",  # ATen's where no template fits
               "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}

    def backend(gm: torch.fx.GraphModule, example_inputs):
        weights = {id(t) for m in model.modules() if isinstance(m, PackedLinear)  # as they are now
                   for t in (m.packed, m.plain, m.bias) if t is not None}
        kept = []  # the inputs left: dynamo passes only these
        for i, (node, t) in enumerate(zip(list(gm.graph.find_nodes(op="placeholder")),
                                          example_inputs)):
            if id(t) not in weights:
                kept.append(t)
                continue
            gm.register_buffer(f"_baked{i}", t)  # an attribute, which freezing folds
            gm._param_name_to_source[f"_baked{i}"] = node._dynamo_source
            with gm.graph.inserting_before(node):
                node.replace_all_uses_with(gm.graph.get_attr(f"_baked{i}"))
            gm.graph.erase_node(node)
        gm.recompile()
        backend.baked = len(example_inputs) - len(kept)
        backend.graphs += 1
        with warnings.catch_warnings(), _templates_parsed_once():
            # Inductor's autotuner's own deprecated storage call
            warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
            return compile_fx(gm, kept, config_patches=patches)
    backend.graphs = 0
    return backend


@contextmanager
def _templates_parsed_once():
    """Inductor parses and compiles a kernel template's jinja source again on every render
    (torch 2.13): the 151 GEMMs of a baked step, rendered to be timed and then for good, spent
    11 of its 37 s of compile there. While this holds, one parse per source serves them all
    (a template's render keeps no state). Another Inductor's layout is left as it is."""
    from torch._inductor.codegen.common import KernelTemplate
    parse = KernelTemplate.__dict__.get("_template_from_string")
    if not isinstance(parse, staticmethod):
        yield
        return
    KernelTemplate._template_from_string = staticmethod(functools.lru_cache(None)(parse.__func__))
    try:
        yield
    finally:
        KernelTemplate._template_from_string = parse


def _probe(linear: nn.Linear, packed: PackedLinear) -> None:
    w = linear.weight.detach()
    x = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(0)).to(w.dtype)
    want, got = F.linear(x, w, linear.bias).float(), packed(x).float()
    err = (got - want).norm() / want.norm().clamp(min=1e-10)
    if not err < (1e-2 if w.dtype == torch.bfloat16 else 1e-5):
        raise RuntimeError(f"relative error {err:.3g} against F.linear")
