"""eval.py sweep: resumable JSONL, batched corpora, rendering; eval.py passkey end to end.

Runs on a tiny random model that carries the default model's real tokenizer, so a whole grid
takes seconds; the numbers are meaningless, the plumbing is what is tested."""
import json
import re
import shutil

import pytest

from conftest import DATA, run_cli, tiny_model
from core.errors import UserError
from engine.evaluation.sweep import ResultStore, load_config, run_sweep
from eval import main

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, default_checkpoint):
    from safetensors.torch import save_file
    from engine.loading.checkpoint import CONFIG_NAME, WEIGHTS_NAME, read_config

    out = tmp_path_factory.mktemp("tiny_ckpt")
    cfg = read_config(default_checkpoint)
    model = tiny_model(vocab_size=cfg["model"]["vocab_size"], dim=32, n_head=2, n_kv_heads=1,
                       head_dim=16, intermediate_size=64, n_layer=2, tie_embeddings=True,
                       max_position_embeddings=1024)
    cfg["model"].update({k: getattr(model.args, k) for k in cfg["model"]})
    (out / CONFIG_NAME).write_text(json.dumps(cfg))
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "output.weight"}
    save_file(state, str(out / WEIGHTS_NAME))
    shutil.copy(default_checkpoint / cfg["tokenizer"]["file"], out / cfg["tokenizer"]["file"])
    return out


@pytest.fixture
def corpora(tmp_path):
    text = (DATA / "kjv_genesis_1_2.txt").read_text()
    half = len(text) // 2
    d = tmp_path / "corpora"
    d.mkdir()
    (d / "gen1.txt").write_text(text[:half])
    (d / "gen2.txt").write_text(text[half:])
    return d


def write_config(tmp_path, checkpoint, corpus_dir, **extra):
    cfg = {"out_dir": str(tmp_path / "out"), "checkpoint_path": str(checkpoint),
           "corpus_dir": str(corpus_dir), "dtype": "float32", "device": "cpu",
           "max_tokens": 40, "corpora": ["gen1", "gen2"], "cache_sizes": [16, 24],
           "policies": ["full", "streaming", "weightedkv", "weightedkv-evict",
                        "weightedkv+int8"],
           "passkey": {"corpus": "gen1", "lengths": [96, 128], "depths": [0.0, 0.5, 1.0],
                       "trials": 2, "policies": ["full", "weightedkv"], "cache_sizes": [16],
                       "new_tokens": 4}}
    cfg.update(extra)
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(cfg))
    return path


