"""Tensor parallelism over torch.distributed: one model split over the ranks that torchrun starts.

Applied to a built model from outside (model.py knows nothing of it), as gpt-fast's tp.py does.
Rank r of N keeps:
    attention.wqkv   the rows of its H/N query heads and its Hkv/N KV heads (q, k, v kept apart,
                     bias included): column-parallel, no communication
    attention.wo     the columns of its query heads (row-parallel), then an all-reduce
    feed_forward.w1, w3   rows [r I/N, (r+1) I/N) (column-parallel)
    feed_forward.w2  the same columns (row-parallel), then an all-reduce
    tok_embeddings, norms, output head   replicated
and the caches of its own KV heads (build_caches reads the sharded model.args). Quantized
checkpoints shard their storage tensors (codes, scales, zeros) before packing.

A policy whose decision crosses heads (TOVA's head-averaged attention) sums over every rank's
heads through `KVShard.all_reduce`; CaM draws by global head index. Both are functional
collectives, so a compiled decode step stays one graph per rank. Every rank samples from the
same (replicated) logits with the same seed, so the ranks agree on every token.
"""
from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch import Tensor

from core.errors import UserError

TIMEOUT_S = float(os.environ.get("REGIONKV_TP_TIMEOUT", "300"))  # a rank that dies: no hang
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class TP:
    rank: int
    world: int
    group_name: str

    def all_reduce(self, x: Tensor) -> Tensor:
        import torch.distributed._functional_collectives as funcol
        return funcol.all_reduce(x, "sum", self.group_name)


@dataclass
class KVShard:
    """What a rank's cache knows of the layer's other KV heads."""
    tp: TP
    offset: int       # global index of this rank's first KV head
    total: int        # KV heads of the layer over all ranks

    def all_reduce(self, x: Tensor) -> Tensor:
        return self.tp.all_reduce(x)


class AllReduce(nn.Module):
    """A row-parallel linear: each rank's partial product, summed over the ranks."""

    def __init__(self, linear: nn.Module, tp: TP):
        super().__init__()
        self.linear, self.tp = linear, tp

    def forward(self, x: Tensor) -> Tensor:
        return self.tp.all_reduce(self.linear(x))


def from_env(device_type: str = "cpu") -> Optional[TP]:
    """The process group torchrun describes (gloo on CPU, NCCL on CUDA), or None when the
    process was not started by torchrun (or by torchrun with one process)."""
    env = os.environ
    if not any(k in env for k in ("RANK", "WORLD_SIZE")):
        return None
    missing = [k for k in TORCHRUN_ENV if k not in env]
    if missing:
        raise UserError(f"the torchrun environment is incomplete (no {', '.join(missing)}); "
                        f"launch with `torchrun --nproc_per_node N ...`")
    if int(env["WORLD_SIZE"]) == 1:
        return None
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=TIMEOUT_S))
    tp = TP(dist.get_rank(), dist.get_world_size(), dist.group.WORLD.group_name)
    if tp.rank != 0:  # rank 0 prints; the others only compute
        sys.stdout = open(os.devnull, "w")
    return tp


def start(device: torch.device) -> Optional[TP]:
    """Join the ranks torchrun started (None without torchrun) and check that every rank runs
    the same command."""
    tp = from_env(device.type)
    check_same_arguments(tp, sys.argv[1:])
    return tp


def check_same_arguments(tp: Optional[TP], argv: list) -> None:
    """Every rank must run the same command: compare a digest of the arguments."""
    if tp is None:
        return
    digest = hashlib.sha1("\0".join(argv).encode()).hexdigest()
    seen = [None] * tp.world
    dist.all_gather_object(seen, digest)
    if len(set(seen)) > 1:
        raise UserError("the ranks were started with different arguments; every rank must run "
                        "the same command (torchrun --nproc_per_node N SCRIPT ARGS)")


