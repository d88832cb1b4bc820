import torch.nn.functional as F
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
        keys = F.normalize(self.all_keys(), dim=-1)            # [B, H, C, D]
        valid = (self.pos >= 0).unsqueeze(-1)
        anchor = (keys * valid).sum(2, keepdim=True) / valid.sum(2, keepdim=True).clamp(min=1)
        return -coarse((keys * anchor).sum(-1) / anchor.norm(dim=-1).clamp(min=1e-12))
