"""generate.py end to end on the embedded default model, and its answers to bad input."""
import json

import pytest

from conftest import run_cli


def generate(*args):
    return run_cli("generate.py", *args)


def one_line_error(proc, needle):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0], lines[0]


def test_greedy_json_on_default_model(default_checkpoint):
    proc = generate("--checkpoint_path", default_checkpoint, "--prompt",
                    "The capital of France is", "--max_new_tokens", "8", "--temperature", "0",
                    "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)  # stdout is exactly one JSON object
    for key in ("text", "token_ids", "new_tokens", "tokens_per_s", "prefill_s", "cache_bytes",
                "peak_memory_bytes"):
        assert key in out
    assert out["new_tokens"] == 8 and len(out["token_ids"]) == 5 + 8
    assert out["text"].strip().startswith("Paris")
    # full cache: K and V float32 [1, 3, max_seq_length, 64] per layer + the position map
    n = out["max_seq_length"]
    assert out["cache_bytes"] == 30 * (2 * 3 * n * 64 * 4 + n * 8)


def test_chat_streams_text_and_stops_at_eos(default_checkpoint):
    proc = generate("--checkpoint_path", default_checkpoint, "--chat", "--prompt",
                    "What is the capital of France?", "--max_new_tokens", "40",
                    "--temperature", "0")
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
    assert "<|im_end|>" not in proc.stdout
    assert "stopped at EOS" in proc.stderr and "tokens/s" in proc.stderr


def test_compressing_cache_end_to_end(default_checkpoint):
    prompt = "In the beginning God created the heaven and the earth. " * 12  # > 64 tokens
    out = {}
    for cache in ("full", "weightedkv"):
        proc = generate("--checkpoint_path", default_checkpoint, "--prompt", prompt,
                        "--max_new_tokens", "40" if cache != "full" else "4",
                        "--temperature", "0", "--cache", cache,
                        "--cache_size", "64", "--kv_middle", "int8" if cache != "full" else "model",
                        "--json")
        assert proc.returncode == 0, proc.stderr
        out[cache] = json.loads(proc.stdout)
    assert out["weightedkv"]["new_tokens"] >= 1
    assert out["weightedkv"]["cache_bytes"] < out["full"]["cache_bytes"]


def test_list_caches():
    proc = generate("--list_caches")
    assert proc.returncode == 0
    names = [line.split()[0] for line in proc.stdout.splitlines()]
    assert names == ["full", "streaming", "quantized", "h2o", "tova", "a2sf", "weightedkv",
                     "weightedkv-evict", "cam", "lagkv", "knorm", "keydiff"]


@pytest.mark.parametrize("args,needle", [
    (["--checkpoint_path", "/nonexistent/model"], "does not exist"),
    (["--max_new_tokens", "0"], "--max_new_tokens"),
    (["--max_new_tokens", "-3"], "--max_new_tokens"),
    (["--max_seq_length", "0"], "--max_seq_length"),
    (["--top_k", "0"], "--top_k"),
    (["--num_samples", "-1"], "--num_samples"),
    (["--temperature", "-1"], "--temperature"),
    (["--cache", "lru"], "unknown cache policy 'lru'"),
    (["--cache", "h2o", "--lag", "3"], "no option --lag"),
    (["--cache", "h2o", "--cache_size", "6"], "--window"),
    (["--cache", "weightedkv", "--cache_size", "16", "--window", "12"], "no middle"),
    (["--cache", "streaming", "--kv_middle", "int8"], "middle"),
    (["--cache", "h2o", "--window", "0"], "--window"),
    (["--dtype", "float64"], "invalid choice"),
    (["--speculate_k", "4"], "--speculate_k needs a draft"),
    (["--draft", "ngram", "--draft_cache", "streaming"], "needs no model"),
    (["--draft", "ngram", "--cache", "h2o", "--compression_interval", "1"],
     "--compression_interval above 1"),
    (["--draft_checkpoint_path", "/nonexistent/draft"], "does not exist"),
])
def test_bad_arguments_are_one_line_errors(args, needle):
    one_line_error(generate(*args), needle)


def test_prompt_longer_than_max_seq_length(default_checkpoint):
    proc = generate("--checkpoint_path", default_checkpoint, "--prompt", "word " * 100,
                    "--max_seq_length", "32")
    one_line_error(proc, "--max_seq_length")


def test_non_llama_and_foreign_configs(tmp_path):
    engine_cfg = tmp_path / "gpt2"
    engine_cfg.mkdir()
    (engine_cfg / "config.json").write_text(json.dumps(
        {"format": "regionkv", "version": 1, "architecture": "gpt2", "model": {}}))
    one_line_error(generate("--checkpoint_path", engine_cfg), "unsupported architecture")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "llama"}))
    one_line_error(generate("--checkpoint_path", hf), "convert")


