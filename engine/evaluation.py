"""Streaming perplexity (DESIGN-NOTES section 4).

The text streams through the decode step one token at a time, exactly as generation sees it:
token t is scored from the logits of step t - 1, before it enters the cache. With `full` this
equals teacher-forced perplexity; with a compressing cache it measures what the policy keeps.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from engine.errors import UserError
from model import Transformer


def score_step(model: Transformer, token: Tensor, input_pos: Tensor, target: Tensor) -> Tensor:
    """Feed token [B, 1] at input_pos [1]; return the NLL [B] of target [B] (the next token)."""
    logits = model(token, input_pos)[:, -1]
    return -torch.log_softmax(logits, dim=-1).gather(-1, target.view(-1, 1)).view(-1)


@dataclass
class PerplexityResult:
    nll: float
    ppl: float
    tokens: int          # scored tokens (ids - 1)
    seconds: float
    curve: list          # running log-perplexity after each scored token

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


@torch.inference_mode()
def streaming_perplexity(model: Transformer, ids: list, step=score_step,
                         progress: Optional[callable] = None) -> PerplexityResult:
    """ids: token ids of the text; caches must be set up (batch 1). step may be compiled."""
    if len(ids) < 2:
        raise UserError(f"the text has {len(ids)} token(s); perplexity needs at least 2")
    device = model.output.weight.device
    ids_t = torch.tensor(ids, device=device)
    model.reset_caches()
    nlls = torch.empty(len(ids) - 1, device=device)
    t0 = time.perf_counter()
    for t in range(len(ids) - 1):
        nlls[t] = step(model, ids_t[t].view(1, 1), ids_t[t].new_tensor([t]), ids_t[t + 1])[0]
        if progress is not None:
            progress(t + 1, nlls[: t + 1])
    curve = (nlls.double().cumsum(0) / torch.arange(1, len(ids), device=device)).tolist()
    seconds = time.perf_counter() - t0
    nll = curve[-1]
    return PerplexityResult(nll=nll, ppl=math.exp(nll), tokens=len(ids) - 1, seconds=seconds,
                            curve=curve)
