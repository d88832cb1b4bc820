from __future__ import annotations

import torch
from torch import Tensor

from caches.base import KVCache, KVSegment, KVView, put_slots


def scatter_tokens(buf: Tensor, slots: Tensor, x: Tensor) -> None:
    """buf [B, H, S, D][b, :, slots[b, t]] = x [B, H|1, T, D][b, :, t]: each row its own slots."""
    B, H, _, D = buf.shape
    idx = slots.view(B, 1, -1, 1).expand(B, H, -1, D)
    put_slots(buf, idx, x.expand(B, H, -1, D).to(buf.dtype))


def starts_fresh(input_pos: Tensor) -> bool:
    """Every row holds positions 0..T-1 (an eager prompt from the start; one host sync)."""
    T = input_pos.shape[1]
    return bool((input_pos == torch.arange(T, device=input_pos.device)).all())


class FullCache(KVCache):
    """Keep every token: slot i holds position i (gpt-fast's static cache).

    State: k, v [B, Hkv, max_seq_length, D] in the model dtype; pos [B, 1, max_seq_length]
    (-1 = empty), from which the causal mask is built. Keys are rotated at their absolute
    positions when written.
    """

    description = "keep every token (capacity = max_seq_length)"
    # A token written ahead of the stream is overwritten before any query of the stream
    # reaches its position; commit does nothing.
    ahead_is_harmless = True
    keeps_every_token = True

    def __init__(self, batch_size: int, n_kv_heads: int, head_dim: int, max_seq_length: int,
                 dtype: torch.dtype, rope: Tensor, layer_id: int = 0):
        super().__init__(rope, layer_id)
        shape = (batch_size, n_kv_heads, max_seq_length, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("pos", torch.full((batch_size, 1, max_seq_length), -1,
                                               dtype=torch.long), persistent=False)

    def update(self, input_pos: Tensor, q: Tensor, k: Tensor, v: Tensor) -> KVView:
        q, k = self.rotate(q, input_pos), self.rotate(k, input_pos)
        scatter_tokens(self.k, input_pos, k)
        scatter_tokens(self.v, input_pos, v)
        put_slots(self.pos, input_pos.unsqueeze(1), input_pos.unsqueeze(1))
        T = input_pos.shape[1]
        # A compiled prompt graph cannot sync: its caller says whether the rows start at 0
        # (`fresh`, a graph for each answer).
        if T > 1 and not self.wants_probs and (
                self.fresh if torch.compiler.is_compiling() else starts_fresh(input_pos)):
            # A prompt from position 0 attends causally over its own T slots (mask None), not
            # over the whole static buffer with a mask: a quarter of the work at 4k of 8k.
            return KVView(q, [KVSegment(self.k[:, :, :T], self.v[:, :, :T])], None)
        pos = self.pos.unsqueeze(-2)  # [B, 1, 1, S]
        mask = (pos <= input_pos.view(input_pos.shape[0], 1, -1, 1)) & (pos >= 0)
        return KVView(q, [KVSegment(self.k, self.v)], mask)

    def reset(self) -> None:
        self.k.zero_()
        self.v.zero_()
        self.pos.fill_(-1)
