"""Streaming perplexity (its protocol: docs/DESIGN.md, Evaluation), one stream or a batch of them.

The text streams through the decode step one token at a time, exactly as generation sees it:
token t is scored from the logits of step t - 1, before it enters the cache. With `full` this
equals teacher-forced perplexity; with a compressing cache it measures what the policy keeps.

Independent streams of equal length share one batched decode step (batch row = stream); every
cache keeps per-row state, so each row scores exactly as it would alone.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import Tensor

from core.errors import UserError
from engine.runtime.steps import forward
from model import Transformer

ROOT = Path(__file__).resolve().parents[2]
CORPUS_DIR = ROOT / "data" / "corpora"
CORPUS_NAMES = ("kjv", "wiki")  # what scripts/prepare_corpora.py writes (tested to agree)


def score_step(model: Transformer, caches, token: Tensor, input_pos: Tensor, target: Tensor
               ) -> Tensor:
    """Feed token [B, 1] at input_pos [1]; return the NLL [B] of target [B] (the next token)."""
    logits = forward(model, token, input_pos, caches)[:, -1]
    return -torch.log_softmax(logits, dim=-1).gather(-1, target.view(-1, 1)).view(-1)


def compile_step(fn, model: Transformer, caches, rows: int = 1):
    """Compile a decode-style step of `rows` streams for the model's device
    (engine.runtime.generation.compile_decode)."""
    from engine.runtime.generation import compile_decode
    return compile_decode(fn, model, caches=caches, rows=rows)


@torch.inference_mode()
def warmup(model: Transformer, caches, step, batch_size: int) -> float:
    """Run (compile) the step so timings exclude compilation; caches are reset after."""
    from engine.runtime.generation import warmup_positions
    dev = model.device
    t0 = time.perf_counter()
    token = torch.zeros(batch_size, 1, dtype=torch.long, device=dev)
    for t in warmup_positions(caches):
        step(model, caches, token, torch.tensor([t], device=dev), token.view(-1))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    for cache in caches:
        cache.reset()
    return time.perf_counter() - t0


@dataclass
class PerplexityResult:
    nll: float
    ppl: float
    tokens: int          # scored tokens (ids - 1)
    seconds: float       # wall time of the (possibly batched) run this stream was part of
    curve: list          # running log-perplexity after each scored token
    nlls: list           # the NLL of each scored token (token t + 1 from step t)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def streaming_perplexity(model: Transformer, caches, ids: list, step=score_step,
                         progress: Optional[Callable] = None, prompt: int = 0
                         ) -> PerplexityResult:
    """ids: token ids of the text; caches (caches.build_caches) of batch 1. step may be
    compiled; prompt: as batched_streaming_perplexity."""
    return batched_streaming_perplexity(model, caches, [ids], step, progress, prompt)[0]


@torch.inference_mode()
def batched_streaming_perplexity(model: Transformer, caches, streams: list, step=score_step,
                                 progress: Optional[Callable] = None, prompt: int = 0) -> list:
    """streams: B token-id lists of equal length; caches (caches.build_caches) of batch B.

    prompt > 0: the first `prompt` tokens are read as one prompt, as generation reads it (the
    caches' prompt compression), and only the tokens after it are scored.
    progress(n, nlls) is called after every step with n scored positions and nlls [n, B]."""
    from engine.runtime.generation import read_prompt
    B, n = _stream_shape(streams)
    if not 0 <= prompt < n:
        raise UserError(f"a prompt of {prompt} tokens leaves nothing to score in {n}; give "
                        f"fewer than {n}")
    device = model.device
    # [n, B] so that every step's tokens are one contiguous row (compiled graphs guard strides)
    ids_t = torch.tensor(streams, device=device).T.contiguous()
    for cache in caches:
        cache.reset()
    nlls = torch.empty(n - max(prompt, 1), B, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    if prompt:  # token `prompt` is scored from the prompt's own logits
        logits = read_prompt(model, caches, ids_t[:prompt].T.contiguous(),
                             torch.zeros(B, 1, dtype=torch.long, device=device), n)
        nlls[0] = -torch.log_softmax(logits.float(), dim=-1).gather(
            -1, ids_t[prompt].view(B, 1)).view(-1)
    for t in range(max(prompt, 0), n - 1):
        # the NLL of token t + 1 comes from step t's logits, before t + 1 enters the cache
        i = t - prompt + (1 if prompt else 0)
        nlls[i] = step(model, caches, ids_t[t].view(B, 1), ids_t.new_tensor([t]), ids_t[t + 1])
        if progress is not None:
            progress(i + 1, nlls[: i + 1])
    return _results(nlls, time.perf_counter() - t0)


def _stream_shape(streams: list) -> tuple[int, int]:
    """(B, n) of B token-id lists of equal length n >= 2; UserError otherwise."""
    B = len(streams)
    n = len(streams[0]) if streams else 0
    if B == 0 or any(len(s) != n for s in streams):
        raise UserError("batched perplexity needs one or more streams of equal length "
                        f"(got lengths {sorted({len(s) for s in streams})})")
    if n < 2:
        raise UserError(f"the text has {n} token(s); perplexity needs at least 2")
    return B, n


def _results(nlls: Tensor, seconds: float) -> list:
    """One PerplexityResult per stream from the NLLs [n - 1, B] of a run."""
    steps = torch.arange(1, nlls.shape[0] + 1, device=nlls.device, dtype=torch.float64)
    curves = (nlls.double().cumsum(0) / steps.view(-1, 1)).T.tolist()
    return [PerplexityResult(nll=c[-1], ppl=math.exp(c[-1]), tokens=nlls.shape[0],
                             seconds=seconds, curve=c, nlls=row)
            for c, row in zip(curves, nlls.T.tolist())]


@torch.inference_mode()
def batched_full_perplexity(model: Transformer, caches, streams: list, chunk: int = 256,
                            progress: Optional[Callable] = None) -> list:
    """batched_streaming_perplexity for caches that keep every token (`full`): a causal
    forward over `chunk` tokens at a time gives the logits of all of them at once, the same
    logits the token-by-token loop computes (up to float rounding: tests/test_eval.py), in a
    fraction of the time (the loop attends one query at a time over the whole static buffer)."""
    if not all(c.keeps_every_token and c.prefill_chunk is None for c in caches):
        raise ValueError("batched_full_perplexity needs caches that keep every token")
    B, n = _stream_shape(streams)
    device = model.device
    ids = torch.tensor(streams, device=device)
    for cache in caches:
        cache.reset()
    nlls = torch.empty(n - 1, B, device=device)
    t0 = time.perf_counter()
    for s in range(0, n - 1, chunk):
        e = min(s + chunk, n - 1)
        logits = forward(model, ids[:, s:e], torch.arange(s, e, device=device), caches)
        logp = torch.log_softmax(logits.float(), dim=-1)
        nlls[s:e] = -logp.gather(-1, ids[:, s + 1:e + 1, None])[..., 0].T
        if progress is not None:
            progress(e, nlls[:e])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return _results(nlls, time.perf_counter() - t0)


def corpus_path(name: str, corpus_dir=None) -> Path:
    """data/corpora/NAME.txt (or NAME.txt in corpus_dir), with a clear error when absent."""
    directory = Path(corpus_dir) if corpus_dir is not None else CORPUS_DIR
    path = directory / f"{name}.txt"
    if path.is_file():
        return path
    if name in CORPUS_NAMES:
        out = f" --out {directory}" if corpus_dir is not None else ""
        raise UserError(f"corpus {name!r} is not prepared ({path} is missing); run "
                        f"`python scripts/prepare_corpora.py{out}`")
    raise UserError(f"unknown corpus {name!r}; choose one of {', '.join(CORPUS_NAMES)} "
                    f"(or put NAME.txt in {directory})")


def read_text(path, what: str = "--text_file") -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{what} {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {what} {str(path)!r}: {e}") from None
    if not text.strip():
        raise UserError(f"{what} {str(path)!r} is empty")
    return text


def encode_prefix(tokenizer, text: str, max_tokens: Optional[int]) -> list:
    """The first max_tokens ids of the whole text's encoding (all of them if None), without
    tokenizing a million-token book: encode a growing prefix until it has a margin of tokens
    past max_tokens (the pre-tokenizer splits locally, so the kept ids cannot change)."""
    if max_tokens is None:
        return tokenizer.encode(text)
    chars = 8 * max_tokens + 256
    while chars < len(text):
        ids = tokenizer.encode(text[:chars])
        if len(ids) >= max_tokens + 64:
            return ids[:max_tokens]
        chars *= 2
    return tokenizer.encode(text)[:max_tokens]


def downsample_curve(curve: list, points: int = 256) -> dict:
    """Running log-ppl at about `points` positions (always including the last), for storage."""
    stride = max(1, math.ceil(len(curve) / points))
    idx = list(range(stride - 1, len(curve), stride))
    if idx[-1] != len(curve) - 1:
        idx.append(len(curve) - 1)
    return {"position": [i + 1 for i in idx], "log_ppl": [round(curve[i], 6) for i in idx]}
