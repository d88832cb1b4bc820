import torch
from torch import Tensor

from caches.base import Option, put_slots
from caches.region import RegionCache


def uniform(key: Tensor, cur: Tensor, n: int, start: int = 0) -> Tensor:
    """Counter-based uniform draws in [0, 1) [B, n, 1]: draw i of row b from (key, cur[b], i),
    for i in [start, start + n).

    A splitmix-style integer hash: reproducible under a seed and free of generator state, so a
    compiled graph (or a CUDA graph) replays it exactly.
    """
    i = torch.arange(start, start + n, device=key.device)
    # key [1], or [B] (a stack of layers, RegionCache.stacked: each row its layer's key)
    return uniform_at(key.view(-1, 1), cur.view(-1, 1), i).unsqueeze(-1)


def uniform_at(key: Tensor, cur: Tensor, i: Tensor) -> Tensor:
    """The draw of (key, cur, i), elementwise over cur and i (broadcast)."""
    # `i | 0` is i, as a value: it keeps Inductor from folding i * 0xC2B2AE35 into an index
    # expression, which the GPU kernel computes in int32 (Triton rejects the constant).
    x = key * 0x9E3779B9 + cur.long() * 0x85EBCA6B + (i | 0) * 0xC2B2AE35
    for mul in (0xBF58476D1CE4E5B9 >> 2, 0x94D049BB133111EB >> 2):
        x = (x ^ (x >> 31)) * mul
    x = x ^ (x >> 29)
    return (x & 0xFFFFFF).float() / float(1 << 24)


