"""Passkey prompts: exact length, the key at the requested depth; the answer parser; batching."""
import pytest
import torch

from caches import make_cache_factory
from conftest import DATA, tiny_model
from core.errors import UserError
from engine.evaluation.passkey import (NEEDLE, PasskeyPrompt, build_cell_prompts, build_prompt, make_keys,
                            parse_answer, run_cell)
from engine.loading.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tok_and_haystack(default_checkpoint):
    tok = load_tokenizer(default_checkpoint)
    return tok, tok.encode((DATA / "kjv_genesis_1_2.txt").read_text())


@pytest.mark.parametrize("length", [100, 257, 1024])
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_key_sits_at_the_requested_depth(tok_and_haystack, length, depth):
    tok, haystack = tok_and_haystack
    p = build_prompt(tok, haystack, length, depth, key=71432)
    assert len(p.ids) == length
    needle = tok.encode(NEEDLE.format(key=71432), bos=False)
    preface = len(p.ids) - p.haystack_len - len(needle) - len(tok.encode(
        "\n\nWhat is the pass key? The pass key is", bos=False))
    assert p.key_index == preface + round(depth * p.haystack_len)
    assert p.ids[p.key_index:p.key_index + len(needle)] == needle
    # the haystack around it is the text, in order and uncut
    assert p.ids[preface:p.key_index] == haystack[:p.key_index - preface]
    assert p.ids[p.key_index + len(needle):-12] == haystack[p.key_index - preface:p.haystack_len]
    text = tok.decode(p.ids)
    assert text.count("71432") == 2 and text.endswith("The pass key is")


def test_cell_prompts_share_keys_and_haystacks_across_lengths(tok_and_haystack):
    tok, haystack = tok_and_haystack
    short = build_cell_prompts(tok, haystack, 128, [0.1, 0.9], 3, seed=7, max_length=512)
    long = build_cell_prompts(tok, haystack, 512, [0.1, 0.9], 3, seed=7, max_length=512)
    assert len(short) == 6 and {len(p.ids) for p in short} == {128}
    assert [p.key for p in short] == [p.key for p in long] == [k for k in make_keys(3, 7)
                                                              for _ in range(2)]
    assert [p.depth for p in short] == [0.1, 0.9] * 3
    assert all(10000 <= k < 100000 for k in make_keys(20, 0))
    assert make_keys(4, 1) != make_keys(4, 2)
    with pytest.raises(UserError, match="leaves no room"):
        build_prompt(tok, haystack, 40, 0.5, 12345)
    with pytest.raises(UserError, match="fewer than the longest"):
        build_cell_prompts(tok, haystack[:300], 128, [0.5], 1, 0, max_length=512)


@pytest.mark.parametrize("text,expected", [
    (" 71432.", 71432), (" 71432 is the pass key", 71432), ("\n12345\n", 12345),
    (" the key: 007", 7), (" 7 1 4", 7), (" I do not know.", None), ("", None)])
def test_parse_answer(text, expected):
    assert parse_answer(text) == expected


class DigitTokenizer:
    """Stand-in for run_cell's decoding: token i reads as the digit i % 10."""
    eos_ids = []

    def decode(self, ids):
        return "".join(str(i % 10) for i in ids)


@pytest.mark.parametrize("policy", ["full", "weightedkv"])
def test_batched_cell_answers_as_one_prompt_at_a_time(policy):
    model = tiny_model()
    g = torch.Generator().manual_seed(3)
    prompts = [PasskeyPrompt(ids=torch.randint(0, 256, (70,), generator=g).tolist(), key=k,
                             depth=d, key_index=0, haystack_len=60)
               for k in (111, 222, 333) for d in (0.25, 0.75)]

    def factory():
        return make_cache_factory(policy, **({} if policy == "full" else
                                             dict(cache_size=24, chunk=8)))
    together = run_cell(model, DigitTokenizer(), factory(), prompts, new_tokens=3)
    # a cap of 4 rows: two batches, the second padded with repeats
    capped = run_cell(model, DigitTokenizer(), factory(), prompts, new_tokens=3, batch_size=4)
    alone = [run_cell(model, DigitTokenizer(), factory(), [p], new_tokens=3)["answers"][0]
             for p in prompts]
    assert together["answers"] == capped["answers"] == alone
    assert set(together["by_depth"]) == {"0.25", "0.75"}
    # the answers are the model's (3 digits), scored against each prompt's key
    assert all(len(a["answer"]) == 3 and a["correct"] == (int(a["answer"]) == a["key"])
               for a in together["answers"])
