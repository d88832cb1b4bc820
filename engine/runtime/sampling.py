"""From logits to tokens: the distribution that temperature, top-k and top-p leave, and the
draw. One definition serves the decode step, the server's rows and speculative decoding, so
that a draft is judged against exactly the distribution a plain step samples from."""
from typing import Optional

import torch
from torch import Tensor


def distribution(logits: Tensor, temperature: float, top_k: Optional[int] = None,
                 top_p: float = 1.0) -> Tensor:
    """logits [..., V], temperature > 0 -> float32 probabilities: scaled by 1 / temperature,
    cut to the top_k most likely tokens, then to the fewest whose mass reaches top_p (at least
    one)."""
    logits = logits.float() / temperature
    if top_k is not None:
        pivot = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]
        logits = torch.where(logits < pivot, float("-inf"), logits)
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        sorted_p[(sorted_p.cumsum(-1) - sorted_p) >= top_p] = 0
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return probs


def sample(logits: Tensor, temperature: float, top_k: Optional[int]) -> Tensor:
    """logits [B, V] -> token ids [B, 1]; no host syncs (works inside a CUDA graph)."""
    if temperature <= 0:
        return logits.argmax(dim=-1, keepdim=True)
    probs = distribution(logits, temperature, top_k)
    # argmax(p / E) with E ~ Exp(1) draws from p (the exponential race), without a multinomial sync.
    noise = torch.empty_like(probs).exponential_(1)
    return (probs / noise).argmax(dim=-1, keepdim=True)
