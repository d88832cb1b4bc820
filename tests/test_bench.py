"""bench.py end to end on the default model (tiny settings, no wall-clock assertions), its
transformers peer as an outside witness of the greedy tokens, and generate.py --profile."""
import json
import sys

import pytest
import torch
from safetensors import safe_open

from conftest import ROOT, run_cli
from engine.loading.checkpoint import read_config

CONTEXT, NEW, CACHE_SIZE = 32, 4, 16


@pytest.fixture(scope="module")
def bench(default_checkpoint):
    pytest.importorskip("transformers")
    proc = run_cli("bench.py", "--checkpoint_path", default_checkpoint, "--contexts", CONTEXT,
                   "--new_tokens", NEW, "--repeats", 1, "--compile", "off", "--cache",
                   "full,streaming", "--cache_size", CACHE_SIZE, "--batch_size", "1,2",
                   "--peer", "transformers",
                   "--json", env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # stdout is exactly one JSON object


def test_bench_rows_and_bytes_per_token(bench, default_checkpoint):
    probes = bench["bandwidth_probes_gbs"]  # three before the rows, two after
    assert len(probes) == 5 and bench["machine_bandwidth_gbs"] == sorted(probes)[2] > 0
    assert bench["bandwidth_spread_gbs"] == [min(probes), max(probes)]
    assert bench["bandwidth_probe_bytes"] >= max(256 * 2**20, 8 * bench["last_level_cache_bytes"])
    assert bench["machine"]["torch"] and bench["machine"]["threads"] >= 1
    assert bench["model"]["quantization"] is None and bench["model"]["dtype"] == "float32"
    rows = {r["policy"]: r for r in bench["rows"] if r["batch_size"] == 1}
    pairs = {r["policy"]: r for r in bench["rows"] if r["batch_size"] == 2}
    assert set(rows) == set(pairs) == {"full", "streaming"} and len(bench["rows"]) == 4
    m = read_config(default_checkpoint)["model"]
    # Independently: every tensor stored in the checkpoint (the tied head is stored once, as the
    # embedding table the head reads whole) plus the one embedding row a token looks up.
    with safe_open(str(default_checkpoint / "model.safetensors"), "pt") as f:
        stored = sum(f.get_tensor(k).numel() * 4 for k in f.keys())
    weights = stored + m["dim"] * 4
    per_slot = m["n_layer"] * 2 * m["n_kv_heads"] * m["head_dim"] * 4  # K and V, float32
    # full: the filled context; streaming: every slot it attends over (sink + window = budget,
    # plus the 32 prefill staging slots and the one spare middle slot)
    expected_kv = {"full": per_slot * CONTEXT, "streaming": per_slot * (CACHE_SIZE + 32 + 1)}
    for name, r in rows.items():
        assert r["engine"] == "regionkv" and r["context"] == CONTEXT and r["compiled"] is False
        assert r["compiled_prefill"] is False
        assert r["weight_bytes_per_token"] == weights
        assert r["kv_bytes_per_token"] == expected_kv[name]
        assert r["bytes_per_token"] == weights + expected_kv[name]
        assert r["decode_tokens_per_s"] > 0 and r["prefill_tokens_per_s"] > 0
        assert r["ttft_s"] > 0 and r["compile_s"] is None
        assert r["bandwidth_gbs"] == pytest.approx(r["bytes_per_token"] *
                                                   r["decode_tokens_per_s"] / 1e9)
        assert 0 < r["bandwidth_fraction"] == pytest.approx(r["bandwidth_gbs"] /
                                                            bench["machine_bandwidth_gbs"])
        assert r["cache_bytes"] > 0 and r["peak_memory_bytes"] > 0
        assert len(r["new_ids"]) == NEW + 1
    # streaming holds 16 + 32 + 1 slots against full's 32 + 4 + 1 positions: more bytes
    assert rows["streaming"]["cache_bytes"] > rows["full"]["cache_bytes"]
    assert rows["full"]["overhead_ms_per_token"] is None
    assert rows["streaming"]["overhead_vs"] is None  # no full row at context 16 to compare with
    # Two sequences: twice the K/V reads, the weights read once per step, the same
    # greedy tokens (the prompt is repeated), and tok/s counts both sequences.
    for name, r in pairs.items():
        one = rows[name]
        assert one["cache_bytes"] < r["cache_bytes"] <= 2 * one["cache_bytes"]  # some maps shared
        assert r["kv_bytes_per_token"] == 2 * one["kv_bytes_per_token"]
        assert r["weight_bytes_per_token"] == one["weight_bytes_per_token"]
        assert r["new_ids"] == one["new_ids"]
        assert r["decode_tokens_per_s"] == pytest.approx(2e3 / r["decode_ms_per_token"])
        assert r["bandwidth_gbs"] == pytest.approx(r["bytes_per_token"] *
                                                   r["decode_tokens_per_s"] / 2e9)


def test_transformers_peer_is_an_outside_witness(bench):
    peers = {r["policy"]: r for r in bench["peer_rows"]}
    full = peers["full"]
    engine = next(r for r in bench["rows"] if r["policy"] == "full")
    # Same weights, prompt ids and greedy decoding: the peer's tokens must be the engine's.
    assert full["new_ids"] == engine["new_ids"] and full["tokens_match"] is True
    assert full["peer_cache"] == "dynamic"
    assert full["decode_tokens_per_s"] > 0 and full["engine_over_peer"]["eager"] > 0
    assert peers["streaming"]["peer_cache"].startswith("sliding_window(16")
    assert any("transformers" in n and "generate" in n for n in bench["notes"])


def test_profile_writes_a_chrome_trace_with_labels(default_checkpoint, tmp_path):
    trace = tmp_path / "trace.json"
    proc = run_cli("generate.py", "--checkpoint_path", default_checkpoint, "--prompt",
                   "Hello, my name is", "--max_new_tokens", 3, "--temperature", 0, "--profile",
                   trace, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert str(trace) in proc.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    names = [e.get("name") for e in events]
    assert names.count("prefill") == 1 and names.count("decode") == 2


def in_process(script, argv, capsys):
    """Run a CLI's main as `python script.py argv` would (the errors come before any model is
    loaded, so there is no need for a subprocess); returns (exit status, stderr)."""
    module = __import__(script)
    with pytest.raises(SystemExit) as e:
        module.run(lambda: module.main([str(a) for a in argv]))
    return e.value.code, capsys.readouterr().err


def assert_one_line_error(status, err, needle):
    assert status == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0], lines[0]


@pytest.mark.parametrize("args, needle", [
    (["--cache", "full,nosuch"], "unknown cache policy 'nosuch'"),
    (["--contexts", "256,0"], "--contexts"),
    (["--batch_size", "1,x"], "--batch_size: '1,x' is not a comma-separated list of positive batch"),
    (["--compile", "maybe"], "--compile"),
    (["--cache", "full", "--kv_middle", "int8"], "--kv_middle int8 needs a policy with a middle"),
    (["--compile", "off", "--compile_prefill"], "give --compile on or both with it"),
    (["--compile", "off", "--bake_weights"], "--bake_weights bakes the weights into compiled"),
    (["--memory_gib", "1", "--batch_size", "4"], "--memory_gib sets each policy's batch"),
    (["--memory_gib", "0"], "--memory_gib"),
    (["--memory_gib", "1", "--speculate", "ngram"], "--speculate times one stream"),
])
def test_bad_arguments_are_one_line_errors(args, needle, capsys):
    assert_one_line_error(*in_process("bench", args, capsys), needle)


def test_bake_weights_without_compile_is_a_one_line_error(capsys):
    assert_one_line_error(*in_process("generate", ["--bake_weights"], capsys),
                          "give --compile with it")


def test_bad_profile_path_is_refused_before_generating(tmp_path, capsys):
    assert_one_line_error(*in_process("generate", ["--profile", tmp_path], capsys),
                          "is a directory")
    assert_one_line_error(*in_process("generate", ["--profile", tmp_path / "no" / "t.json"],
                                      capsys), "does not exist")


def test_context_beyond_the_model_is_a_user_error(default_checkpoint, capsys):
    assert_one_line_error(*in_process("bench", ["--checkpoint_path", default_checkpoint,
                                                "--contexts", "8192"], capsys),
                          "exceeds the model's 8192 positions")


def test_peer_without_transformers_names_the_install(monkeypatch, capsys):
    # A None entry in sys.modules makes `import transformers` fail as if it were not installed.
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert_one_line_error(*in_process("bench", ["--peer", "transformers"], capsys),
                          "pip install transformers")


def test_the_cli_itself_exits_2_with_one_line():
    proc = run_cli("bench.py", "--contexts", "0")
    assert "Traceback" not in proc.stderr
    assert_one_line_error(proc.returncode, proc.stderr, "--contexts")


def test_policy_overhead_is_measured_against_the_same_budget():
    import bench
    args = bench.build_parser().parse_args(["--cache", "full,weightedkv", "--kv_middle", "int8",
                                            "--cache_size", "64", "--prompt_compression", "bulk",
                                            "--compression_interval", "4"])
    notes = []
    factories = bench.policy_factories(args, notes)
    # streaming joins as the baseline; --kv_middle reaches only the policy with a middle, the
    # prompt flags only the compressing policies
    assert list(factories) == ["full", "weightedkv", "streaming"] and notes
    assert factories["full"][1] == {"cache_size": None, "kv_middle": "model",
                                    "positions": "original", "prefill_chunk": None,
                                    "prompt_compression": None, "compression_interval": None}
    assert factories["weightedkv"][1]["kv_middle"] == "int8"
    assert factories["weightedkv"][1]["prompt_compression"] == "bulk"
    assert factories["weightedkv"][1]["compression_interval"] == 4
    assert factories["streaming"][1] == {"cache_size": 64, "kv_middle": "model",
                                         "positions": "original", "prefill_chunk": 32,
                                         "prompt_compression": "bulk", "compression_interval": 4}

    def row(policy, size, ctx, ms, engine="regionkv"):
        return dict(engine=engine, policy=policy, cache_size=size, context=ctx, compiled=False,
                    batch_size=1, decode_ms_per_token=ms, decode_tokens_per_s=1e3 / ms,
                    new_ids=[1, 2])
    rows = [row("full", None, 64, 10.0), row("full", None, 1024, 14.0),
            row("streaming", 64, 1024, 11.0), row("weightedkv", 64, 1024, 12.5),
            row("weightedkv", 64, 4096, 13.0)]
    spec = row("streaming", 64, 1024, 5.5, engine="speculative")  # not a baseline
    bench.add_overheads(rows + [spec])
    bench.add_speedups(rows + [spec])
    assert spec["speedup"] == 2.0 and spec["same_tokens"]
    over = {(r["policy"], r["context"]): (r["overhead_ms_per_token"], r["overhead_vs"])
            for r in rows}
    assert over[("weightedkv", 1024)] == (1.5, "streaming@1024")
    assert over[("streaming", 1024)] == (1.0, "full@64")  # full holding the same 64 tokens
    assert over[("weightedkv", 4096)] == (3.0, "full@64")
    assert over[("full", 1024)] == (None, None)


def test_equal_memory_runs_the_streams_that_fit(default_checkpoint):
    """--memory_gib: each policy runs as many streams as its caches fit in that memory, every
    stream holding the same prompt (read once, copied row to row), against full's streams."""
    import bench
    from caches import cache_nbytes
    from engine.loading.checkpoint import load_model
    gib, ctx = 0.02, 128
    proc = run_cli("bench.py", "--checkpoint_path", default_checkpoint, "--contexts", ctx,
                   "--new_tokens", NEW, "--repeats", 1, "--compile", "off", "--cache",
                   "full,streaming", "--cache_size", CACHE_SIZE, "--memory_gib", gib, "--json",
                   env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    rows = {r["policy"]: r for r in result["rows"]}
    model = load_model(default_checkpoint)
    args = bench.build_parser().parse_args(["--cache", "full,streaming",
                                            "--cache_size", str(CACHE_SIZE)])
    for name, (factory, _) in bench.policy_factories(args, []).items():
        r, length = rows[name], ctx + NEW + 1
        fits = [cache_nbytes(model.args, b, length, torch.float32, factory) <= gib * 2**30
                for b in (r["batch_size"], r["batch_size"] + 1)]
        assert fits == [True, False], name  # the most streams that fit
        assert r["memory_gib"] == gib and r["cache_bytes"] <= gib * 2**30
        assert r["kernels_per_step"] is None  # eager: nothing generated to count
    full, streaming = rows["full"], rows["streaming"]
    assert 1 < full["batch_size"] < streaming["batch_size"]  # 133 positions against 49 slots
    assert streaming["streams_over_full"] == streaming["batch_size"] / full["batch_size"]
    assert streaming["throughput_over_full"] == pytest.approx(
        streaming["decode_tokens_per_s"] / full["decode_tokens_per_s"])
    assert full["streams_over_full"] == 1.0
    # the prompt is read once: prefill tokens/s counts one stream's
    assert full["prefill_tokens_per_s"] == pytest.approx(ctx / full["ttft_s"])


# ---- scripts/random_checkpoint.py: models of published shapes, for speed measurements ---------

def test_random_checkpoint_has_the_shapes_and_loads(default_checkpoint, tmp_path):
    import torch

    from conftest import write_tiny_checkpoint
    from engine.loading.checkpoint import load_model
    shape = write_tiny_checkpoint(tmp_path / "shape", default_checkpoint, vocab_size=49152,
                                  n_layer=2, dim=32, n_head=2, n_kv_heads=1, head_dim=16,
                                  intermediate_size=64, tie_embeddings=True)
    outs = []
    for name in ("a", "b"):
        r = run_cli("scripts/random_checkpoint.py", shape, tmp_path / name, "--dtype", "float32")
        assert r.returncode == 0, r.stderr
        outs.append(tmp_path / name)
    cfg = read_config(outs[0])
    assert cfg["model"] == read_config(shape)["model"]
    assert cfg["source"] == f"random:{shape}:seed0"
    assert (outs[0] / "tokenizer.json").read_bytes() == (default_checkpoint / "tokenizer.json").read_bytes()
    a, b, src = (load_model(p, pack=False).state_dict() for p in (*outs, shape))
    assert a.keys() == src.keys()
    for k in a:
        assert a[k].shape == src[k].shape and torch.equal(a[k], b[k])  # seeded
        if k.endswith("norm.weight"):
            assert torch.equal(a[k], torch.ones_like(a[k]))
        else:
            assert not torch.equal(a[k], src[k]) and abs(a[k].std().item() - 0.02) < 0.005
    # an existing directory is never touched; an unknown shape names the choices
    r = run_cli("scripts/random_checkpoint.py", shape, outs[1])
    assert r.returncode == 2 and "exists; pass a new directory" in r.stderr
    r = run_cli("scripts/random_checkpoint.py", "llama-9", tmp_path / "c")
    assert r.returncode == 2 and "unknown shape 'llama-9'; choose from llama-3-8b, llama-3.1-8b" in r.stderr
    assert not (tmp_path / "c").exists() and len(r.stderr.strip().splitlines()) == 1


def test_llama3_8b_shapes_have_its_published_parameter_count():
    import torch

    sys.path.insert(0, str(ROOT / "scripts"))
    from model import ModelArgs, Transformer
    from random_checkpoint import SHAPES
    with torch.device("meta"):
        model = Transformer(ModelArgs.from_dict(SHAPES["llama-3-8b"]))
        long = Transformer(ModelArgs.from_dict(SHAPES["llama-3.1-8b"]))
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248
    assert sum(p.numel() for p in long.parameters()) == 8_030_261_248
    assert long.args.max_position_embeddings == 131072 and long.args.rope_scaling["factor"] == 8
