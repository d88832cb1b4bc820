from torch import Tensor

from caches.region import RegionCache, coarse


class KnormCache(RegionCache):
    """Knorm (Devoto et al., 2024, "A simple and effective L2 norm-based strategy for KV cache
    compression"; kvpress's KnormPress): evict the middle token whose key has the largest L2
    norm, per KV head. Keys of low norm draw the most attention, so the norm stands in for it:
    no attention probabilities, the fused attention path stays.

    State: the region buffers only (norms are read from the keys; RoPE preserves them).

    Paper: A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression,
    https://arxiv.org/abs/2406.11430; implements the method section's rule: keep the keys of
    lowest L2 norm.
    """
    description = "evict the middle token whose key has the largest L2 norm (no attention needed)"

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        # A key's norm is its score: an INT8 middle changes it as the token enters, and the
        # bulk pass scores the token before that.
        self.exact_bulk = not self.middle_int8

    def score(self, cur: Tensor) -> Tensor:
        return -coarse(self.all_keys().norm(dim=-1))
