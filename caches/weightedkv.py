import torch
from torch import Tensor

from caches.region import FAR, RegionCache


class WeightedKVCache(RegionCache):
    """WeightedKV (Algorithm 1): drop the key of the least important middle token, merge its
    value into its right neighbour, weighted by average attention.

    Importance of slot i is s_i = a_i / n_i: a_i the attention it received (summed), n_i the
    steps it was attended, its own step included (n = cur - pos + 1). The victim j = argmin s over
    the middle; its right neighbour r is the next retained position (possibly the oldest window
    token); V_r <- (s_j V_j + s_r V_r) / (s_j + s_r) in float32; r keeps its own a and n.

    State: acc [B, Hkv, C] (a); n is derived from pos.
    """
    stats = ("acc",)
    wants_probs = True
    description = "drop the least-attended key, merge its value into the right neighbour (weighted)"
    merge = True

    def accumulate(self, p: Tensor, positions: Tensor) -> None:
        self.acc.add_(p.sum(dim=2))

    def score(self, cur: Tensor) -> Tensor:
        n = (cur - self.pos + 1).clamp(min=1).float()
        return self.acc / n

    def remove(self, victim: Tensor, do: Tensor, cur: Tensor) -> None:
        if self.merge:
            j = victim + self.n_fast
            pos_j = self.pos.gather(-1, j.unsqueeze(-1))
            r = torch.where(self.pos > pos_j, self.pos, FAR).argmin(dim=-1)
            s = self.score(cur)
            s_j = s.gather(-1, j.unsqueeze(-1))
            s_r = s.gather(-1, r.unsqueeze(-1))
            v_j, v_r = self.read_v(j), self.read_v(r)
            total = s_j + s_r
            merged = torch.where(total > 0, (s_j * v_j + s_r * v_r) / total.clamp(min=1e-30), v_r)
            self.write_v(r, merged, do)
        self.evict(victim, do)

    def remove_bulk(self, victims: Tensor, do: Tensor, cur: Tensor) -> None:
        """Several victims at once: each merges into its right neighbour among the tokens that
        stay, so a run of victims merges into one neighbour r:
        V_r <- (s_r V_r + sum_j s_j V_j) / (s_r + sum_j s_j)."""
        if self.merge:
            into = self.into_survivor(victims, do)           # [B, H, K, C] one-hot
            s = self.score(cur)                             # [B, H, C]
            s_j = s.gather(-1, victims) * do               # [B, H, K]
            w = into.float() * s_j.unsqueeze(-1)           # [B, H, K, C]
            num = w.transpose(-1, -2) @ self.read_v(victims)  # [B, H, C, D]
            total = w.sum(2) + s
            merged = (num + s.unsqueeze(-1) * self.all_values()) / \
                total.clamp(min=1e-30).unsqueeze(-1)
            self.write_all_v(merged, into.any(2) & (total > 0))
        super().remove_bulk(victims, do, cur)

    def into_survivor(self, victims: Tensor, do: Tensor) -> Tensor:
        """One-hot [B, H, K, C] of each going victim's right neighbour among the tokens that
        stay (the next retained position)."""
        later = self.later_survivors(victims, do)
        r = torch.where(later, self.pos.unsqueeze(2), FAR).argmin(dim=-1, keepdim=True)
        slot = torch.arange(self.pos.shape[-1], device=victims.device)
        return (slot == r) & do.unsqueeze(-1) & later.any(dim=-1, keepdim=True)


class WeightedKVEvictCache(WeightedKVCache):
    """WeightedKV's ablation (paper Fig. 4): the same victim, its value dropped, not merged."""
    description = "WeightedKV's victim choice with the value dropped instead of merged (ablation)"
    merge = False
