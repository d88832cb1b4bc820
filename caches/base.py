"""The interface between attention and a KV cache.

Attention hands the cache this step's un-rotated q/k and v; the cache applies RoPE at the positions
it chooses, writes K/V into its static buffers (allocated once, in __init__) and returns the
query, the keys/values to attend over and a boolean mask. Policies that score tokens by attention
set `wants_probs` and receive the probabilities through `observe` after the attention product.
Stretches stored in int8 come back as int8 with their scales; attention folds the scales into
the scores and the probabilities instead of materialising a dequantized copy.

Every tensor a cache allocates lives in a registered buffer, so `nbytes` is exact and `.to()`
moves it.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor

from model import KVSegment, apply_rope


class KVCache(nn.Module):
    wants_probs = False
    has_middle = False
    prefill_chunk = None  # None: any prompt length in one call; N: feed prompts N tokens at a time
    description = ""      # one line for --list_caches
    options: dict = {}    # policy options (name -> default) a policy accepts

    @classmethod
    def check_options(cls, window: int, **options) -> None:
        """Raise UserError for option values the policy cannot run with."""

    def __init__(self, rope: Tensor):
        super().__init__()
        self.register_buffer("rope", rope, persistent=False)  # [max_len, D // 2, 2] float32

    def update(self, input_pos: Tensor, q: Tensor, k: Tensor, v: Tensor):
        """q [B, H, T, D], k/v [B, Hkv, T, D] (un-rotated) at positions input_pos [T].

        Returns (q, segments, mask): q rotated, a list of KVSegment (the slots to attend over,
        S in all) and mask [B|1, Hkv|1, T, S] (True = attend), in segment order."""
        raise NotImplementedError

    def observe(self, probs: Tensor) -> None:
        """Attention probabilities [B, Hkv, G, T, S] (float32) of this step."""

    def reset(self) -> None:
        raise NotImplementedError

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        return apply_rope(x, self.rope[positions])

    @property
    def nbytes(self) -> int:
        """Exact bytes of the K/V storage and index maps (the shared RoPE table excluded)."""
        return sum(b.numel() * b.element_size() for name, b in self.named_buffers()
                   if name != "rope")
