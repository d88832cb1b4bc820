from __future__ import annotations

import torch
from torch import Tensor

from caches.base import KVCache, KVSegment


class FullCache(KVCache):
    """Keep every token: slot i holds position i (gpt-fast's static cache).

    State: k, v [B, Hkv, max_seq_length, D] in the model dtype; pos [1, 1, max_seq_length]
    (-1 = empty), from which the causal mask is built. Keys are rotated at their absolute
    positions when written.
    """

    description = "keep every token (capacity = max_seq_length)"

    def __init__(self, batch_size: int, n_kv_heads: int, head_dim: int, max_seq_length: int,
                 dtype: torch.dtype, rope: Tensor):
        super().__init__(rope)
        shape = (batch_size, n_kv_heads, max_seq_length, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("pos", torch.full((1, 1, max_seq_length), -1, dtype=torch.long),
                             persistent=False)

    def update(self, input_pos: Tensor, q: Tensor, k: Tensor, v: Tensor):
        q, k = self.rotate(q, input_pos), self.rotate(k, input_pos)
        self.k.index_copy_(2, input_pos, k)
        self.v.index_copy_(2, input_pos, v)
        self.pos.index_copy_(2, input_pos, input_pos.view(1, 1, -1))
        mask = (self.pos.unsqueeze(-2) <= input_pos.view(-1, 1)) & (self.pos.unsqueeze(-2) >= 0)
        return q, [KVSegment(self.k, self.v)], mask

    def reset(self) -> None:
        self.k.zero_()
        self.v.zero_()
        self.pos.fill_(-1)
