"""Speculative decoding (engine/runtime/speculative.py): lossless over every cache, rollback
without a trace, the target's distribution under sampling."""
import math

import pytest
import torch

from caches import POLICIES, make_cache_factory
from conftest import tiny_model
from core.errors import UserError
from engine.runtime.generation import Generator, Session
from engine.runtime.speculative import ModelDraft, NgramDraft, Speculation, verify

PROMPT = [(i * 7) % 50 for i in range(40)]
VARIANTS = [(p, {}) for p in POLICIES] + \
    [(p, {"kv_middle": "int8"}) for p in ("quantized", "h2o", "weightedkv", "lagkv")] + \
    [(p, {"positions": "cache"}) for p in ("streaming", "weightedkv", "tova")]


def factory(name, **kw):
    if name == "full":
        return make_cache_factory(name, **kw)
    return make_cache_factory(name, cache_size=16, chunk=8, compression_interval=4, **kw)


class ScriptDraft:
    """Guesses from a known continuation, wrong at every position p with p % wrong == 0: every
    accepted length from 0 to k comes up."""

    def __init__(self, script: list, wrong: int = 7):
        self.script, self.wrong = script, wrong

    def propose(self, stream, k, temperature, top_k):
        at = len(stream)
        guess = self.script[at:at + k]
        return [(t + 1) % 50 if (at + i) % self.wrong == 0 else t
                for i, t in enumerate(guess)], None


@pytest.mark.parametrize("name,kw", VARIANTS, ids=[f"{p}-{'-'.join(kw.values()) or 'model'}"
                                                   for p, kw in VARIANTS])
def test_greedy_output_is_the_plain_runs(name, kw):
    """Token for token the same as plain greedy decoding with the same cache settings, with
    drafts that are mostly right (every accepted length), a model draft and prompt lookup;
    and the caches end holding what the plain run's hold (index maps exactly, K/V to
    rounding: the verify step's products round a block of rows, a step one row)."""
    model = tiny_model()
    plain = Generator(model, 512, make_cache=factory(name, **kw))
    want = plain.generate(PROMPT, 60).token_ids[0]
    drafts = [ScriptDraft(want), NgramDraft(2),
              ModelDraft(model, make_cache_factory("streaming", cache_size=12, chunk=4), 512)]
    for draft in drafts:
        spec = Generator(model, 512, make_cache=factory(name, **kw),
                         speculation=Speculation(draft, 4))
        assert spec.generate(PROMPT, 60).token_ids[0] == want, type(draft).__name__
        if isinstance(draft, ScriptDraft):  # blocks kept whole, in part and not at all
            assert 0 < spec.spec_stats.accepted < spec.spec_stats.drafted
        assert spec.tokens == plain.tokens and spec.pending.tolist() == plain.pending.tolist()
        for a, b in zip(plain.caches, spec.caches):
            for (n, x), y in zip(a.state().items(), b.state().values()):
                if n == "pos":
                    assert torch.equal(x, y), n
                elif x.is_floating_point():
                    torch.testing.assert_close(y, x, atol=1e-4, rtol=1e-4, msg=n)


@pytest.mark.parametrize("name,kw", VARIANTS[:len(POLICIES)] + [("weightedkv", {"kv_middle": "int8"})])
def test_rejected_tokens_leave_no_trace(name, kw):
    """Bit for bit: a verify step whose tokens are all rejected leaves every buffer as it was,
    and what a step keeps does not depend on the tokens it rejects."""
    model = tiny_model()
    s = Session(model, factory(name, **kw), 512)
    s.append(PROMPT + [3, 9, 27])  # 43 tokens: the middle is in use, a pass is 5 tokens off
    before = [{n: b.clone() for n, b in c.state().items()} for c in s.caches]

    def state():
        return [{n: b.clone() for n, b in c.state().items()} for c in s.caches]

    def restore():
        for c, saved in zip(s.caches, before):
            for n, b in c.state().items():
                b.copy_(saved[n])

    pos = len(s.tokens[0])
    with torch.inference_mode():
        verify(model, s.caches, [5, 6, 7, 8, 9], pos)
        for c in s.caches:
            c.accept(0)
        assert all(torch.equal(a[n], b[n]) for a, b in zip(state(), before) for n in a)
        kept = []
        for tail in ([30, 31], [40, 41]):
            restore()
            verify(model, s.caches, [5, 6, 7] + tail, pos)
            for c in s.caches:
                c.accept(3)
            kept.append(state())
    for a, b in zip(*kept):
        for n in a:
            assert torch.equal(a[n], b[n]), (name, n)