def shared_seed(tp: Optional[TP], seed: Optional[int]) -> Optional[int]:
    """The seed every rank uses: the given one, or one drawn on rank 0 and broadcast."""
    if tp is None:
        return seed
    box = [seed if seed is not None else int.from_bytes(os.urandom(7), "little")]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def check_divides(tp: Optional[TP], args, qconfig=None) -> None:
    """N must split the KV heads, the query heads and the MLP evenly (and int4's groups)."""
    if tp is None:
        return
    n = tp.world
    if args.n_kv_heads % n:
        divisors = [d for d in range(1, args.n_kv_heads + 1) if args.n_kv_heads % d == 0]
        raise UserError(f"{n} ranks do not divide the model's {args.n_kv_heads} KV heads; run "
                        f"torchrun --nproc_per_node {' or '.join(map(str, divisors))}")
    if args.intermediate_size % n:
        raise UserError(f"{n} ranks do not divide the MLP's {args.intermediate_size} columns")
    g = getattr(qconfig, "groupsize", None)
    if g and ((args.n_head // n) * args.head_dim % g or (args.intermediate_size // n) % g):
        raise UserError(f"{n} ranks split int4 groups of {g}; use fewer ranks or a smaller "
                        f"groupsize")


def _keep_rows(linear: nn.Module, idx: Tensor) -> None:
    """Keep output features idx of a float or quantized linear (storage format)."""
    names = ("weight", "bias") if isinstance(linear, nn.Linear) else \
        ("qweight", "scales", "zeros", "bias")
    for name in names:
        t = getattr(linear, name, None)
        if t is not None:
            kept = t.detach()[idx].clone()
            if isinstance(t, nn.Parameter):
                setattr(linear, name, nn.Parameter(kept, requires_grad=False))
            else:
                setattr(linear, name, kept)
    linear.out_features = len(idx)


def _keep_columns(linear: nn.Module, start: int, end: int) -> None:
    """Keep input features [start, end) of a float or quantized linear (storage format)."""
    if getattr(linear, "bias", None) is not None:
        raise ValueError("a row-parallel linear with a bias would add it once per rank")
    if isinstance(linear, nn.Linear):
        linear.weight = nn.Parameter(linear.weight.detach()[:, start:end].clone(),
                                     requires_grad=False)
    elif hasattr(linear, "zeros"):  # int4: two columns a byte, scales/zeros per group
        g = linear.in_features // linear.scales.shape[1]
        linear.qweight = linear.qweight[:, start // 2:end // 2].clone()
        linear.scales = linear.scales[:, start // g:end // g].clone()
        linear.zeros = linear.zeros[:, start // g:end // g].clone()
    else:  # int8: one scale per output channel, unchanged
        linear.qweight = linear.qweight[:, start:end].clone()
    linear.in_features = end - start


def shard_model(model: nn.Module, tp: TP) -> nn.Module:
    """Keep rank tp.rank's part of every block (see the module docstring), in place."""
    a = model.args
    r, n = tp.rank, tp.world
    H, Hkv, D, inter = a.n_head, a.n_kv_heads, a.head_dim, a.intermediate_size
    h, hk, i = H // n, Hkv // n, inter // n
    q = torch.arange(r * h * D, (r + 1) * h * D)
    k = H * D + torch.arange(r * hk * D, (r + 1) * hk * D)
    v = (H + Hkv) * D + torch.arange(r * hk * D, (r + 1) * hk * D)
    for block in model.layers:
        att, ff = block.attention, block.feed_forward
        _keep_rows(att.wqkv, torch.cat([q, k, v]))
        _keep_columns(att.wo, r * h * D, (r + 1) * h * D)
        att.wo = AllReduce(att.wo, tp)
        att.n_head, att.n_kv_heads = h, hk
        for w in (ff.w1, ff.w3):
            _keep_rows(w, torch.arange(r * i, (r + 1) * i))
        _keep_columns(ff.w2, r * i, (r + 1) * i)
        ff.w2 = AllReduce(ff.w2, tp)
    model.args = replace(a, n_head=h, n_kv_heads=hk, intermediate_size=i)
    model.kv_shard = KVShard(tp, r * hk, Hkv)  # build_caches hands it to every cache
    return model


def finish(tp: Optional[TP]) -> None:
    if tp is not None and dist.is_initialized():
        dist.destroy_process_group()
