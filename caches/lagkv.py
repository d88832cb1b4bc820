import math

import torch
from torch import Tensor

from caches.base import Option, put_slots
from caches.region import RegionCache
from core.errors import UserError


class LagKVCache(RegionCache):
    """LagKV (Liang et al., 2025): attention-free. Tokens after the sink are cut into lag
    partitions of L tokens; once partition j has a complete successor j+1, each of its tokens is
    scored from the successor's per-channel min/max: normalize K and V by them, take the std over
    channels, softmax within the partition, score = K part + V part. The top ratio * L tokens per
    head are kept (they enter the middle when they leave the window); the rest are dropped as
    they leave; a middle over its share drops its lowest-scored tokens.

    State: lag_score [B, Hkv, C], keep [B, Hkv, C] (1 = selected). Options: lag L (default
    window // 2), lag_keep_ratio (default 0.5).

    A partition is scored at one position in L, so the host tells a decode step whether it
    completes one in some row (`before_step`): the compiled step has a variant without the
    scoring for the other L - 1 positions (the scoring is masked by row either way). Prompt
    chunks always score (one compiled compression step serves them).

    Paper: LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are Important,
    https://arxiv.org/abs/2504.04704; implements the lag-relative score of its method
    section.
    """
    stats = ("lag_score", "keep")
    # lag's range depends on the window: check_options tests it
    options = (Option("lag", int, None, "lag partition length in tokens (default window // 2)"),
               Option("lag_keep_ratio", float, 0.5, "share of a partition kept", above=0, max=1))
    description = "attention-free: score lag partitions by their successor's min/max, keep the top"
    # A partition is scored before its tokens leave the window (L <= window / 2), and an
    # unselected token (-inf) goes at the step it leaves: the bulk pass is the token steps.
    exact_bulk = True

    @classmethod
    def check_options(cls, window: int, lag=None, lag_keep_ratio: float = 0.5) -> None:
        lag = window // 2 if lag is None else lag
        if not 1 <= lag <= window // 2:
            raise UserError(f"`lag` must be between 1 and window // 2 = {window // 2} (two lag "
                            f"partitions must fit the window), got {lag}")

    scheduled = True

    def __init__(self, *args, lag=None, lag_keep_ratio: float = 0.5, **kw):
        super().__init__(*args, **kw)
        self.lag_len = int(lag) if lag is not None else self.window // 2
        self.n_keep = max(1, math.ceil(lag_keep_ratio * self.lag_len))
        self.scoring = True  # this step may complete a partition (host-set)

    def completes(self, p: int) -> bool:
        """Whether the token at position p completes a partition with a predecessor."""
        done = p - self.sink + 1
        return done % self.lag_len == 0 and done >= 2 * self.lag_len

    def before_step(self, first: list, last: list) -> None:
        super().before_step(first, last)
        self.scoring = any(a != b or self.completes(b) for a, b in zip(first, last))

    def after_step(self) -> None:
        super().after_step()
        self.scoring = True

    def warmup_positions(self) -> tuple:
        first = 2 * self.lag_len + self.sink - 1
        reachable = self.unbounded or first < self.rope.shape[0]
        return super().warmup_positions() + ((first,) if reachable else ())

    def before_compress(self, cur: Tensor) -> None:
        if self.scoring:
            self.score_partition(cur, True)

    def before_bulk(self, cur: Tensor) -> None:
        self.score_completed(cur, self.chunk)

    def after_load(self, cur: Tensor) -> None:
        # The middle holds chosen tokens; the window's partitions are scored as if its tokens
        # had just arrived.
        middle = torch.arange(self.capacity, device=cur.device) >= self.n_fast
        self.keep.masked_fill_(middle & (self.pos >= 0), 1.0)
        self.score_completed(cur, self.window)

    def score_completed(self, cur: Tensor, span: int) -> None:
        """Score every partition whose successor was completed by the last `span` tokens up to
        cur (at most ceil(span / L) of them)."""
        L = self.lag_len
        last_end = cur - (cur - self.sink + 1) % L  # the latest completion point <= cur
        for p in range(-(-span // L)):
            end = last_end - p * L
            self.score_partition(end, (end > cur - span).view(-1, 1, 1))

    def score_partition(self, cur: Tensor, within) -> None:
        """If a successor partition ends at cur [B, 1, 1] (and `within`), score its
        predecessor."""
        L = self.lag_len
        cur = cur.view(-1, 1)  # [B, 1]
        done = cur - self.sink + 1  # tokens after the sink, this one included
        ready = (((done % L) == 0) & (done >= 2 * L)).unsqueeze(-1) & within  # [B, 1, 1]
        # Partition j ends L tokens before cur; its successor ends at cur (slots [B, L]).
        ar = torch.arange(L, device=cur.device)
        part = self.fast_slot((cur - 2 * L + 1 + ar).clamp(min=self.sink))
        succ = self.fast_slot((cur - L + 1 + ar).clamp(min=self.sink))
        score = (self.channel_score(self.k_fast, part, succ)
                 + self.channel_score(self.v_fast, part, succ))  # [B, H, L]
        top = score.topk(self.n_keep, dim=-1).indices
        keep = torch.zeros_like(score).scatter_(-1, top, 1.0)
        slots = part.unsqueeze(1).expand_as(score)
        for stat, new in ((self.lag_score, score), (self.keep, keep)):
            old = stat.gather(2, slots)
            put_slots(stat, slots, torch.where(ready, new, old))

    @staticmethod
    def channel_score(x: Tensor, part: Tensor, succ: Tensor) -> Tensor:
        """x [B, H, S, D], slots part/succ [B, L] -> score [B, H, L]."""
        def rows(slots):
            B, H, _, D = x.shape
            return x.gather(2, slots.view(B, 1, -1, 1).expand(B, H, -1, D)).float()
        ref = rows(succ)
        lo, hi = ref.amin(dim=2, keepdim=True), ref.amax(dim=2, keepdim=True)
        normed = (rows(part) - lo) / (hi - lo).clamp(min=1e-6)
        return torch.softmax(normed.std(dim=-1), dim=-1)

    def score(self, cur: Tensor) -> Tensor:
        # Unselected tokens score -inf so they go first, and go even when the middle has room.
        return torch.where(self.keep > 0, self.lag_score, float("-inf"))

    def must_remove(self, valid: Tensor, score: Tensor, victim: Tensor) -> Tensor:
        dropped = score.gather(-1, victim.unsqueeze(-1)).squeeze(-1) == float("-inf")
        return (valid.sum(-1) > self.middle) | dropped
