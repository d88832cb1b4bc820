"""engine/loading/export.py: the engine's weights as a GGUF, read back by the engine's own GGUF
converter (names, RoPE row layout, tied head and metadata round-trip), and bench.py's
llama.cpp peer."""
import json

import pytest
import torch

from conftest import run_cli
from engine.loading.checkpoint import load_model, read_config
from engine.loading.convert import _convert_gguf
from engine.loading.export import export_gguf


@pytest.fixture(scope="module")
def default_model(default_checkpoint):
    cfg = read_config(default_checkpoint)
    return load_model(default_checkpoint, pack=False), cfg


def source_gguf(cfg):
    from pathlib import Path
    return Path(cfg["source"].removeprefix("gguf:"))


def read_back(path, tmp_path):
    config, state = _convert_gguf(path, tmp_path / "back", torch.float32, lambda msg: None)
    return config, state


def test_f32_export_reads_back_exactly(default_model, tmp_path):
    model, cfg = default_model
    state = model.state_dict()
    path = export_gguf(state, model.args, source_gguf(cfg), tmp_path / "m.gguf", "F32")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left
    config, back = read_back(path, tmp_path)
    assert config["model"] == cfg["model"]  # metadata: the source's, the shape unchanged
    assert config["tokenizer"]["chat_template"] == cfg["tokenizer"]["chat_template"]
    want = {k: v for k, v in state.items() if k != "output.weight"}  # tied: stored once
    assert sorted(back) == sorted(want)
    for name, t in want.items():  # Q/K rows permuted to llama.cpp's layout and back
        assert torch.equal(back[name], t), name


def test_q8_0_export_is_close_and_bf16_exact_in_bf16(default_model, tmp_path):
    model, cfg = default_model
    state = model.state_dict()
    q8 = read_back(export_gguf(state, model.args, source_gguf(cfg), tmp_path / "q.gguf", "Q8_0"),
                   tmp_path)[1]
    w = state["layers.3.attention.wqkv.weight"]
    err = (q8["layers.3.attention.wqkv.weight"] - w).norm() / w.norm()
    assert 0 < err < 0.01  # 8-bit blocks of 32: quantized, and close
    assert torch.equal(q8["norm.weight"], state["norm.weight"])  # norms stay F32
    bf = read_back(export_gguf(state, model.args, source_gguf(cfg), tmp_path / "b.gguf", "BF16"),
                   tmp_path / "b")[1]
    w = state["layers.0.feed_forward.w2.weight"]
    assert torch.equal(bf["layers.0.feed_forward.w2.weight"], w.bfloat16().float())


def test_llama_cpp_peer_needs_its_package(default_checkpoint, monkeypatch):
    import importlib.util

    import bench
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    from core.errors import UserError
    with pytest.raises(UserError) as e:
        bench.main(["--peer", "llama.cpp", "--contexts", "16", "--compile", "off"])
    assert "pip install llama-cpp-python" in str(e.value) and "\n" not in str(e.value)


def test_a_peer_that_does_not_import_is_a_one_line_error(default_checkpoint, monkeypatch):
    """A peer package installed without its dependencies (llama-cpp-python by `pip install
    --no-deps`) fails before the engine's rows, in one line that names what is missing."""
    import importlib
    import importlib.util

    import bench
    real_spec, real_import = importlib.util.find_spec, importlib.import_module

    def broken(name, *a):
        if name == "llama_cpp":
            raise ModuleNotFoundError("No module named 'diskcache'")
        return real_import(name, *a)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object()
                        if name == "llama_cpp" else real_spec(name, *a))
    monkeypatch.setattr(importlib, "import_module", broken)
    from core.errors import UserError
    with pytest.raises(UserError) as e:
        bench.main(["--peer", "llama.cpp", "--contexts", "16", "--compile", "off"])
    message = str(e.value)
    assert "does not import" in message and "diskcache" in message and "\n" not in message
    assert "pip install llama-cpp-python" in message


def test_llama_cpp_peer_runs_the_same_weights(default_checkpoint):
    """Optional peer: llama-cpp-python is not in the requirements (it compiles llama.cpp,
    longer than CI's budget); where it is installed, the peer runs the engine's F32 weights and
    greedy decoding agrees with the engine's."""
    pytest.importorskip("llama_cpp")
    proc = run_cli("bench.py", "--peer", "llama.cpp", "--contexts", "64", "--new_tokens", "8",
                   "--repeats", "1", "--compile", "off", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    (peer,) = result["peer_rows"]
    assert peer["engine"] == "llama.cpp" and "GGUF F32" in peer["peer_cache"]
    assert peer["decode_tokens_per_s"] > 0 and peer["prefill_tokens_per_s"] > 0
    assert peer["tokens_match"] is True and "eager" in peer["engine_over_peer"]
