"""Speculative decoding over any cache, compressed or not: a draft guesses the next k tokens,
the target reads the pending token and the guesses in one step, and keeps the longest prefix it
agrees with, plus one token of its own.

Lossless. Each token of a verify step attends over exactly what it would attend over as a
single step, because nothing is compressed in between: a compressing cache compresses on a
schedule (`compression_interval` > 1, one pass every I positions, the tokens in between
waiting in staging slots), and a block never reaches past the position a pass falls on. The
target's caches keep the accepted tokens as if read one by one (statistics added token by
token, the pass run where it falls) and put back what the rejected ones overwrote
(KVCache.accept). Greedy output is therefore the target's own greedy output with the same
cache settings; sampling uses the standard rejection rule (accept a draft token x with
probability min(1, p(x) / q(x)), else draw from max(p - q, 0) normalised; a bonus token from
p after a full acceptance), so every token is distributed as the target's.

A draft has `propose(stream, k, temperature, top_k) -> (k guesses, their distributions [k, V]
or None for guesses made deterministically)`, and may have `read_stream(stream)` (read what the
session read, as its prefill) and `reset()`. Drafts:
    NgramDraft   prompt lookup: the tokens that followed the latest earlier occurrence of the
                 stream's last n-gram (no model; for copy-heavy text).
    ModelDraft   a model with its own caches: a smaller or quantized checkpoint with the same
                 vocabulary, or the target's own weights over a small compressed cache
                 (MagicDec). Its caches are only ever an approximation: rejected guesses may
                 leave traces there, which can lower the acceptance but never change the
                 output.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from caches import build_caches
from core.errors import UserError
from engine.runtime.prefill import read_prompt
from engine.runtime.sampling import distribution
from engine.runtime.steps import forward, run
from caches.region import RegionCache
from model import Transformer


def draw(p: Tensor) -> int:
    return int(torch.multinomial(p, 1))


class NgramDraft:
    """Prompt lookup: find the latest earlier occurrence of the stream's last `ngram` tokens
    (then of shorter n-grams, down to one token) and propose the tokens that followed it."""

    def __init__(self, ngram: int = 3):
        if ngram < 1:
            raise UserError(f"--ngram must be at least 1, got {ngram}")
        self.ngram = ngram

    def propose(self, stream: list, k: int, temperature: float, top_k) -> tuple:
        for n in range(min(self.ngram, len(stream) - 1), 0, -1):
            tail = stream[-n:]
            for start in range(len(stream) - n - 1, -1, -1):
                if stream[start:start + n] == tail:
                    return stream[start + n:start + n + k], None
        return [], None

    def read_stream(self, stream: list) -> None:
        """Nothing to read ahead: the lookup reads the stream as it guesses."""

    def describe(self) -> str:
        return f"prompt lookup ({self.ngram}-gram)"


class ModelDraft:
    """Guesses by a model with caches of its own (built by `make_cache`, one row). It remembers
    which stream tokens its caches have read, so that after a verification it goes back to the
    longest prefix it shares with the stream (its later positions are overwritten as the stream
    reaches them) and reads on from there."""

    def __init__(self, model: Transformer, make_cache, max_seq_length: int,
                 label: str = "draft model"):
        self.model, self.label = model, label
        self.max_seq_length = max_seq_length
        self.caches = build_caches(model, 1, max_seq_length, make_cache)
        self.unbounded = all(c.unbounded for c in self.caches)
        self.step_fn: Callable = forward
        self.read: list = []      # the stream tokens the caches hold, in order
        self.logits: Optional[Tensor] = None  # [1, V] after the last of them

    def reset(self) -> None:
        for cache in self.caches:
            cache.reset()
        self.read, self.logits = [], None

    def _step(self, token: int) -> None:
        dev = self.model.device
        pos = len(self.read)
        if not self.unbounded and pos >= self.max_seq_length:
            raise UserError(f"the stream outgrew the draft's {self.max_seq_length} positions; "
                            f"give the draft a compressing cache (--draft_cache streaming)")
        idx = torch.tensor([[token]], device=dev)
        self.logits = self.step_fn(self.model, idx, torch.tensor([[pos]], device=dev),
                                   self.caches)[:, -1]
        self.read.append(token)

    def read_stream(self, stream: list) -> None:
        """Read what the session has read (its prompt, a new turn), so that the first guess
        costs no prompt read: the read counts as the session's prefill."""
        self._catch_up(stream)

    def _catch_up(self, stream: list) -> None:
        same = 0
        for a, b in zip(self.read, stream[:-1]):  # the last is read again: its logits are gone
            if a != b:
                break
            same += 1
        if same < len(self.read):  # back to the shared prefix: the rest is overwritten later
            self.read, self.logits = self.read[:same], None
        missing = stream[same:]
        if len(missing) > 2:  # a prompt: read in chunks, as a session reads one
            dev = self.model.device
            self.logits = read_prompt(self.model, self.caches,
                                      torch.tensor([missing], device=dev),
                                      torch.tensor([[same]], device=dev), self.max_seq_length)
            self.read += missing
            return
        for token in missing:
            self._step(token)

    def propose(self, stream: list, k: int, temperature: float, top_k) -> tuple:
        self._catch_up(stream)
        tokens, dists = [], []
        for i in range(k):
            if temperature <= 0:
                token = int(self.logits[0].argmax())
            else:
                p = distribution(self.logits[0], temperature, top_k)
                token = draw(p)
                dists.append(p)
            tokens.append(token)
            if i < k - 1:
                self._step(token)
        return tokens, (torch.stack(dists) if dists else None)

    def describe(self) -> str:
        return self.label


