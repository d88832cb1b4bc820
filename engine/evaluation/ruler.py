"""Synthetic long-context tasks in the manner of the RULER benchmark, generated offline.

Four tasks, each a seeded generator of prompts of exactly L tokens (so every trial of one
(task, length) cell runs as one batched prefill + greedy decode, like passkey prompts) and a
scorer of the decoded answer:

    niah_multikey      4 key/number needles in real text; asked for one key's number
    niah_multivalue    one key with 4 numbers spread through real text; asked for all of them
    variable_tracking  two chains of 5 assignments (VAR A = 12345, VAR B = VAR A, ...) in real
                       text; asked for every variable holding the first chain's value
    common_words       a numbered list of made-up words, 10 frequent and the rest rare; asked
                       for the 10 frequent ones

A score is the fraction of the expected strings present in the answer as whole words, case
ignored (niah_multikey expects one string, so it scores 0 or 1). Trial i of a task uses the same
keys, values and needle depths at every length, and haystack i of the passkey task.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from functools import lru_cache

from core.errors import UserError
from engine.evaluation.passkey import PromptTooShort, decode_greedy, haystack_slices, place_needles

NIAH_PREFACE = ("Some special magic numbers are hidden inside the following text. Find them and "
                "memorize them. I will ask you about them afterwards.\n\n")
NIAH_NEEDLE = "\nOne of the special magic numbers for {key} is: {value}.\n"
MULTIKEY_QUESTION = ("\n\nWhat is the special magic number for {key} in the text above? The "
                     "special magic number for {key} is")
MULTIVALUE_QUESTION = ("\n\nWhat are all the special magic numbers for {key} in the text above? "
                       "The special magic numbers for {key} are")
VT_PREFACE = ("Memorize the chains of variable assignments hidden in the following text. I will "
              "ask you about them afterwards.\n\n")
VT_VALUE = "\nVAR {name} = {value}\n"
VT_COPY = "\nVAR {name} = VAR {source}\n"
VT_QUESTION = ("\n\nQuestion: Find every variable that is assigned the value {value} in the text "
               "above, directly or through other variables. Answer: The {n} variables assigned "
               "the value {value} are:")
CW_PREFACE = ("Below is a numbered list of words. Some words appear many times, the others only "
              "a few times. Memorize the ones that appear most often.\n\n")
CW_ITEM = "{n}. {word}\n"
CW_QUESTION = ("\nQuestion: What are the {k} most common words in the list above? Answer: The "
               "{k} most common words in the list are:")

MULTIKEY_KEYS = 4      # needles in niah_multikey: the asked key and 3 distractors
MULTIVALUE_VALUES = 4  # numbers of the one key in niah_multivalue
VT_CHAINS = 2          # the asked chain and a distractor chain with another value
VT_HOPS = 4            # assignments after the first: 5 variables per chain
CW_COMMON = 10         # frequent words asked for
CW_RARE = 2            # how often each rare word appears
CW_MIN_COMMON = 4      # the least a frequent word appears (twice a rare word's count)
CW_COMMON_SHARE = 0.4  # share of the list's items taken by the frequent words


@dataclass(frozen=True)
class Task:
    new_tokens: int      # room for a perfect answer (counted on SmolLM2's tokenizer) + slack
    haystack: bool       # needs real text around its needles


# new_tokens: " 1234567." is 9 tokens; four numbers 36; five names ~22; ten words ~34 as a
# comma list, ~60 as a numbered one.
TASKS = {"niah_multikey": Task(12, True), "niah_multivalue": Task(48, True),
         "variable_tracking": Task(32, True), "common_words": Task(64, False)}


@dataclass
class RulerPrompt:
    task: str
    ids: list                  # exactly `length` token ids
    expected: list             # strings a perfect answer contains; score = fraction present
    needles: list = field(default_factory=list)  # (start in ids, needle ids), inserted ones
    depths: list = field(default_factory=list)   # each needle's depth in the haystack
    haystack_len: int = 0      # H: haystack tokens around the needles


def parse_tasks(names: list, where: str) -> list:
    """Task names, checked and de-duplicated in order."""
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise UserError(f"{where}: name at least one task ({', '.join(TASKS)})")
    for name in names:
        if name not in TASKS:
            raise UserError(f"{where}: unknown task {name!r}; choose from {', '.join(TASKS)}")
    return list(dict.fromkeys(names))


def score(text: str, expected: list) -> float:
    """The fraction of `expected` present in text as whole words (no letter or digit touching
    either end), case ignored: 1234567 is not found in 12345678, nor "bavo" in "bavolin"."""
    found = sum(re.search(rf"(?<![a-z0-9]){re.escape(e)}(?![a-z0-9])", text, re.IGNORECASE)
                is not None for e in expected)
    return found / len(expected)


# ---------------------------------------------------------------------------------------------
# Made-up words: consonant-vowel syllables, a fixed sequence (no word list to download)

CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"
ENDINGS = ("", "", "", "l", "n", "r", "s", "t")


@lru_cache(maxsize=8)
def words(n: int) -> tuple:
    """The first n distinct words of one fixed pseudo-random sequence (so words(k) is a prefix
    of words(n) for k < n): 2 or 3 syllables, sometimes a final consonant."""
    rng = random.Random(20240613)
    out, seen = [], set()
    while len(out) < n:
        w = "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS)
                    for _ in range(rng.choice((2, 3)))) + rng.choice(ENDINGS)
        if w not in seen:
            seen.add(w)
            out.append(w)
    return tuple(out)


def _trial_rng(task: str, seed: int, trial: int) -> random.Random:
    # Seeded by task, seed and trial only: a trial's keys, values and depths are the same at
    # every length, policy and budget.
    return random.Random(f"{task}:{seed}:{trial}")


def _numbers(rng: random.Random, k: int, digits: int) -> list:
    return [str(v) for v in rng.sample(range(10 ** (digits - 1), 10 ** digits), k)]


def _keys(rng: random.Random, k: int) -> list:
    pool = words(512)
    keys = set()
    while len(keys) < k:
        keys.add(f"{rng.choice(pool)}-{rng.choice(pool)}")
    return sorted(keys)


def _needle_prompt(task, tokenizer, haystack, length, preface, needles, depths, question,
                   expected) -> RulerPrompt:
    needle_ids = [tokenizer.encode(n, bos=False) for n in needles]
    ids, starts, H = place_needles(tokenizer.encode(preface), haystack, needle_ids, depths,
                                   tokenizer.encode(question, bos=False), length, task)
    return RulerPrompt(task=task, ids=ids, expected=expected,
                       needles=list(zip(starts, needle_ids)), depths=list(depths),
                       haystack_len=H)


def niah_multikey(tokenizer, haystack: list, length: int, rng: random.Random) -> RulerPrompt:
    keys = _keys(rng, MULTIKEY_KEYS)
    rng.shuffle(keys)  # which key sits at which depth
    values = _numbers(rng, MULTIKEY_KEYS, 7)
    depths = sorted(rng.random() for _ in keys)
    asked = rng.randrange(MULTIKEY_KEYS)
    return _needle_prompt("niah_multikey", tokenizer, haystack, length, NIAH_PREFACE,
                          [NIAH_NEEDLE.format(key=k, value=v) for k, v in zip(keys, values)],
                          depths, MULTIKEY_QUESTION.format(key=keys[asked]), [values[asked]])


def niah_multivalue(tokenizer, haystack: list, length: int, rng: random.Random) -> RulerPrompt:
    (key,) = _keys(rng, 1)
    values = _numbers(rng, MULTIVALUE_VALUES, 7)
    depths = sorted(rng.random() for _ in values)
    return _needle_prompt("niah_multivalue", tokenizer, haystack, length, NIAH_PREFACE,
                          [NIAH_NEEDLE.format(key=key, value=v) for v in values], depths,
                          MULTIVALUE_QUESTION.format(key=key), values)


def variable_tracking(tokenizer, haystack: list, length: int,
                      rng: random.Random) -> RulerPrompt:
    names = set()
    while len(names) < VT_CHAINS * (VT_HOPS + 1):
        names.add("".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5)))
    names = sorted(names)
    rng.shuffle(names)
    values = _numbers(rng, VT_CHAINS, 5)
    chains = [names[c * (VT_HOPS + 1):(c + 1) * (VT_HOPS + 1)] for c in range(VT_CHAINS)]
    statements = [[VT_VALUE.format(name=chain[0], value=value)]
                  + [VT_COPY.format(name=b, source=a) for a, b in zip(chain, chain[1:])]
                  for chain, value in zip(chains, values)]
    # Interleave the chains at random, each in its own order, over sorted depths: every
    # assignment comes after the one it copies.
    order = [c for c in range(VT_CHAINS) for _ in range(VT_HOPS + 1)]
    rng.shuffle(order)
    needles = [statements[c].pop(0) for c in order]
    depths = sorted(rng.random() for _ in needles)
    return _needle_prompt("variable_tracking", tokenizer, haystack, length, VT_PREFACE,
                          needles, depths,
                          VT_QUESTION.format(value=values[0], n=VT_HOPS + 1), list(chains[0]))


def common_words(tokenizer, haystack, length: int, rng: random.Random) -> RulerPrompt:
    """CW_COMMON words CW_MIN_COMMON or more times each (about CW_COMMON_SHARE of the items),
    then as many rare words CW_RARE times each as fit, shuffled and numbered one per line; what
    the list leaves over (fewer tokens than one more rare word) is single-token filler before
    the question. The words and the order for given counts do not depend on the length, so
    the shortest length the error names does hold the list."""
    pre = tokenizer.encode(CW_PREFACE)
    question = tokenizer.encode(CW_QUESTION.format(k=CW_COMMON), bos=False)
    budget = length - len(pre) - len(question)
    filler = _filler(tokenizer)
    order_seed = rng.random()
    common = rng.sample(words(1024), CW_COMMON)
    # Rare words in the fixed sequence's own order from a per-trial start: a longer list only
    # adds words at the end. An item is at least 2 tokens, which bounds how many can fit.
    start = rng.randrange(1024)
    need = max(CW_COMMON, budget // (2 * CW_RARE) + 1)
    rare = [w for w in words(start + need + CW_COMMON)[start:] if w not in common][:need]
    item_ids = {}

    def build(times: int, n_rare: int) -> list:
        items = [w for w in common for _ in range(times)]
        items += [w for w in rare[:n_rare] for _ in range(CW_RARE)]
        random.Random(f"{order_seed}:{times}:{n_rare}").shuffle(items)
        ids = []
        for n, w in enumerate(items, 1):
            text = CW_ITEM.format(n=n, word=w)
            if text not in item_ids:
                item_ids[text] = tokenizer.encode(text, bos=False)
            ids += item_ids[text]
        return ids

    def most_rare(times: int) -> int:
        """The most rare words that fit beside the frequent ones (-1: not even those)."""
        lo, hi = -1, len(rare) + 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if len(build(times, mid)) <= budget else (lo, mid)
        return lo

    guess = max(0, budget) / 7  # items, at about 7 tokens each ("123. word" and a newline)
    for times in dict.fromkeys((max(CW_MIN_COMMON, round(CW_COMMON_SHARE * guess / CW_COMMON)),
                                CW_MIN_COMMON)):
        n_rare = most_rare(times)
        if n_rare >= CW_COMMON:
            break
    else:
        least = len(pre) + len(question) + len(build(CW_MIN_COMMON, CW_COMMON))
        raise PromptTooShort("common_words", length, least, f"is too short for {CW_COMMON} "
                             f"frequent and {CW_COMMON} rare words")
    body = build(times, n_rare)
    ids = pre + body + [filler] * (budget - len(body)) + question
    assert len(ids) == length
    return RulerPrompt(task="common_words", ids=ids, expected=common)


def _filler(tokenizer) -> int:
    for text in ("\n", " ", "."):
        ids = tokenizer.encode(text, bos=False)
        if len(ids) == 1:
            return ids[0]
    raise UserError("the tokenizer has no single-token newline, space or period to pad "
                    "common_words prompts with")


BUILDERS = {"niah_multikey": niah_multikey, "niah_multivalue": niah_multivalue,
            "variable_tracking": variable_tracking, "common_words": common_words}


def build_prompt(task: str, tokenizer, haystack, length: int, seed: int,
                 trial: int) -> RulerPrompt:
    """Trial `trial` of `task` at `length` tokens; haystack: corpus ids (unused by
    common_words), at least as many as the prompt needs."""
    return BUILDERS[task](tokenizer, haystack, length, _trial_rng(task, seed, trial))


def build_cell_prompts(tokenizer, pool: list, task: str, length: int, trials: int, seed: int,
                       max_length: int) -> list:
    """`trials` prompts of `length` tokens; trial i reads haystack i (passkey's offsets). A
    length too short names the shortest that holds every trial (needles differ in tokens)."""
    slices = (haystack_slices(pool, trials, seed, max_length, "ruler") if TASKS[task].haystack
              else [None] * trials)
    prompts, short = [], []
    for i, hay in enumerate(slices):
        try:
            prompts.append(build_prompt(task, tokenizer, hay, length, seed, i))
        except PromptTooShort as e:
            short.append(e)
    if short:
        worst = max(short, key=lambda e: e.least)
        raise PromptTooShort(task, length, worst.least, worst.reason)
    return prompts


def run_cell(model, tokenizer, make_cache, prompts: list, new_tokens: int,
             compile: bool = False, batch_size=None) -> dict:
    """Greedy-decode the cell's prompts as one batch (at most batch_size rows at a time);
    return the mean score and each answer."""
    texts, seconds, cache_bytes = decode_greedy(model, tokenizer, make_cache,
                                                [p.ids for p in prompts], new_tokens, compile,
                                                batch_size, prompts[0].task)
    answers = [{"expected": p.expected, "answer": text, "score": score(text, p.expected)}
               for p, text in zip(prompts, texts)]
    return {"score": sum(a["score"] for a in answers) / len(answers), "answers": answers,
            "seconds": seconds, "cache_bytes": cache_bytes}
