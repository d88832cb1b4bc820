"""Attention loss: how much attention a policy's choices take away, measured on the full model.

A text streams through the model token by token with the full cache, so every hidden state is
the full model's. Beside each layer's full cache run shadow caches, one per policy: each receives
the same q/k/v, decides what it holds by its own rules, and gets as its attention the full
attention renormalized over the tokens it holds (a softmax over a subset of the same logits: its
own attention exactly, since no policy changes a held token's key). At each step and layer, a
policy's attention loss is the full attention mass on tokens it no longer holds, averaged over
the layer's query heads: 1 - sum over held tokens of p. Evicted tokens count, and so do tokens a
merging policy merged away (their keys are gone; their values live on in a neighbour, which is
why its loss need not predict its damage).

    losses = attention_loss(model, [ids], {"streaming": factory, ...})
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from caches import build_caches
from caches.base import KVCache
from engine.runtime.steps import forward


class LossProbe(KVCache):
    """One layer: a full cache that attention reads, and the shadows of the policies."""
    wants_probs = True

    def __init__(self, full, shadows: list):
        super().__init__(full.rope, full.layer_id)
        self.full = full
        self.shadows = torch.nn.ModuleList(shadows)
        self.steps: list = []  # per step: loss [n_shadows, B]

    @property
    def scheduled(self) -> bool:
        return any(s.scheduled for s in self.shadows)

    def before_step(self, first: list, last: list) -> None:
        for s in self.shadows:
            if s.scheduled:
                s.before_step(first, last)

    def after_step(self) -> None:
        for s in self.shadows:
            s.after_step()

    def warmup_positions(self) -> tuple:
        return tuple(p for s in self.shadows for p in s.warmup_positions())

    def update(self, input_pos, q, k, v):
        for s in self.shadows:  # each stores and rotates as it would alone
            s.update(input_pos, q, k, v)
        return self.full.update(input_pos, q, k, v)

    def commit(self, input_pos: Tensor, probs: Tensor) -> None:
        # probs [B, Hkv, G, T, S] over the full cache's slots (slot = position)
        losses = []
        for shadow in self.shadows:
            pos = shadow.pos.long()  # [B, Hkv|1, C]
            held = (pos >= 0) & (pos <= input_pos.view(-1, 1, 1))
            # the lost mass summed directly (not 1 - mass: exactly 0 when nothing is lost)
            kept = torch.zeros(*pos.shape[:2], probs.shape[-1], dtype=torch.int32,
                               device=pos.device).scatter_reduce(
                -1, pos.clamp(min=0), held.int(), reduce="amax").bool()  # empty slots: no vote
            lost = (probs * ~kept.unsqueeze(2).unsqueeze(2)).sum(-1)
            losses.append(lost.mean(dim=(1, 2, 3)))
            if not shadow.wants_probs:
                shadow.commit(input_pos, None)
                continue
            # its own attention: the full attention on the slots it holds, renormalized
            idx = pos.clamp(min=0).view(pos.shape[0], pos.shape[1], 1, 1, -1)
            idx = idx.expand(*probs.shape[:-1], -1)
            mine = torch.where(held.unsqueeze(2).unsqueeze(2), probs.gather(-1, idx), 0.0)
            shadow.commit(input_pos, mine / mine.sum(-1, keepdim=True).clamp(min=1e-30))
        self.steps.append(torch.stack(losses))

    def reset(self) -> None:
        self.full.reset()
        for s in self.shadows:
            s.reset()
        self.steps = []


@dataclass
class AttentionLoss:
    label: str
    loss: float          # mean over layers and scored steps
    per_layer: list      # mean over scored steps, one per layer
    curve: list          # mean over layers, one per step (position 0 first)


@torch.inference_mode()
def attention_loss(model, streams: list, factories: dict, max_seq_length: Optional[int] = None,
                   progress: Optional[Callable[[int], None]] = None) -> list:
    """streams: equal-length token id lists (one batch row each); factories: label -> cache
    factory. Returns (per stream, [AttentionLoss per label] in the order of `factories`;
    seconds the stream took)."""
    from caches import make_cache_factory
    B, n = len(streams), len(streams[0])
    S = max_seq_length or n
    full = build_caches(model, B, S, make_cache_factory("full"))
    shadows = [build_caches(model, B, S, f) for f in factories.values()]
    probes = [LossProbe(full[i], [s[i] for s in shadows]) for i in range(len(full))]
    ids = torch.tensor(streams, device=model.device)
    t0 = time.perf_counter()
    for t in range(n):
        forward(model, ids[:, t:t + 1], torch.tensor([t], device=model.device), probes)
        if progress:
            progress(t + 1)
    seconds = time.perf_counter() - t0
    steps = torch.stack([torch.stack(p.steps) for p in probes])  # [L, n, P, B]
    out = []
    for b in range(B):
        rows = []
        for i, label in enumerate(factories):
            x = steps[:, :, i, b].double()  # [L, n]
            rows.append(AttentionLoss(label, x.mean().item(), x.mean(1).tolist(),
                                      x.mean(0).tolist()))
        out.append(rows)
    return out, seconds
