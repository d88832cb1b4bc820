"""Passkey retrieval (Landmark Attention / LagKV style) over a haystack of real text.

A prompt of exactly L tokens: a short instruction, the haystack (real text) with the passkey
sentence inserted so that it starts at haystack token round(d * H), then the question. The
answer is read from a few greedily decoded tokens. Every prompt of one (policy, budget, length)
cell has the same length, so all trials and depths run as one batched prefill + decode.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Optional

from core.errors import UserError

PREFACE = ("There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
           "I will quiz you about the pass key.\n\n")
NEEDLE = "\nThe pass key is {key}. Remember it. {key} is the pass key.\n"
QUESTION = "\n\nWhat is the pass key? The pass key is"
NEW_TOKENS = 8  # " 71432." is 7 tokens for a digit-splitting tokenizer


class PromptTooShort(UserError):
    """A prompt length below what its fixed parts need; `least` is the shortest that fits."""

    def __init__(self, what: str, length: int, least: int, reason: str):
        super().__init__(f"{what} length {length} {reason}; use at least {least} tokens")
        self.what, self.length, self.least, self.reason = what, length, least, reason


@dataclass
class PasskeyPrompt:
    ids: list            # exactly `length` token ids
    key: int
    depth: float
    key_index: int       # token index of the passkey sentence's first token in ids
    haystack_len: int    # H: haystack tokens around the sentence


def make_keys(trials: int, seed: int) -> list:
    rng = random.Random(seed)
    return [rng.randrange(10000, 100000) for _ in range(trials)]


def haystack_offsets(trials: int, seed: int, pool_len: int, need: int) -> list:
    """Where each trial's haystack starts in the corpus ids (seeded, so cells share them)."""
    rng = random.Random(seed + 1)
    return [rng.randrange(0, pool_len - need + 1) for _ in range(trials)]


def place_needles(pre: list, haystack: list, needles: list, depths: list, question: list,
                  length: int, what: str) -> tuple:
    """pre + haystack + question, exactly `length` ids, with needles[i] inserted so that it
    starts at haystack token round(depths[i] * H) (H: the haystack tokens that fit; needles
    of equal depth keep their order). Returns (ids, each needle's start in ids, H)."""
    H = length - len(pre) - sum(len(n) for n in needles) - len(question)
    if H < 1:
        raise PromptTooShort(what, length, length - H + 1, "leaves no room for a haystack")
    if len(haystack) < H:
        raise UserError(f"the haystack text has {len(haystack)} tokens; length {length} needs {H}")
    ids, starts, cut = list(pre), [0] * len(needles), 0
    for i in sorted(range(len(needles)), key=lambda i: depths[i]):
        at = round(depths[i] * H)
        ids += haystack[cut:at]
        starts[i], cut = len(ids), at
        ids += needles[i]
    ids += haystack[cut:H] + question
    assert len(ids) == length
    return ids, starts, H


def build_prompt(tokenizer, haystack: list, length: int, depth: float, key: int) -> PasskeyPrompt:
    """haystack: corpus token ids, at least as many as the prompt needs."""
    if not 0.0 <= depth <= 1.0:
        raise UserError(f"passkey depth must be in [0, 1], got {depth}")
    ids, (start,), H = place_needles(tokenizer.encode(PREFACE), haystack,
                                     [tokenizer.encode(NEEDLE.format(key=key), bos=False)],
                                     [depth], tokenizer.encode(QUESTION, bos=False), length,
                                     "passkey")
    return PasskeyPrompt(ids=ids, key=key, depth=depth, key_index=start, haystack_len=H)


def parse_answer(text: str) -> Optional[int]:
    """The first run of digits in the model's continuation (None if it wrote none)."""
    m = re.search(r"\d+", text)
    return int(m.group()) if m else None


def haystack_slices(pool: list, trials: int, seed: int, max_length: int, what: str) -> list:
    """Trial i's haystack: max_length ids of pool from a seeded offset (drawn against the
    longest length of the run, so every length and policy sees the same text)."""
    if len(pool) < max_length:
        raise UserError(f"the haystack text has {len(pool)} tokens, fewer than the longest "
                        f"{what} length {max_length}; use a longer text or shorter --lengths")
    return [pool[off:off + max_length]
            for off in haystack_offsets(trials, seed, len(pool), max_length)]


def build_cell_prompts(tokenizer, pool: list, length: int, depths: list, trials: int,
                       seed: int, max_length: int) -> list:
    """trials x depths prompts of `length` tokens; trial i uses key i and haystack i for every
    depth, length and policy."""
    keys = make_keys(trials, seed)
    slices = haystack_slices(pool, trials, seed, max_length, "passkey")
    return [build_prompt(tokenizer, hay, length, d, key)
            for key, hay in zip(keys, slices) for d in depths]


def decode_greedy(model, tokenizer, make_cache, prompts: list, new_tokens: int,
                  compile: bool = False, batch_size: Optional[int] = None,
                  what: str = "prompt") -> tuple:
    """Greedy-decode prompts (lists of ids, all of one length) in batches of at most batch_size
    rows (a short last batch is padded with repeats). Returns (texts, seconds, cache bytes of
    one row)."""
    import time

    from engine.runtime.generation import Generator

    length = len(prompts[0])
    context = model.args.max_position_embeddings
    if length + new_tokens > context:
        raise UserError(f"{what} length {length} + {new_tokens} new tokens exceeds the model's "
                        f"context of {context}")
    rows = batch_size or len(prompts)
    t0 = time.perf_counter()
    gen = Generator(model, max_seq_length=length + new_tokens, batch_size=rows,
                    make_cache=make_cache, compile=compile)
    texts = []
    for start in range(0, len(prompts), rows):
        part = list(prompts[start:start + rows])
        n_real = len(part)
        part += [part[-1]] * (rows - n_real)
        out = gen.generate(part, max_new_tokens=new_tokens, temperature=0.0,
                           eos_ids=tokenizer.eos_ids)
        texts += [tokenizer.decode(ids) for ids in out.new_ids[:n_real]]
    return texts, round(time.perf_counter() - t0, 3), gen.cache_bytes // rows


def run_cell(model, tokenizer, make_cache, prompts: list, new_tokens: int = NEW_TOKENS,
             compile: bool = False, batch_size: Optional[int] = None) -> dict:
    """Greedy-decode every prompt (batched, at most batch_size rows per batch); return accuracy
    overall and per depth, and the answers."""
    texts, seconds, cache_bytes = decode_greedy(model, tokenizer, make_cache,
                                                [p.ids for p in prompts], new_tokens, compile,
                                                batch_size, "passkey")
    answers, by_depth = [], {}
    for p, text in zip(prompts, texts):
        ok = parse_answer(text) == p.key
        answers.append({"depth": p.depth, "key": p.key, "answer": text, "correct": ok})
        by_depth.setdefault(str(p.depth), []).append(ok)
    return {"accuracy": sum(a["correct"] for a in answers) / len(answers),
            "by_depth": {d: sum(v) / len(v) for d, v in by_depth.items()},
            "answers": answers, "seconds": seconds, "cache_bytes": cache_bytes}
