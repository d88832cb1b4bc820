"""Attention loss (engine/evaluation/attention_loss.py, eval.py attention-loss)."""
import json

import pytest
import torch

from caches import FullCache, build_caches, make_cache_factory
from conftest import DATA, run_cli, tiny_model, write_tiny_checkpoint
from engine.evaluation.attention_loss import attention_loss

KJV = DATA / "kjv_genesis_1_2.txt"  # checked in: CI has no prepared corpora

IDS = [(11 * i) % 250 + 1 for i in range(90)]


class Recorder(FullCache):
    """The full cache, keeping each step's attention [B, Hkv, G, 1, S]."""
    wants_probs = True

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.seen = []

    def commit(self, input_pos, probs):
        self.seen.append(probs)


def full_attention(model, ids):
    caches = build_caches(model, 1, len(ids), lambda *a, **kw: Recorder(*a[:6], kw["layer_id"]))
    with torch.inference_mode():
        for t, token in enumerate(ids):
            model(torch.tensor([[token]]), torch.tensor([t]), caches)
    return [c.seen for c in caches]


def test_full_loses_nothing_and_streaming_loses_what_lies_outside_sink_and_window():
    model = tiny_model(n_layer=3)
    sink, window = 4, 12
    factories = {"full": make_cache_factory("full"),
                 "streaming": make_cache_factory("streaming", cache_size=sink + window,
                                                 sink=sink, chunk=1)}
    (rows,), _ = attention_loss(model, [IDS], factories)
    full, streaming = rows
    assert full.loss == 0 and all(x == 0 for x in full.per_layer + full.curve)
    # by hand: streaming holds the sink and the window (the last `window` tokens before the
    # current one, and the current one) when token t attends
    seen = full_attention(model, IDS)
    per_layer = []
    for layer in seen:
        lost = []
        for t, p in enumerate(layer):
            p = p[0, :, :, 0, :len(IDS)]  # [Hkv, G, S]
            held = torch.zeros(len(IDS), dtype=torch.bool)
            held[:sink] = True
            held[max(0, t - window):t + 1] = True
            lost.append(p[..., ~held].sum(-1).mean().item())
        per_layer.append(sum(lost) / len(lost))
    assert streaming.per_layer == pytest.approx(per_layer, abs=1e-6)
    assert streaming.loss == pytest.approx(sum(per_layer) / len(per_layer), abs=1e-6)
    assert all(x == 0 for x in streaming.curve[:sink + window])  # nothing lost yet
    assert streaming.loss > 0.05


def test_a_scoring_policy_keeps_more_attention_than_recency_and_batch_rows_are_independent():
    model = tiny_model(n_layer=2)
    factories = {name: make_cache_factory(name, cache_size=16, chunk=1)
                 for name in ("streaming", "h2o", "weightedkv", "weightedkv-evict")}
    other = IDS[::-1]
    (a, b), _ = attention_loss(model, [IDS, other], factories)
    (alone,), _ = attention_loss(model, [other], factories)
    assert [r.loss for r in b] == pytest.approx([r.loss for r in alone], abs=1e-6)
    by = {r.label: r.loss for r in a}
    assert by["h2o"] < by["streaming"] and by["weightedkv"] < by["streaming"]
    # merging moves values, never keys: the merged-away token's attention is lost all the same
    assert by["weightedkv"] == pytest.approx(by["weightedkv-evict"], abs=1e-6)


@pytest.fixture(scope="module")
def tiny_ckpt(default_checkpoint, tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("aloss") / "ckpt", default_checkpoint,
                                 vocab_size=49152, n_layer=2, dim=64, n_head=4, n_kv_heads=2,
                                 head_dim=16, intermediate_size=128, tie_embeddings=True)


def test_eval_attention_loss_reports_rows_and_a_plot(tiny_ckpt, tmp_path):
    out = run_cli("eval.py", "attention-loss", "--checkpoint_path", tiny_ckpt, "--text_file",
                  KJV, "--max_tokens", 60, "--cache", "streaming,h2o+int8", "--cache_size", 24,
                  "--json", "--plot", tmp_path / "loss.png", "--out", tmp_path / "rows.jsonl")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["label"] for r in rows] == ["streaming", "h2o+int8"]
    assert all(len(r["per_layer"]) == 2 and 0 < r["loss"] < 1 for r in rows)
    assert (tmp_path / "loss.png").stat().st_size > 0
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 2
    out = run_cli("eval.py", "attention-loss", "--checkpoint_path", tiny_ckpt, "--text_file",
                  KJV, "--compile")
    assert out.returncode == 2 and "drop --compile" in out.stderr
