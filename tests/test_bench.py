"""bench.py end to end on the default model (tiny settings, no wall-clock assertions), its
transformers peer as an outside witness of the greedy tokens, and generate.py --profile."""
import json
import subprocess
import sys

import pytest
from safetensors import safe_open

from conftest import ROOT, run_cli
from engine.checkpoint import read_config

CONTEXT, NEW, CACHE_SIZE = 32, 4, 16


def one_line_error(proc, needle):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def bench(default_checkpoint):
    pytest.importorskip("transformers")
    proc = run_cli("bench.py", "--checkpoint_path", default_checkpoint, "--contexts", CONTEXT,
                   "--new_tokens", NEW, "--repeats", 1, "--compile", "off", "--cache",
                   "full,streaming", "--cache_size", CACHE_SIZE, "--peer", "transformers",
                   "--json", env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # stdout is exactly one JSON object


def test_bench_rows_and_bytes_per_token(bench, default_checkpoint):
    assert bench["machine_bandwidth_gbs"] > 0
    assert bench["machine"]["torch"] and bench["machine"]["threads"] >= 1
    assert bench["model"]["quantization"] is None and bench["model"]["dtype"] == "float32"
    rows = {r["policy"]: r for r in bench["rows"]}
    assert set(rows) == {"full", "streaming"}
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


@pytest.mark.parametrize("args, needle", [
    (["--cache", "full,nosuch"], "unknown cache policy 'nosuch'"),
    (["--contexts", "256,0"], "--contexts"),
    (["--compile", "maybe"], "--compile"),
])
def test_bad_arguments_are_one_line_errors(args, needle):
    one_line_error(run_cli("bench.py", *args), needle)


def test_bad_profile_path_is_refused_before_generating(tmp_path):
    one_line_error(run_cli("generate.py", "--profile", tmp_path), "is a directory")
    one_line_error(run_cli("generate.py", "--profile", tmp_path / "no" / "t.json"),
                   "does not exist")


def test_context_beyond_the_model_is_a_user_error(default_checkpoint):
    one_line_error(run_cli("bench.py", "--checkpoint_path", default_checkpoint, "--contexts",
                           "8192", "--compile", "off"), "exceeds the model's 8192 positions")


def test_peer_without_transformers_names_the_install():
    # A None entry in sys.modules makes `import transformers` fail as if it were not installed.
    code = ("import runpy, sys; sys.modules['transformers'] = None; "
            f"sys.argv = ['bench.py', '--peer', 'transformers']; "
            f"runpy.run_path({str(ROOT / 'bench.py')!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    one_line_error(proc, "pip install transformers")
