import torch
from torch import Tensor

from caches.region import RegionCache


class H2OCache(RegionCache):
    """H2O, heavy-hitter oracle (Zhang et al., 2023): evict the middle token with the least
    accumulated attention.

    State: acc [B, Hkv, C], the attention each slot has received, summed over steps.

    Paper: H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language
    Models, https://arxiv.org/abs/2306.14048; implements Algorithm 1, the greedy eviction by
    accumulated attention.
    """
    stats = ("acc",)
    wants_probs = True
    exact_bulk = True
    description = "evict the middle token with the least accumulated attention (heavy hitters)"

    def accumulate(self, p: Tensor, positions: Tensor) -> None:
        self.acc.add_(p.sum(dim=2))

    def score(self, cur: Tensor) -> Tensor:
        return self.acc
