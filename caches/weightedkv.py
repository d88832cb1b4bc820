import torch
from torch import Tensor

from caches.region import FAR, RegionCache, first_min


class WeightedKVCache(RegionCache):
    """WeightedKV (Algorithm 1): drop the key of the least important middle token, merge its
    value into its right neighbour, weighted by average attention.

    Importance of slot i is s_i = a_i / n_i: a_i the attention it received (summed), n_i the
    steps it was attended, its own step included (n = cur - pos + 1). The victim j = argmin s over
    the middle; its right neighbour r is the next retained position (possibly the oldest window
    token); V_r <- (s_j V_j + s_r V_r) / (s_j + s_r) in float32; r keeps its own a and n.

    State: acc [B, Hkv, C] (a); n is derived from pos.

    Paper: WeightedKV: Attention Scores Weighted Key-Value Cache Merging for Large Language
    Models, https://arxiv.org/abs/2503.01330; implements Algorithm 1; `weightedkv-evict` is
    its ablation that drops the value too.
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
            r = first_min(torch.where(self.pos > pos_j, self.pos, FAR))
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
            C, K = self.pos.shape[-1], victims.shape[-1]
            run, first = self.runs(victims, do)
            into, first = first < K, first.clamp(max=K - 1)                 # [B, H, C]
            s = self.score(cur)                                             # [B, H, C]
            s_j = torch.where(run < C, s.gather(-1, victims), 0.0)          # [B, H, K]
            # A run's sums by one [K x K] product; a slot reads its run's at the run's first.
            same = (run.unsqueeze(-1) == run.unsqueeze(-2)).float()        # [B, H, K, K]
            num = same @ (s_j.unsqueeze(-1) * self.read_v(victims))        # [B, H, K, D]
            num = num.gather(2, first.unsqueeze(-1).expand(*first.shape, num.shape[-1]))
            runs_s = (same * s_j.unsqueeze(-2)).sum(-1).gather(-1, first)   # [B, H, C]
            total = s + torch.where(into, runs_s, 0.0)
            merged = (num + s.unsqueeze(-1) * self.all_values()) / \
                total.clamp(min=1e-30).unsqueeze(-1)
            self.write_all_v(merged, into & (total > 0))
        super().remove_bulk(victims, do, cur)

    def runs(self, victims: Tensor, do: Tensor) -> tuple[Tensor, Tensor]:
        """The going victims [B, H, K] grouped by the token that stays after them (its rank
        among the tokens that stay, `stay_order`). Returns run [B, H, K], that rank (C for a
        victim that does not merge), and first [B, H, C], each slot's first victim that merges
        into it (K if none)."""
        C, K = self.pos.shape[-1], victims.shape[-1]
        order = self.stay_order(victims, do)
        run = torch.where(do & (order.at < order.n), order.at, C)
        # The lowest victim index of each run (a minimum: the same whatever order it runs in).
        first = torch.full((*run.shape[:-1], C + 1), K, dtype=run.dtype, device=run.device)
        first = first.scatter_reduce(-1, run, torch.arange(K, device=run.device).expand_as(run),
                                     "amin")
        return run, first.gather(-1, order.rank)


class WeightedKVEvictCache(WeightedKVCache):
    """WeightedKV's ablation (paper Fig. 4): the same victim, its value dropped, not merged."""
    description = "WeightedKV's victim choice with the value dropped instead of merged (ablation)"
    merge = False
