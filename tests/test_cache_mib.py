"""--cache_mib: cache budgets in bytes (caches.fit_to_bytes), through the factory, the CLIs and
the sweep."""
import json

import pytest
import torch

from caches import POLICIES, build_caches, fit_to_bytes, make_cache_factory, row_nbytes
from conftest import run_cli, tiny_args, tiny_model
from core.errors import UserError

SHAPES = {"smollm2-135m": dict(n_layer=30, n_head=9, n_kv_heads=3, head_dim=64),
          "qwen2.5-coder-0.5b": dict(n_layer=24, n_head=14, n_kv_heads=2, head_dim=64)}
SIZED = [p for p in POLICIES if p not in ("full", "quantized")]  # token-budget policies


def nbytes(name, args, dtype, sink, window, middle, **settings):
    f = make_cache_factory(name, cache_size=sink + window + middle, sink=sink, window=window,
                           **settings)
    return row_nbytes(f, args, dtype)


@pytest.mark.parametrize("model", list(SHAPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name, kv_middle", [(p, m) for p in SIZED for m in ("model", "int8")
                                              if m == "model" or POLICIES[p].has_middle])
def test_chosen_sizes_fit_and_one_more_middle_token_does_not(model, dtype, name, kv_middle):
    args = tiny_args(**SHAPES[model])
    budget = int(6.45 * 2**20)
    sink, window, middle = fit_to_bytes(name, budget, args, dtype, kv_middle=kv_middle)
    assert nbytes(name, args, dtype, sink, window, middle, kv_middle=kv_middle) <= budget
    if POLICIES[name].has_middle:
        assert nbytes(name, args, dtype, sink, window, middle + 1, kv_middle=kv_middle) > budget
        # the default split (window = N//2 - sink), then the middle takes what is left
        assert sink == 4 and middle >= sink + window
    else:
        assert nbytes(name, args, dtype, sink, window + 1, 0, kv_middle=kv_middle) > budget


def test_bytes_are_what_build_caches_allocates_and_int8_holds_more():
    model = tiny_model(n_layer=3)
    budget = 200_000
    for name in ("weightedkv", "h2o", "streaming"):
        sink, window, middle = fit_to_bytes(name, budget, model.args, torch.float32)
        f = make_cache_factory(name, cache_size=sink + window + middle, sink=sink, window=window)
        caches = build_caches(model, 1, 256, f)
        assert sum(c.nbytes for c in caches) == row_nbytes(f, model.args, torch.float32) <= budget
    plain = sum(fit_to_bytes("weightedkv", budget, model.args, torch.float32))
    int8 = sum(fit_to_bytes("weightedkv", budget, model.args, torch.float32, kv_middle="int8"))
    assert int8 > plain


def test_equal_bytes_to_streaming_at_256_in_bfloat16():
    """The equal-bytes table's budget: streaming@256's own bytes give streaming 256 back."""
    args = tiny_args(**SHAPES["smollm2-135m"])
    f = make_cache_factory("streaming", cache_size=256)
    budget = row_nbytes(f, args, torch.bfloat16)
    assert sum(fit_to_bytes("streaming", budget, args, torch.bfloat16)) == 256
    assert sum(fit_to_bytes("streaming", int(6.45 * 2**20), args, torch.bfloat16)) == 256


def test_fixed_window_gives_the_rest_to_the_middle():
    args = tiny_args(**SHAPES["smollm2-135m"])
    sink, window, middle = fit_to_bytes("weightedkv", 8 << 20, args, torch.float32, sink=2,
                                        window=40)
    assert (sink, window) == (2, 40) and middle > 40
    assert nbytes("weightedkv", args, torch.float32, 2, 40, middle + 1) > 8 << 20


@pytest.mark.parametrize("name, kw, message", [
    ("full", {}, "full keeps every token"),
    ("quantized", {}, "quantized keeps every token"),
    ("streaming", {"kv_middle": "int8"}, "needs a policy with a middle region"),
    ("streaming", {"window": 40}, "drop `window`"),
    ("weightedkv", {}, "too small for weightedkv: its smallest cache"),
])
def test_budgets_that_cannot_work_name_the_reason(name, kw, message):
    budget = 1000 if "small" in message else 8 << 20
    with pytest.raises(UserError, match=message):
        fit_to_bytes(name, budget, tiny_args(**SHAPES["smollm2-135m"]), torch.float32, **kw)


def test_generate_and_eval_take_cache_mib(default_checkpoint, tmp_path):
    # 3 MiB hold 55 tokens here (4 sink, 23 window, 28 int8 middle): 80 run past them
    r = run_cli("generate.py", "--cache", "weightedkv", "--cache_mib", "3", "--kv_middle",
                "int8", "--prompt", "Once upon a time", "--max_new_tokens", "80",
                "--temperature", "0", "--json")
    assert r.returncode == 0, r.stderr
    assert "note: --cache_mib 3: weightedkv holds 55 tokens" in r.stderr, r.stderr
    out = json.loads(r.stdout)
    assert out["cache_bytes"] <= 3 * 2**20 and out["new_tokens"] > 55
    text = tmp_path / "t.txt"
    text.write_text("In the beginning God created the heaven and the earth. " * 40)
    r = run_cli("eval.py", "ppl", "--text_file", text, "--max_tokens", "64", "--cache", "h2o",
                "--cache_mib", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["cache_bytes"] <= 2 * 2**20
    r = run_cli("eval.py", "ppl", "--text_file", text, "--max_tokens", "64", "--cache",
                "streaming", "--cache_mib", "0.5")
    assert r.returncode == 2 and r.stderr.startswith("error: --cache_mib 0.5 is too small")
