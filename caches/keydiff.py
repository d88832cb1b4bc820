import torch
from torch import Tensor

from caches.region import RegionCache, coarse


class KeyDiffCache(RegionCache):
    """KeyDiff (Park et al., 2025, "KeyDiff: key similarity-based KV cache eviction"; kvpress's
    KeyDiffPress): evict the middle token whose key is most similar, by cosine, to the anchor,
    the mean of the retained tokens' normalized keys, per KV head. Distinctive keys stay. No
    attention probabilities: the fused attention path stays.

    Keys are compared as stored: rotated at their positions (original positions) or
    un-rotated (rank positions). State: the region buffers and each slot's 1 / |k|, taken once
    as its key is stored (an INT8 middle's as dequantized).

    Paper: KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in
    Resource-Constrained Environments, https://arxiv.org/abs/2504.15364; implements the
    method section's score: cosine similarity of each key to the mean key.
    """
    description = "evict the middle token whose key is most like the mean key (no attention needed)"
    stats = ("inv_norm",)
    key_stat = "inv_norm"

    def of_key(self, k: Tensor) -> Tensor:
        return 1 / k.norm(dim=-1).clamp(min=1e-12)

    def score(self, cur: Tensor, start: int = 0) -> Tensor:
        """Scores of slots start.. [B, H, C - start]."""
        keys = self.all_keys()                                          # [B, H, C, D]
        valid = self.pos >= 0
        # The normalized keys k / |k| are never built: the anchor weighs each key by 1 / |k|,
        # and a cosine is (k . anchor) / |k| / |anchor|: one pass over the keys for the
        # anchor, one for the dot products.
        weight = torch.where(valid, self.inv_norm, 0.0).unsqueeze(-1)
        anchor = (keys * weight).sum(2, keepdim=True) \
            / valid.sum(-1)[..., None, None].clamp(min=1)                   # [B, H, 1, D]
        dots = (keys[:, :, start:] * anchor).sum(-1)
        return -coarse(dots * self.inv_norm[..., start:] / anchor.norm(dim=-1).clamp(min=1e-12))

    def middle_score(self, cur: Tensor) -> Tensor:
        return self.score(cur, self.n_fast)
