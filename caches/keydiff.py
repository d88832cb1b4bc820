import torch
from torch import Tensor

from caches.region import RegionCache, coarse


class KeyDiffCache(RegionCache):
    """KeyDiff (Park et al., 2025, "KeyDiff: key similarity-based KV cache eviction"; kvpress's
    KeyDiffPress): evict the middle token whose key is most similar, by cosine, to the anchor,
    the mean of the retained tokens' normalized keys, per KV head. Distinctive keys stay. No
    attention probabilities: the fused attention path stays.

    Keys are compared as stored: rotated at their positions (original positions) or
    un-rotated (rank positions). State: the region buffers only.
    """
    description = "evict the middle token whose key is most like the mean key (no attention needed)"

    def score(self, cur: Tensor) -> Tensor:
        keys = self.all_keys()                                          # [B, H, C, D]
        inv = 1 / keys.norm(dim=-1).clamp(min=1e-12)                    # 1 / |k|, [B, H, C]
        valid = self.pos >= 0
        # The normalized keys k / |k| are never built: the anchor weighs each key by 1 / |k|,
        # and a cosine is (k . anchor) / |k| / |anchor|. One pass over the keys for the norms,
        # one for the anchor, one for the dot products (normalizing first took 1.6x as long).
        anchor = (keys * torch.where(valid, inv, 0.0).unsqueeze(-1)).sum(2, keepdim=True) \
            / valid.sum(-1)[..., None, None].clamp(min=1)                   # [B, H, 1, D]
        return -coarse((keys * anchor).sum(-1) * inv / anchor.norm(dim=-1).clamp(min=1e-12))
