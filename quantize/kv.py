"""Symmetric per-token, per-head INT8 for KV-cache entries.

scale = max|x| / 127 + eps over the head dimension; q = clamp(round(x / scale), -127, 127).
Attention consumes (q, scale) directly (model.KVSegment); only merges dequantize explicitly.
"""
from __future__ import annotations

import torch
from torch import Tensor

EPS = 1e-8


def quantize_int8(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [..., D] -> (int8 [..., D], float32 scale [..., 1])."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True) / 127 + EPS
    return torch.clamp(torch.round(xf / scale), -127, 127).to(torch.int8), scale


def dequantize_int8(q: Tensor, scale: Tensor) -> Tensor:
    return q.float() * scale
