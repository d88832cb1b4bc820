from torch import Tensor

from caches.base import Option
from caches.region import RegionCache


class A2SFCache(RegionCache):
    """A2SF, accumulative attention with a forgetting factor (Jo & Shin, 2024): evict the middle
    token with the lowest s, where every step s <- alpha * s + a_t.

    State: s [B, Hkv, C]. Option: forgetting_factor alpha (default 0.2).

    Paper: A2SF: Accumulative Attention Scoring with Forgetting Factor for Token Pruning in
    Transformer Decoder, https://arxiv.org/abs/2407.20485; implements the accumulative score
    with a forgetting factor of its method section.
    """
    stats = ("s",)
    wants_probs = True
    exact_bulk = True
    # Above 1, old attention would grow instead of fading; 1 is H2O.
    options = (Option("forgetting_factor", float, 0.2, "older attention fades by it each step",
                      min=0, max=1),)
    description = "evict the lowest attention score accumulated with a forgetting factor"

    def __init__(self, *args, forgetting_factor: float = 0.2, **kw):
        super().__init__(*args, **kw)
        self.alpha = float(forgetting_factor)

    def accumulate(self, p: Tensor, positions: Tensor) -> None:
        for t in range(p.shape[2]):
            self.s.mul_(self.alpha).add_(p[:, :, t])

    def score(self, cur: Tensor) -> Tensor:
        return self.s
