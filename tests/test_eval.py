"""Streaming perplexity: the protocol (token t scored from step t - 1) and eval.py's errors."""
import math

import pytest
import torch

from caches import FullCache, make_cache_factory
from conftest import DATA, run_cli
from engine.checkpoint import load_model
from engine.evaluation import streaming_perplexity
from engine.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def model_and_ids(default_checkpoint):
    model = load_model(default_checkpoint)
    ids = load_tokenizer(default_checkpoint).encode((DATA / "kjv_genesis_1_2.txt").read_text())
    return model, ids


def test_streaming_protocol_scores_token_t_from_step_t_minus_1(model_and_ids):
    model, ids = model_and_ids
    ids = ids[:128]
    model.setup_caches(1, 128, FullCache)
    with torch.inference_mode():
        logits = model(torch.tensor([ids]), torch.arange(128))[0]
    direct = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:])).item()
    model.setup_caches(1, 128, FullCache)
    result = streaming_perplexity(model, ids)
    assert result.tokens == 127
    assert abs(result.nll - direct) < 1e-4
    assert abs(result.curve[-1] - result.nll) < 1e-9 and len(result.curve) == 127
    assert 1 < result.ppl < 200 and math.isclose(result.ppl, math.exp(result.nll))


def test_quantized_keeps_full_cache_perplexity(model_and_ids):
    model, ids = model_and_ids
    ids = ids[:320]
    model.setup_caches(1, 320, FullCache)
    full = streaming_perplexity(model, ids)
    # cache_size 32: sink 4 + window 12 in float32, every older token in int8
    model.setup_caches(1, 320, make_cache_factory("quantized", cache_size=32, chunk=8))
    quant = streaming_perplexity(model, ids)
    assert abs(quant.ppl / full.ppl - 1) < 0.01, (quant.ppl, full.ppl)
    model.setup_caches(1, 320, make_cache_factory("streaming", cache_size=32, chunk=8))
    dropped = streaming_perplexity(model, ids)
    assert dropped.ppl > quant.ppl  # dropping the middle costs more than quantizing it


def test_eval_cli_errors(tmp_path, default_checkpoint):
    def one_line(proc, needle):
        assert proc.returncode != 0 and "Traceback" not in proc.stderr
        lines = [l for l in proc.stderr.splitlines() if l.strip()]
        assert len(lines) == 1 and needle in lines[0], proc.stderr

    ck = ("--checkpoint_path", default_checkpoint)
    one_line(run_cli("eval.py", "ppl", *ck, "--text_file", tmp_path / "missing.txt"),
             "does not exist")
    (tmp_path / "empty.txt").write_text("  \n")
    one_line(run_cli("eval.py", "ppl", *ck, "--text_file", tmp_path / "empty.txt"), "empty")
    (tmp_path / "short.txt").write_text("In the beginning God created the heaven and the earth.")
    one_line(run_cli("eval.py", "ppl", *ck, "--text_file", tmp_path / "short.txt",
                     "--max_tokens", "5000"), "--max_tokens")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    one_line(run_cli("eval.py", "ppl", *ck, "--text_file", tmp_path / "latin1.txt"),
             "cannot read")
    one_line(run_cli("eval.py", "ppl", *ck, "--text_file", tmp_path / "short.txt",
                     "--cache", "h2o", "--merge_span", "3"), "no option --merge_span")


def test_eval_cli_json(tmp_path, default_checkpoint):
    import json
    text = (DATA / "kjv_genesis_1_2.txt").read_text()
    proc = run_cli("eval.py", "ppl", "--checkpoint_path", default_checkpoint, "--text_file",
                   DATA / "kjv_genesis_1_2.txt", "--max_tokens", "96", "--cache", "weightedkv",
                   "--cache_size", "32", "--json", "--curve", tmp_path / "curve.json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["tokens"] == 95 and math.isfinite(out["ppl"]) and out["cache_bytes"] > 0
    curve = json.loads((tmp_path / "curve.json").read_text())
    assert len(curve["log_ppl"]) == 95 and abs(curve["log_ppl"][-1] - out["nll"]) < 1e-9
    assert text  # the excerpt is real text