def test_positions_auto_picks_original_while_the_stream_fits():
    import argparse

    from engine.cli import resolve_positions

    def settle(cache, tokens, positions="auto"):
        return resolve_positions(argparse.Namespace(cache=cache, positions=positions), tokens, 8192)

    assert settle("weightedkv", 4000) == "original"
    assert settle("weightedkv", 100_000) == "cache"
    assert settle("weightedkv", None) == "cache"      # a chat: its length is unknown
    assert settle("full", 100_000) == "original"      # full stops at the context instead
    assert settle("weightedkv", 100_000, "original") == "original"  # explicit stays


def test_default_flags_run_past_the_context(default_checkpoint, tmp_path):
    # The default model with its context cut to 128 positions: a compressing cache streams on
    # past it with the default --positions auto, in constant memory; full stops at it.
    import os
    small = tmp_path / "ctx128"
    small.mkdir()
    cfg = json.loads((default_checkpoint / "config.json").read_text())
    cfg["model"]["max_position_embeddings"] = 128
    (small / "config.json").write_text(json.dumps(cfg))
    for f in default_checkpoint.iterdir():
        if f.name != "config.json":
            os.symlink(f, small / f.name)
    prompt = "The history of the Roman Empire spans many centuries, from"
    proc = generate("--checkpoint_path", small, "--prompt", prompt, "--cache", "weightedkv",
                    "--cache_size", "64", "--max_new_tokens", "160", "--temperature", "0.8",
                    "--seed", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["positions"] == "cache" and out["new_tokens"] > 128, out["new_tokens"]
    full = generate("--checkpoint_path", small, "--prompt", prompt, "--max_new_tokens", "160",
                    "--temperature", "0", "--json")
    assert full.returncode == 0 and "positions stop at 128" in full.stderr
    assert json.loads(full.stdout)["positions"] == "original"


FAULT_PROBE = r"""
import resource, sys, torch
sys.path.insert(0, sys.argv[1])
from core.memory import keep_freed_buffers
import engine.cli
if sys.argv[2] == "cli":
    engine.cli.run(lambda: None)  # what every entry point does first
def step():  # temporaries over glibc's 32 MiB mmap threshold, two of them alive at once
    a = torch.empty(40 * 2**20 // 4).fill_(1)
    torch.empty(38 * 2**20 // 4).fill_(1)
for _ in range(10):  # the heap settles
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.parametrize("entry", ["cli", "library"])
def test_the_cli_reuses_big_temporaries_instead_of_faulting_them_in(entry):
    """Through engine.cli.run, steps that each make two temporaries of 38-40 MiB reuse their
    blocks from malloc's heap once it has settled (no pages faulted in); imported as a
    library, the engine leaves malloc as it is (each temporary maps and faults its ~10,000
    pages again, every step)."""
    import subprocess
    import sys
    from conftest import ROOT
    proc = subprocess.run([sys.executable, "-c", FAULT_PROBE, str(ROOT), entry],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    faults = int(proc.stdout.split()[-1])
    if entry == "cli":
        assert faults < 1000, faults
    else:
        assert faults > 10 * 2 * 9728 * 0.9, faults


def test_speculative_decoding_end_to_end(default_checkpoint, tmp_path):
    """Each draft on the real default model gives the greedy tokens of the plain run with the
    schedule speculation runs in (a compressing cache compresses every chunk - k = 28
    positions), and reports its acceptance; prompt lookup accepts guesses on a prompt that
    repeats itself."""
    prompt = "def add(a, b):\n    return a + b\n\n" * 6 + "def add(a, b):\n"
    common = ["--checkpoint_path", default_checkpoint, "--prompt", prompt, "--max_new_tokens",
              "40", "--temperature", "0", "--json"]
    for cache in (["--cache", "full"], ["--cache", "weightedkv", "--cache_size", "64",
                                        "--kv_middle", "int8"]):
        plain = generate(*common, *cache, *(["--compression_interval", "28"]
                                            if "weightedkv" in cache else []))
        assert plain.returncode == 0, plain.stderr
        want = json.loads(plain.stdout)["token_ids"]
        for draft in (["--draft", "ngram"], ["--draft_cache", "streaming",
                                            "--draft_cache_size", "32"]):
            proc = generate(*common, *cache, *draft, "--speculate_k", "4")
            assert proc.returncode == 0, proc.stderr
            out = json.loads(proc.stdout)
            assert out["token_ids"] == want, (cache, draft)
            spec = out["speculation"]
            assert spec["k"] == 4 and 0 <= spec["acceptance"] <= 1 and spec["steps"] > 0
            if draft[0] == "--draft":
                assert spec["acceptance"] > 0.3, spec