def test_sweep_resumes_and_renders(tmp_path, tiny_checkpoint, corpora):
    cfg = load_config(write_config(tmp_path, tiny_checkpoint, corpora))
    first = run_sweep(cfg)
    # full once per corpus + 4 policies x 2 sizes x 2 corpora; passkey: full x 2 lengths +
    # weightedkv x 1 size x 2 lengths
    assert first["cells_run"] == 2 + 4 * 2 * 2 and first["cells_skipped"] == 0
    assert first["passkey_cells"] == 4 and first["scored_tokens"] == 18 * 39
    store = ResultStore(cfg.out_dir / "results.jsonl")
    rows = [r for r in store.rows() if r.get("key", {}).get("kind") == "ppl"]
    assert len(rows) == 18
    by_cell = {(r["label"], r["cache_size"], r["corpus"]): r for r in rows}
    assert by_cell[("full", None, "gen1")]["batch"] == 2
    assert by_cell[("weightedkv+int8", 16, "gen1")]["cache_bytes"] < \
        by_cell[("weightedkv", 16, "gen1")]["cache_bytes"]
    curve = by_cell[("weightedkv", 24, "gen2")]["curve"]
    assert curve["position"][-1] == 39 and abs(curve["log_ppl"][-1]
                                               - by_cell[("weightedkv", 24, "gen2")]["nll"]) < 1e-5

    # A rerun computes nothing.
    again = run_sweep(cfg)
    assert again["cells_run"] == 0 and again["passkey_cells"] == 0
    assert again["cells_skipped"] == 18

    # Drop one finished line and cut the last one short (a crash mid-write): exactly those two
    # cells run again, and the file ends as whole lines.
    lines = (cfg.out_dir / "results.jsonl").read_text().splitlines(keepends=True)
    ppl_lines = [i for i, l in enumerate(lines) if '"kind": "ppl"' in l]
    dropped = json.loads(lines[ppl_lines[3]])
    last = lines[-1]
    kept = [l for i, l in enumerate(lines) if i != ppl_lines[3]][:-1]
    if json.loads(last).get("kind") == "run":  # cut a cell, not the run summary
        kept = kept[:-1]
        last = lines[-2]
    (cfg.out_dir / "results.jsonl").write_text("".join(kept) + last[: len(last) // 2])
    cut = json.loads(last)
    resumed = run_sweep(cfg)
    rerun = resumed["cells_run"] + resumed["passkey_cells"]
    assert rerun == 2, resumed
    rows = store.rows()
    assert all(isinstance(r, dict) for r in rows)
    assert (cfg.out_dir / "results.jsonl").read_bytes().endswith(b"\n")
    keys = [json.dumps(r["key"], sort_keys=True) for r in rows if "key" in r]
    for row in (dropped, cut):
        assert keys.count(json.dumps(row["key"], sort_keys=True)) == 1

    # Rendering: every cell in the table, valid PNGs.
    for name in ("ppl.png", "curves.png", "cache_bytes.png", "passkey.png"):
        data = (cfg.out_dir / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 1000, name
    report = (cfg.out_dir / "report.md").read_text()
    table = [l for l in report.splitlines() if l.startswith("| ")]
    for label in ("full", "streaming", "weightedkv", "weightedkv-evict", "weightedkv+int8"):
        row = next(l for l in table if l.startswith(f"| {label} |"))
        assert row.count("|") == 2 + 2 * 2 * 3 and " - |" not in row, row
    assert "Passkey retrieval" in report
    # The sweep's own speed, summed over the cells shown: 18 x 39 scored tokens, and 6 prompts
    # of L + 4 tokens in each of 2 passkey cells per length.
    assert "perplexity, 702 scored tokens in" in report
    assert f"passkey, {2 * 6 * (96 + 4) + 2 * 6 * (128 + 4):,} prompt and answer tokens" in report
    assert not list(cfg.out_dir.glob(".*.tmp"))

    # --render-only redraws from the JSONL alone.
    (cfg.out_dir / "report.md").unlink()
    proc = run_cli("eval.py", "sweep", "--config", cfg.path, "--render-only")
    assert proc.returncode == 0, proc.stderr
    assert (cfg.out_dir / "report.md").read_text() == report


def test_sweep_config_errors(tmp_path, tiny_checkpoint, corpora):
    def fails(needle, **extra):
        path = write_config(tmp_path, tiny_checkpoint, corpora, **extra)
        with pytest.raises(UserError, match=re.escape(needle)):
            run_sweep(load_config(path))

    fails("unknown policy 'nosuch'", policies=["full", "nosuch"])
    fails("unknown key(s) max_token", max_token=5)
    fails("no option `merge_span`", policies=[{"cache": "h2o", "merge_span": 3}])
    fails("`kv_middle` int8", policies=["cam+int8"])
    fails("cache_sizes must be", cache_sizes=[256, "big"])
    fails("unknown corpus 'missing'", corpora=["gen1", "missing"])
    fails("fewer than max_tokens", max_tokens=100000)
    fails("leaves no room for a haystack", passkey={"corpus": "gen1", "lengths": [32]})
    (tmp_path / "taken").write_text("")  # a file where out_dir needs a directory
    fails("results file", out_dir=str(tmp_path / "taken"))
    bad = tmp_path / "bad.toml"
    bad.write_text("policies = [full\n")
    with pytest.raises(UserError, match="cannot parse"):
        load_config(bad)
    assert not (tmp_path / "out").exists()  # nothing ran
    # On the command line: exit status 2 and one line.
    proc = run_cli("eval.py", "sweep", "--config",
                   write_config(tmp_path, tiny_checkpoint, corpora, policies=["nosuch"]))
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and "unknown policy 'nosuch'" in lines[0]


def test_passkey_cli(tmp_path, tiny_checkpoint, corpora, capsys):
    out = tmp_path / "pk.jsonl"
    args = ("eval.py", "passkey", "--checkpoint_path", tiny_checkpoint, "--corpus_dir", corpora,
            "--corpus", "gen1", "--lengths", "96,112", "--depths", "0.2,0.8", "--trials", "2",
            "--cache", "full,streaming", "--cache_size", "16", "--new_tokens", "3", "--json",
            "--out", out)
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    cells = [json.loads(l) for l in proc.stdout.splitlines()]
    assert {(c["label"], c["length"]) for c in cells} == {
        (p, n) for p in ("full", "streaming") for n in (96, 112)}
    assert all(set(c["by_depth"]) == {"0.2", "0.8"} for c in cells)
    assert out.with_suffix(".png").read_bytes().startswith(PNG)
    main(list(map(str, args[1:])))  # resumed: nothing runs, the same cells are printed
    captured = capsys.readouterr()
    assert "passkey: 0 cell(s) to run" in captured.err
    assert sorted(captured.out.splitlines()) == sorted(proc.stdout.splitlines())
    assert len(out.read_text().splitlines()) == 4
    with pytest.raises(UserError, match="5000 \\+ 8 new tokens exceeds the model's context of 1024"):
        main(["passkey", "--checkpoint_path", str(tiny_checkpoint), "--corpus_dir",
              str(corpora), "--corpus", "gen1", "--lengths", "5000"])
    # An unusable --out fails before any cell runs, not after the first one.
    with pytest.raises(UserError, match="is not a writable file"):
        main(["passkey", "--checkpoint_path", str(tiny_checkpoint), "--corpus_dir",
              str(corpora), "--corpus", "gen1", "--out", str(tmp_path)])


def test_shipped_configs_are_valid():
    import torch

    from caches import POLICIES, fit_to_bytes
    from conftest import ROOT, tiny_args
    from engine.evaluation.sweep import mib_budget
    grid = load_config(ROOT / "configs" / "results.toml")
    qwen = load_config(ROOT / "configs" / "qwen.toml")
    for cfg, shape in ((grid, dict(n_layer=30, n_head=9, n_kv_heads=3, head_dim=64)),
                       (qwen, dict(n_layer=24, n_head=14, n_kv_heads=2, head_dim=64))):
        labels = [s.label for s in cfg.policies]
        # every policy, and every one with a token-budgeted middle in INT8 too
        assert set(POLICIES) <= set(labels)
        assert {f"{p}+int8" for p, c in POLICIES.items() if c.has_middle
                and not c.keeps_every_token} <= set(labels)
        assert cfg.max_tokens == 4000 and cfg.dtype == "float32" and cfg.compile
        assert cfg.corpora == ["wiki", "kjv"] and cfg.size_dtype == "bfloat16"
        # The equal-bytes budget is what streaming takes at 256 tokens in bfloat16: it gives
        # streaming exactly 256 back on that model's shape.
        (mib,) = [mib_budget(s) for s in cfg.cache_sizes if isinstance(s, str)]
        assert sum(fit_to_bytes("streaming", int(mib * 2**20), tiny_args(**shape),
                                torch.bfloat16)) == 256
    assert grid.cache_sizes == [256, 1024, "6.45MiB"] and qwen.checkpoint_path == \
        "qwen2.5-coder-0.5b"
    assert grid.passkey.lengths == [1024, 2048, 4096] and grid.passkey.depths == [0.1, 0.5, 0.9]
    assert {"knorm", "keydiff", "weightedkv"} <= {s.label for s in grid.passkey.policies}
    assert grid.passkey.cache_sizes == [256, 1024]
    tiny = load_config(ROOT / "configs" / "tiny.toml", out_dir="elsewhere")
    assert str(tiny.out_dir) == "elsewhere" and tiny.passkey.cache_sizes == [64]


def test_sweep_memory_budgets(tmp_path, tiny_checkpoint, corpora):
    """A size "NMiB" is a memory budget: each policy gets the largest regions whose bytes (in
    size_dtype) fit, and the cells key, record and render by the budget."""
    path = write_config(tmp_path, tiny_checkpoint, corpora, cache_sizes=[16, "0.02MiB"],
                        size_dtype="bfloat16", passkey={"corpus": "gen1", "lengths": [96],
                                                        "trials": 1, "cache_sizes": [16],
                                                        "policies": ["weightedkv"]},
                        policies=["full", "streaming", "weightedkv", "weightedkv+int8"])
    cfg = load_config(path)
    assert run_sweep(cfg)["cells_run"] == 2 + 3 * 2 * 2
    rows = {(r["label"], r["cache_size"], r["corpus"]): r
            for r in ResultStore(cfg.out_dir / "results.jsonl").rows() if r.get("kind") != "run"
            and r["key"]["kind"] == "ppl"}
    budget = 0.02 * 2**20
    plain, int8 = rows[("weightedkv", "0.02MiB", "gen1")], rows[("weightedkv+int8", "0.02MiB",
                                                                  "gen1")]
    assert plain["key"]["size_dtype"] == "bfloat16" and "size_dtype" not in \
        rows[("weightedkv", 16, "gen1")]["key"]
    # float32 run, bfloat16 budget: the bytes held are twice the budget's bfloat16 bytes at most
    assert plain["cache_bytes"] <= 2 * budget and int8["cache_bytes"] <= 2 * budget
    assert sum(int8["regions"]) > sum(plain["regions"]) > 16
    assert rows[("streaming", "0.02MiB", "gen2")]["regions"][2] == 0
    report = (cfg.out_dir / "report.md").read_text()
    assert "gen1 0.02MiB ppl" in report
    fails = write_config(tmp_path, tiny_checkpoint, corpora, cache_sizes=["0.0001MiB"],
                         passkey={"corpus": "gen1", "lengths": [96], "cache_sizes": [16]})
    with pytest.raises(UserError, match="too small for streaming"):
        run_sweep(load_config(fails))