def test_sampling_keeps_the_targets_distribution():
    """Under sampling every token is distributed as the target's: the second new token's
    frequencies over 3,000 runs, drafted by a model that disagrees, against its exact
    marginal sum_x p(x) p(y | x), within a chi-square bound (p = 0.001)."""
    V = 12
    model = tiny_model(vocab_size=V)
    draft_model = tiny_model(seed=3, vocab_size=V)
    prompt = [1, 4, 2, 7]
    temperature = 1.0
    with torch.inference_mode():
        s = Session(model, None, 64)
        s.append(prompt)
        p1 = torch.softmax(s.logits[0].double(), -1)
        marginal = torch.zeros(V, dtype=torch.float64)
        for x in range(V):
            s.reset()
            s.append(prompt + [x])
            marginal += p1[x] * torch.softmax(s.logits[0].double(), -1)
    torch.manual_seed(0)
    spec = Generator(model, 64, make_cache=None,
                     speculation=Speculation(ModelDraft(draft_model, None, 64), 3))
    n = 3000
    counts = torch.zeros(V, dtype=torch.float64)
    accepted = 0
    for _ in range(n):
        out = spec.generate(prompt, 3, temperature=temperature)
        counts[out.new_ids[0][1]] += 1
        accepted += spec.spec_stats.accepted
    expected = marginal * n
    keep = expected >= 5  # chi-square wants 5 expected a cell; the rest pooled
    chi2 = float((((counts[keep] - expected[keep]) ** 2) / expected[keep]).sum())
    rest_o, rest_e = float(counts[~keep].sum()), float(expected[~keep].sum())
    cells = int(keep.sum())
    if rest_e > 0:
        chi2 += (rest_o - rest_e) ** 2 / rest_e
        cells += 1
    # the 0.999 quantile of chi-square with df degrees of freedom (Wilson-Hilferty)
    df = cells - 1
    z = 3.09
    bound = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    assert chi2 < bound, (chi2, bound, counts.tolist(), expected.tolist())
    assert 0 < accepted < 2 * n  # the draft is right sometimes, not always


def test_prompt_lookup_copies_what_came_before():
    d = NgramDraft(3)
    stream = [1, 2, 3, 4, 5, 9, 1, 2, 3]
    assert d.propose(stream, 2, 0.0, None) == ([4, 5], None)
    assert d.propose([7, 8], 4, 0.0, None) == ([], None)


def test_bad_settings_are_named():
    model = tiny_model()
    with pytest.raises(UserError, match="one stream"):
        Session(model, None, 64, batch_size=2, speculation=Speculation(NgramDraft(), 4))
    with pytest.raises(UserError, match="compression_interval"):
        Session(model, make_cache_factory("weightedkv", cache_size=16, chunk=8), 64,
                speculation=Speculation(NgramDraft(), 4))
    with pytest.raises(UserError, match="vocabulary"):
        Session(model, None, 64,
                speculation=Speculation(ModelDraft(tiny_model(vocab_size=128), None, 64), 4))
    with pytest.raises(UserError, match="speculate_k"):
        Speculation(NgramDraft(), 0)


def test_compiled_speculation_is_the_plain_compiled_run():
    """The compiled verify step and draft step: the same greedy tokens as plain compiled
    decoding."""
    model = tiny_model()
    f = factory("weightedkv")
    want = Generator(model, 512, make_cache=f, compile=True).generate(PROMPT, 40).token_ids[0]
    draft = ModelDraft(model, make_cache_factory("streaming", cache_size=12, chunk=4), 512)
    spec = Generator(model, 512, make_cache=f, compile=True,
                     speculation=Speculation(ScriptDraft(want), 4))
    assert spec.generate(PROMPT, 40).token_ids[0] == want
    spec = Generator(model, 512, make_cache=f, compile=True, speculation=Speculation(draft, 4))
    assert spec.generate(PROMPT, 40).token_ids[0] == want