@dataclass
class Speculation:
    """How a session speculates: the draft and how many tokens it guesses a step."""
    draft: object
    k: int = 4

    def __post_init__(self):
        if not 1 <= self.k <= 32:
            raise UserError(f"--speculate_k must be between 1 and 32, got {self.k}")


@dataclass
class Stats:
    """What speculation did over one generate call."""
    steps: int = 0       # verify steps
    drafted: int = 0     # tokens the draft proposed
    accepted: int = 0    # of them, tokens the target kept

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        """Tokens a verify step yields on average (accepted guesses + the target's own)."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0


def room_before_pass(caches, pos: int) -> int:
    """How many positions from `pos` on one step may read without crossing a compression: a
    region cache compresses after each position p with (p + 1) % interval == 0 (the block
    may end on one)."""
    intervals = [c.interval for c in caches if isinstance(c, RegionCache)]
    return min((i - pos % i for i in intervals), default=1 << 30)


def verify(model: Transformer, caches, tokens: list, pos: int, graph=None) -> Tensor:
    """Read tokens at positions pos.. as one step that keeps every option open (begin_verify);
    the logits [T, V] after each of them. The caller ends it with accept(n) on every cache."""
    dev = model.device
    idx = torch.tensor([tokens], device=dev)
    input_pos = torch.arange(pos, pos + len(tokens), device=dev).view(1, -1)
    for cache in caches:
        cache.begin_verify(input_pos)
    try:
        if graph is not None and len(tokens) == graph.rows:
            return graph(model, idx, input_pos, caches)[0]
        return run(model, idx, input_pos, caches)[0]
    except BaseException:
        for cache in caches:  # as if the step had not run
            cache.accept(0)
        raise


def judge(logits: Tensor, drafts: list, draft_probs: Optional[Tensor], temperature: float,
          top_k) -> list:
    """The tokens a verify step yields: the accepted drafts, then the target's own token
    (logits [T, V] after each of the block's T = len(drafts) + 1 tokens)."""
    out = []
    if temperature <= 0:
        best = logits.argmax(dim=-1).tolist()
        for i, d in enumerate(drafts):
            if best[i] != d:
                return out + [best[i]]
            out.append(d)
        return out + [best[len(drafts)]]
    p = distribution(logits, temperature, top_k)
    for i, d in enumerate(drafts):
        q = None if draft_probs is None or i >= len(draft_probs) else draft_probs[i]
        q_d = 1.0 if q is None else float(q[d])
        if float(torch.rand(())) * q_d < float(p[i, d]):  # accept with min(1, p / q)
            out.append(d)
            continue
        residual = p[i].clone()
        if q is None:
            residual[d] = 0.0
        else:
            residual = (residual - q).clamp(min=0)
        return out + [draw(residual / residual.sum())]
    return out + [draw(p[len(drafts)])]


def speculate(session, spec: Speculation, first: int, pos: int, max_new_tokens: int,
              temperature: float, top_k, eos: set, callback, stats: Stats) -> list:
    """Continue a one-row session whose token `first` (already given out) is pending at
    position `pos`: up to max_new_tokens more tokens, which are returned; every token but the
    last is read into the caches.

    Every verify step reads k + 1 tokens (one shape, one compiled graph): a draft that guesses
    fewer is padded with its last guess. What a step may keep is capped instead: by the tokens
    still wanted and the next compression pass (the last k positions of a bounded stream go
    by plain steps). Tokens past the cap are read
    and rejected; they cannot disturb the ones before them (each attends only to earlier
    positions) nor the tokens waiting for the pass (check: the ring has room for both)."""
    out, token, k = [], first, spec.k
    model, caches = session.model, session.caches
    while len(out) < max_new_tokens:
        cap = min(max_new_tokens - len(out), room_before_pass(caches, pos))
        # the block's positions must exist: near the end of a bounded stream, plain steps
        fits = session.unbounded or pos + k < session.max_seq_length
        stream = session.tokens[0] + [token]
        drafts, draft_probs = spec.draft.propose(stream, k, temperature, top_k) \
            if cap > 1 and fits else ([], None)
        drafts = drafts[:k]
        if not drafts:  # nothing to verify: a plain step
            idx = torch.tensor([[token]], device=model.device)
            logits = forward(model, idx, torch.tensor([[pos]], device=model.device), caches)
            made = judge(logits[0], [], None, temperature, top_k)
        else:
            if draft_probs is not None:
                draft_probs = draft_probs[:len(drafts)]
            guessed = min(len(drafts), cap - 1)
            drafts = drafts + drafts[-1:] * (k - len(drafts))
            logits = verify(model, caches, [token] + drafts, pos, session.verify_graph)
            made = judge(logits, drafts, draft_probs, temperature, top_k)[:cap]
            if eos:  # stop at the first EOS, reading nothing after it
                made = next((made[:i + 1] for i, t in enumerate(made) if t in eos), made)
            for cache in caches:
                cache.accept(len(made))
            stats.drafted += guessed
            stats.accepted += len(made) - 1
        stats.steps += 1
        session.tokens[0] += ([token] + drafts)[:len(made)]
        pos += len(made)
        token = made[-1]
        for t in made:
            out.append(t)
            if callback:
                callback(t)
        if eos and token in eos:
            break
    return out


class VerifyGraph:
    """The verify step of k + 1 tokens compiled."""

    def __init__(self, rows: int, backend="inductor"):
        self.rows = rows
        self.graph = torch.compile(run, fullgraph=True, dynamic=False, backend=backend)

    def __call__(self, model, idx, input_pos, caches):
        return self.graph(model, idx, input_pos, caches)


def check(session, spec: Speculation) -> None:
    """UserError where a session cannot speculate with `spec`."""
    if session.batch_size != 1:
        raise UserError("speculative decoding runs one stream: use batch size 1")
    for c in session.caches:
        if isinstance(c, RegionCache) and not 1 < c.interval <= c.chunk - spec.k:
            raise UserError(f"speculative decoding over a compressing cache needs it to "
                            f"compress on a schedule that leaves room for k + 1 tokens: "
                            f"`compression_interval` between 2 and the chunk ({c.chunk}) - "
                            f"k ({spec.k}), got {c.interval}")
    draft = spec.draft
    if isinstance(draft, ModelDraft) and \
            draft.model.args.vocab_size != session.model.args.vocab_size:
        raise UserError(f"the draft's vocabulary has {draft.model.args.vocab_size} tokens, the "
                        f"target's {session.model.args.vocab_size}: a draft must share the "
                        f"target's tokenizer")


def warm_up(session, temperature: float, top_k) -> None:
    """Run (and so compile) a verify step of k + 1 tokens and the draft's steps; the caller
    resets the session after."""
    k = session.speculation.k
    with torch.inference_mode():
        verify(session.model, session.caches, [0] * (k + 1), 0, session.verify_graph)
        for cache in session.caches:
            cache.accept(k + 1)
        draft = session.speculation.draft
        if isinstance(draft, ModelDraft):
            draft.propose([0, 0], k, temperature, top_k)
            draft.reset()
