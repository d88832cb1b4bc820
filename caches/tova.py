from torch import Tensor

from caches.region import RegionCache


class TOVACache(RegionCache):
    """TOVA, token omission via attention (Oren et al., 2024): evict the middle token with the
    lowest attention at this step, averaged over all heads of the layer, so every head drops the
    same token.

    State: last [B, Hkv, C], this step's head-averaged attention (equal across heads).

    Paper: Transformers are Multi-State RNNs, https://arxiv.org/abs/2401.06104; implements
    the TOVA policy of its method section: drop the token of lowest current attention,
    averaged over heads.
    """
    stats = ("last",)
    wants_probs = True
    exact_bulk = True
    description = "evict the middle token least attended at this step, averaged over all heads"

    def accumulate(self, p: Tensor, positions: Tensor) -> None:
        self.last.copy_(self.mean_over_heads(p[:, :, -1]).expand_as(self.last))

    def score(self, cur: Tensor) -> Tensor:
        return self.last
