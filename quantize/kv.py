"""Symmetric per-token, per-head INT8 for KV-cache entries, stored four codes to a word.

scale = max|x| / 127 + eps over the head dimension; q = clamp(round(x / scale), -127, 127).
A token's D codes are held as D/4 32-bit words, a quarter of the row in each byte: byte i of
word j is code i * D/4 + j; its scale (a float32 number) follows as one more word, so a token
is one row of D/4 + 1 words that a cache writes, moves and reads as a whole. Unpacked by
shifts (`codes`), the words give the row reshaped to [4, D/4]: attention reads the codes in the
query's order and writes its output in the head's, with nothing permuted in between (a
permuted read inside the output projection's loop made that loop scalar).

Why words, and which dtype holds them (bit patterns, never numbers): the compiled CPU step's
loops read the words as vectors, and the widths differ. On an AVX2 CPU (8 lanes) at::vec loads
a vector of int8 or int32 by way of a buffer on the stack, and only a vector of floats whole,
while a same-width view of floats as int32 costs nothing inside the loop: the words live in
float32 tensors there. On an AVX-512 CPU (16 lanes)
it is the other way round: int32 loads are whole (masked), and Inductor's view of 16 float lanes
as int32 goes one lane at a time through the stack, 4x slower for the scores' loop: the words
live in int32 tensors there. `WORD` is chosen once, by the kernels ATen runs
(`ATEN_CPU_CAPABILITY` included), which Inductor's vector width follows. Saved sessions hold
the rows as int32 either way (`RegionCache.state`). Copies, gathers, scatters and `torch.where`
move the bits unchanged. Attention consumes (words, scale) directly (model.KVSegment); only
merges dequantize explicitly. The scale shares the row so that a layer's INT8 K (or V) is one
tensor: one write where there were two, and one input of the compiled step instead of two.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

EPS = 1e-8
# the dtype of a tensor of words (bit patterns): whole vector loads in compiled CPU loops
WORD = torch.int32 if torch.backends.cpu.get_cpu_capability() == "AVX512" else torch.float32


def quantize_int8(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [..., D] -> (int8 [..., D], float32 scale [..., 1])."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True) / 127 + EPS
    return torch.clamp(torch.round(xf / scale), -127, 127).to(torch.int8), scale


def dequantize_int8(q: Tensor, scale: Tensor) -> Tensor:
    return q.float() * scale


def pack(q: Tensor) -> Tensor:
    """int8 codes [..., D] -> words [..., D/4] (WORD), code i * D/4 + j in byte i of word j. In
    int32 arithmetic, which Inductor fuses (a view of int8 as a wider dtype would cut its
    loops); the top byte is the signed code times 2**24, which cannot overflow."""
    b = q.to(torch.int32).unflatten(-1, (4, -1))
    words = (b[..., 0, :] & 255) | (b[..., 1, :] & 255) << 8 | (b[..., 2, :] & 255) << 16 | \
        b[..., 3, :] * 2**24
    return words.view(WORD)


def codes(words: Tensor) -> Tensor:
    """words [..., D/4] -> the codes as float32 [..., 4, D/4], the row reshaped: (word << 24 -
    8i) >> 24 is byte i, signed."""
    shifts = 24 - 8 * torch.arange(4, dtype=torch.int32, device=words.device).view(4, 1)
    return ((words.view(torch.int32).unsqueeze(-2) << shifts) >> 24).float()


def quantize_words(x: Tensor) -> Tensor:
    """x [..., D] -> rows [..., D/4 + 1] (WORD): the words, then the scale. One pointwise
    expression, not a cat: Inductor makes a cat one buffer and a view of it per input, each a
    call of the compiled step's Python wrapper (three INT8 writes a layer, every step)."""
    q, scale = quantize_int8(x)
    words = F.pad(pack(q), (0, 1))
    last = torch.arange(words.shape[-1], device=x.device) == words.shape[-1] - 1
    return torch.where(last, scale.view(WORD), words)


def zero_rows(*lead: int, head_dim: int) -> Tensor:
    """An empty INT8 store: [*lead, D/4 + 1] zero words for a head dim D (of WORD at the call)."""
    return torch.zeros(*lead, head_dim // 4 + 1, dtype=WORD)


def split_words(rows: Tensor) -> tuple[Tensor, Tensor]:
    """rows [..., D/4 + 1] -> (words [..., D/4], float32 scale [..., 1]), views."""
    return rows[..., :-1], rows[..., -1:].view(torch.float32)


def widen(words: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """words [..., D/4] and their scales [..., 1] -> the values [..., D] in dtype: each byte
    plane by constant shifts, scaled, side by side. Inductor vectorizes that and writes each
    plane straight to its place, where `codes`' shift by a computed amount leaves the loop
    scalar (a copy of a 4k middle's K: 0.75 -> 0.08 ms)."""
    w = words.view(torch.int32)
    planes = [(w << s) >> 24 for s in (24, 16, 8)] + [w >> 24]
    return torch.cat([(p.float() * scale).to(dtype) for p in planes], dim=-1)


def dequantize_words(rows: Tensor) -> Tensor:
    """rows [..., D/4 + 1] -> float32 [..., D]."""
    return widen(*split_words(rows))


def dequantize_few(rows: Tensor) -> Tensor:
    """rows [..., D/4 + 1] -> float32 [..., D], the values `dequantize_words` gives, as one
    pointwise expression over the row reshaped (`codes`): for a compiled step's read of a few
    rows (a merge's victim and neighbour, the keys entering the middle, as it holds them, for
    a key statistic), where `widen`'s cat of four planes is a buffer and a view of it per
    plane, each a call of the step's Python wrapper, in every layer. Its computed shifts leave a
    long copy's loop scalar, so whole stretches go through
    `widen`."""
    words, scale = split_words(rows)
    return (codes(words) * scale.unsqueeze(-1)).flatten(-2)