class CaMCache(RegionCache):
    """CaM, cache merging (Zhang et al., 2024): sinks + window; the token i leaving the window is
    evicted and, with probability clamp(A_i / mean(A_next), 0, 1), V_i / m is added to each of
    the m following retained values (fewer if fewer follow, dividing by their count).

    State: acc [B, Hkv, C] (A, accumulated attention, this step included). One draw per KV head
    from a seeded counter-based generator, the same for every batch row. Option: merge_span m
    (default 16).

    Paper: CaM: Cache Merging for Memory-efficient LLMs Inference (ICML 2024),
    https://proceedings.mlr.press/v235/zhang24n.html; implements the merging of an evicted
    value into the following ones with a sampled probability, as its method section states
    it.
    """
    has_middle = False
    stats = ("acc",)
    wants_probs = True
    options = (Option("merge_span", int, 16, "the following tokens an evicted value merges into",
                      min=1),)
    description = "sinks + window; the evicted token's value is merged into the next ones, by chance"

    def __init__(self, *args, merge_span: int = 16, **kw):
        super().__init__(*args, **kw)
        self.merge_span = int(merge_span)

    def accumulate(self, p: Tensor, positions: Tensor) -> None:
        self.acc.add_(p.sum(dim=2))

    def remove(self, victim: Tensor, do: Tensor, cur: Tensor) -> None:
        B, H, C = self.pos.shape
        i = victim + self.n_fast
        pos_i = self.pos.gather(-1, i.unsqueeze(-1))
        # Middle-less: the ring holds every position after the leaving one up to the newest,
        # so the m that follow are the next m positions, each in its ring slot (a slot that
        # holds another position means fewer than m follow). m within the ring's length keeps
        # the m slots distinct.
        m = min(self.merge_span, self.ring_slots)
        after = pos_i + torch.arange(1, m + 1, device=pos_i.device)          # [B, H, m]
        nxt = self.fast_slot(after)
        follows = self.pos.gather(-1, nxt) == after
        count = follows.sum(-1, keepdim=True)
        a_next = (self.acc.gather(-1, nxt) * follows).sum(-1, keepdim=True) / count.clamp(min=1)
        a_i = self.acc.gather(-1, i.unsqueeze(-1))
        prob = torch.where(a_next > 0, (a_i / a_next.clamp(min=1e-30)).clamp(0, 1), 1.0)
        # Draws depend on (seed, layer, position, head), not on the batch row: a stream merges
        # the same way alone or batched with others (the sweep batches corpora), and a head
        # draws the same on any rank of a tensor-parallel run (by its global index).
        draw = uniform(self.rng_key, cur, H, self.head_offset) < prob
        merge = (do.unsqueeze(-1) & draw & (count > 0)).squeeze(-1)
        share = self.read_v(i) / count.clamp(min=1)  # [B, H, D]
        # Middle-less: the following tokens all sit in the fast region.
        D = self.v_fast.shape[-1]
        idx = nxt.unsqueeze(-1).expand(B, H, m, D)
        old = self.v_fast.gather(2, idx)
        add = (merge.unsqueeze(-1) & follows).unsqueeze(-1)
        put_slots(self.v, idx,  # the fast slots start at slot 0 of v
                  torch.where(add, (old.float() + share.unsqueeze(2)).to(old.dtype), old))
        self.evict(victim, do)

    def remove_bulk(self, victims: Tensor, do: Tensor, cur: Tensor) -> None:
        """Every token that left the window in the chunk goes at once, as the token steps take
        them in position order: each adds its value / count to the next m tokens present, later
        victims of the pass included, which pass on what they received when they go; the draw
        is the one the token step makes for it (at the position where it left the window). The
        chain over the pass's victims is one triangular solve."""
        B, H, C = self.pos.shape
        K, D = victims.shape[-1], self.v_fast.shape[-1]
        m = min(self.merge_span, C)
        gone = torch.zeros_like(self.pos, dtype=torch.bool).scatter(-1, victims, do)
        order = self.stay_order(victims, torch.zeros_like(do))  # every token present, by position
        # The victims in position order, so that a share only reaches later ones (a triangle).
        # Those that do not go last, at ranks C + k of their own: every rank distinct.
        key = torch.where(do, order.rank.gather(-1, victims),
                          C + torch.arange(K, device=victims.device))
        rank, by_rank = key.topk(K, dim=-1, largest=False)
        victims, do = (x.gather(-1, by_rank) for x in (victims, do))
        ranks = rank.unsqueeze(-1) + torch.arange(1, m + 1, device=victims.device)  # [B, H, K, m]
        follows = ranks < order.n.unsqueeze(-1)
        nxt = order.slot.gather(-1, ranks.clamp(max=C - 1).flatten(2)).view(B, H, K, m)
        count = follows.sum(-1, keepdim=True)
        a_next = (self.acc.gather(-1, nxt.flatten(2)).view(B, H, K, m) * follows).sum(
            -1, keepdim=True) / count.clamp(min=1)
        a_i = self.acc.gather(-1, victims).unsqueeze(-1)
        prob = torch.where(a_next > 0, (a_i / a_next.clamp(min=1e-30)).clamp(0, 1), 1.0)
        left_at = self.pos.gather(-1, victims) + self.window                  # [B, H, K]
        head = torch.arange(H, device=victims.device).view(1, H, 1) + self.head_offset
        draw = uniform_at(self.rng_key.view(-1, 1, 1), left_at, head) < prob.squeeze(-1)
        merge = do & draw & (count.squeeze(-1) > 0)
        per = merge.float() / count.squeeze(-1).clamp(min=1)                 # [B, H, K]

        # What each victim passes on, w = per * (its value + what earlier victims passed to it
        # within m ranks): (I - diag(per) band) w = per * v, one triangular solve. A last
        # channel of ones counts the shares, for the slots to write.
        gap = rank.unsqueeze(-1) - rank.unsqueeze(-2)                        # [B, H, K, K]
        chain = ((gap > 0) & (gap <= m)).float() * per.unsqueeze(-1)
        v = torch.cat([self.read_v(victims), torch.ones_like(per).unsqueeze(-1)], -1)
        w = torch.linalg.solve_triangular(-chain, v * per.unsqueeze(-1), upper=False,
                                          unitriangular=True)  # the unit diagonal: I - chain
        # Each w held at its victim's rank among the tokens present (distinct ranks: no two
        # writes race); each rank takes what the m ranks below it hold, by m shifted slices
        # (no [slots x victims] matrix).
        held = torch.zeros(B, H, m + C + K, D + 1, device=v.device).scatter(  # m rows of zeros
            2, (rank + m).unsqueeze(-1).expand(B, H, K, D + 1), w)          # below rank 0
        total = sum(held[:, :, m - s:m - s + C] for s in range(1, m + 1))    # [B, H, C, D + 1]
        total = total.gather(2, order.rank.unsqueeze(-1).expand(B, H, C, D + 1))  # by slot
        hit = (total[..., D] > 0) & (self.pos >= 0) & ~gone
        self.write_all_v(self.all_values() + total[..., :D], hit)
        super().remove_bulk(victims, do, cur)
