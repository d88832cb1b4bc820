"""Streaming perplexity: the protocol (token t scored from step t - 1) and eval.py's errors."""
import math
import re

import pytest
import torch

from caches import FullCache, build_caches, make_cache_factory
from conftest import DATA, ROOT, run_cli, tiny_model
from engine.loading.checkpoint import load_model
from core.errors import UserError
from engine.evaluation.perplexity import (CORPUS_NAMES, batched_full_perplexity,
                               batched_streaming_perplexity, encode_prefix, streaming_perplexity)
from engine.loading.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def model_and_ids(default_checkpoint):
    model = load_model(default_checkpoint)
    ids = load_tokenizer(default_checkpoint).encode((DATA / "kjv_genesis_1_2.txt").read_text())
    return model, ids


def test_streaming_protocol_scores_token_t_from_step_t_minus_1(model_and_ids):
    model, ids = model_and_ids
    ids = ids[:64]
    with torch.inference_mode():
        logits = model(torch.tensor([ids]), torch.arange(64), build_caches(model, 1, 64))[0]
    # direct: one forward over all ids; the NLL of ids[t + 1] from the logits at t
    direct = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]),
                                               reduction="none")
    result = streaming_perplexity(model, build_caches(model, 1, 64, FullCache), ids)
    assert result.tokens == 63 and len(result.nlls) == 63 and len(result.curve) == 63
    assert torch.allclose(torch.tensor(result.nlls), direct, atol=1e-4)
    # an off-by-one (scoring ids[t] from the logits at t, or from t - 2) would not match
    assert (direct[1:] - torch.tensor(result.nlls[:-1])).abs().max() > 1
    assert abs(result.nll - direct.mean().item()) < 1e-5
    assert abs(result.curve[-1] - result.nll) < 1e-9
    assert abs(result.curve[9] - direct[:10].mean().item()) < 1e-5
    assert 1 < result.ppl < 200 and math.isclose(result.ppl, math.exp(result.nll))


@pytest.mark.parametrize("policy,options", [("full", {}),
                                            ("weightedkv", dict(cache_size=16, chunk=8)),
                                            ("lagkv", dict(cache_size=24, chunk=8)),
                                            ("cam", dict(cache_size=16, chunk=8))])
def test_batched_streams_score_as_they_would_alone(policy, options):
    model = tiny_model()
    g = torch.Generator().manual_seed(1)
    streams = [torch.randint(0, 256, (72,), generator=g).tolist() for _ in range(3)]
    factory = make_cache_factory(policy, **options)
    batched = batched_streaming_perplexity(model, build_caches(model, 3, 72, factory), streams)
    for stream, got in zip(streams, batched):
        alone = streaming_perplexity(model, build_caches(model, 1, 72, factory), stream)
        assert torch.allclose(torch.tensor(got.nlls), torch.tensor(alone.nlls), atol=1e-4)
        assert got.tokens == alone.tokens == 71
    # the rows differ (no row leaked into another)
    assert len({round(r.nll, 4) for r in batched}) == 3


def test_full_cache_by_causal_chunks_scores_as_the_token_loop(model_and_ids):
    """The sweep scores `full` by causal chunks: the same NLLs as the token-by-token loop, for
    every token, across chunk boundaries (chunk 32 over 80 tokens, batch 2)."""
    model, ids = model_and_ids
    streams = [ids[:80], ids[40:120]]
    loop = batched_streaming_perplexity(model, build_caches(model, 2, 96), streams)
    chunked = batched_full_perplexity(model, build_caches(model, 2, 96), streams, chunk=32)
    for a, b in zip(loop, chunked):
        assert b.tokens == a.tokens == 79
        assert max(abs(x - y) for x, y in zip(a.nlls, b.nlls)) < 1e-4
        assert abs(a.nll - b.nll) < 1e-5 and len(b.curve) == 79
    with pytest.raises(ValueError, match="keep every token"):
        batched_full_perplexity(model, build_caches(model, 2, 96, make_cache_factory(
            "streaming", cache_size=32)), streams)


def test_batched_streams_must_have_equal_length():
    model = tiny_model()
    with pytest.raises(UserError, match="equal length"):
        batched_streaming_perplexity(model, build_caches(model, 2, 16), [[1, 2, 3], [1, 2]])


def test_corpus_names_match_prepare_script():
    import importlib.util
    spec = importlib.util.spec_from_file_location("prepare_corpora",
                                                  ROOT / "scripts" / "prepare_corpora.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert tuple(module.CORPORA) == CORPUS_NAMES


def test_encode_prefix_equals_encoding_everything(default_checkpoint):
    tok = load_tokenizer(default_checkpoint)
    text = (DATA / "kjv_genesis_1_2.txt").read_text()
    everything = tok.encode(text)
    for n in (1, 100, 900, len(everything)):
        assert encode_prefix(tok, text, n) == everything[:n]
    assert encode_prefix(tok, text, len(everything) + 5) == everything


def test_quantized_keeps_full_cache_perplexity(model_and_ids):
    model, ids = model_and_ids
    n = 224
    ids = ids[:n]
    # the full cache's perplexity in one causal pass (equal to the token loop: tests above)
    full, = batched_full_perplexity(model, build_caches(model, 1, n, FullCache), [ids])
    # cache_size 32: sink 4 + window 12 in float32, every older token in int8
    quant = streaming_perplexity(model, build_caches(
        model, 1, n, make_cache_factory("quantized", cache_size=32, chunk=8)), ids)
    assert abs(quant.ppl / full.ppl - 1) < 0.01, (quant.ppl, full.ppl)
    dropped = streaming_perplexity(model, build_caches(
        model, 1, n, make_cache_factory("streaming", cache_size=32, chunk=8)), ids)
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
    (tmp_path / "file").write_text("")  # a file where --curve needs a directory
    one_line(run_cli("eval.py", "ppl", *ck, "--text_file", tmp_path / "short.txt",
                     "--curve", tmp_path / "file" / "curve.json"), "--curve")
    one_line(run_cli("eval.py", "ppl", *ck, "--text_file", tmp_path / "short.txt",
                     "--curve", tmp_path), "is not a writable file")  # a directory


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


def test_eval_cli_corpus_errors(tmp_path, default_checkpoint, capsys):
    from eval import main
    ck = ["--checkpoint_path", str(default_checkpoint), "--corpus_dir", str(tmp_path)]
    proc = run_cli("eval.py", "ppl", *ck, "--corpus", "nosuch")
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: unknown corpus 'nosuch'; choose one of kjv, wiki")

    def fails(needle, *args):
        with pytest.raises(UserError, match=re.escape(needle)):
            main(["ppl", *ck, *map(str, args)])

    fails("run `python scripts/prepare_corpora.py --out", "--corpus", "kjv")
    (tmp_path / "short.txt").write_text("In the beginning God created the heaven and the earth.")
    fails("short has only 11 tokens, fewer than --max_tokens 500", "--corpus", "short",
          "--max_tokens", "500")
    (tmp_path / "blank.txt").write_text("\n\n")
    fails("is empty", "--corpus", "blank")
    (tmp_path / "locked.txt").mkdir()  # exists, but cannot be read as a file
    fails("cannot read --text_file", "--text_file", tmp_path / "locked.txt")
    with pytest.raises(SystemExit) as exit_:
        main(["ppl", "--corpus", "kjv", "--text_file", "x.txt"])
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert exit_.value.code == 2 and len(err) == 1 and "not allowed with" in err[0]
