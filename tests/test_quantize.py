"""Weight-only INT8/INT4 quantization (quantize/weights.py, quantize.py, engine.loading.checkpoint)."""
import json
import shutil

import pytest
import torch
import torch.nn.functional as F

from core import kernels
from caches import build_caches
from conftest import run_cli, tiny_model

from engine.loading.checkpoint import WEIGHTS_NAME, load_model
from core.errors import UserError
from quantize.weights import (Int4Linear, Int8Linear, QuantConfig, QuantizedLinear,
                              dequantize_int4, dequantize_int8, quantize_int4, quantize_int8,
                              quantize_model, quantize_state_dict, target_linears)

PROMPT = "The history of the Roman Empire spans many centuries, from the founding of the city to"
# Greedy tokens that stay identical to float on PROMPT (measured: int8 27, int4 g64 6; see
# docs/DESIGN.md). Beyond that the quantized models pick other, equally plausible words.
SAME_TOKENS = {"int8": 24, "int4": 5}


def onednn_packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs linears of dtype on this CPU, by PyTorch's own check: AVX2-only
    CPUs of the pool have no oneDNN bfloat16, and there the engine keeps the plain weight."""
    return torch.backends.mkldnn.is_available() and (
        dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported())


def without_onednn(monkeypatch) -> None:
    """oneDNN's reorder fails, as it does for bfloat16 on an AVX2-only CPU."""
    def missing(*args):
        raise RuntimeError("no oneDNN kernel for this dtype on this CPU")
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", missing)


@pytest.fixture(scope="module")
def float_model(default_checkpoint):
    return load_model(default_checkpoint)


@pytest.fixture(scope="module")
def quantized(default_checkpoint, tmp_path_factory):
    """The default model quantized once per mode: int8 through the CLI, int4 (g64) in process."""
    from engine.loading.checkpoint import quantize_checkpoint
    root = tmp_path_factory.mktemp("quantized")
    proc = run_cli("quantize.py", "--checkpoint_path", default_checkpoint, "--mode", "int8",
                   "--out", root / "int8", env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    quantize_checkpoint(default_checkpoint, "int4", 64, root / "int4")
    return {"int8": root / "int8", "int4": root / "int4"}


def test_a_quantized_checkpoint_keeps_its_float_weights_in_reach_of_the_peers(
        quantized, default_checkpoint):
    # bench.py's peers run the float weights a quantized checkpoint was made from (llama.cpp
    # writes them as Q8_0, with the metadata of the GGUF named by `source`): the config keeps
    # the float model's `source` and names the float checkpoint itself.
    import bench
    from engine.loading.checkpoint import read_config
    cfg, float_cfg = read_config(quantized["int8"]), read_config(default_checkpoint)
    assert cfg["source"] == float_cfg["source"] and cfg["source"].startswith("gguf:")
    assert cfg["float_checkpoint"] == str(default_checkpoint)
    assert bench.gguf_weight_type(cfg, torch.float32) == "Q8_0"
    model = load_model(quantized["int8"])
    peer = bench.peer_float_model(model, cfg, quantized["int8"], torch.float32, "cpu")
    want = load_model(default_checkpoint).state_dict()
    got = peer.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    moved = dict(cfg, float_checkpoint=str(quantized["int8"].parent / "gone"))
    with pytest.raises(UserError, match="quantize it again with quantize.py"):
        bench.peer_float_model(model, moved, quantized["int8"], torch.float32, "cpu")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.fixture(scope="module")
def float_greedy(float_model, default_checkpoint):
    from engine.runtime.generation import Generator
    from engine.loading.tokenizer import load_tokenizer
    ids = load_tokenizer(default_checkpoint).encode(PROMPT)
    n = max(SAME_TOKENS.values())
    ref = Generator(float_model, 64).generate(ids, n).new_ids[0]
    assert len(ref) == n  # no early EOS
    return ids, ref


def sqnr_db(ref: torch.Tensor, out: torch.Tensor) -> float:
    return 10 * torch.log10(ref.pow(2).sum() / (ref - out).pow(2).sum()).item()


# ----------------------------------------------------------------------------------------------
# Numerics on the real model


@pytest.fixture(scope="module")
def linear_inputs(float_model, default_checkpoint):
    """The input of every target linear while the float model reads PROMPT."""
    from engine.loading.tokenizer import load_tokenizer
    ids = load_tokenizer(default_checkpoint).encode(PROMPT)
    inputs, hooks = {}, []
    for name in target_linears(float_model):
        hooks.append(float_model.get_submodule(name).register_forward_pre_hook(
            lambda mod, a, name=name: inputs.__setitem__(name, a[0].clone())))
    try:
        with torch.inference_mode():
            float_model(torch.tensor([ids]), torch.arange(len(ids)),
                        build_caches(float_model, 1, 64))
    finally:
        for h in hooks:
            h.remove()
    return inputs


@pytest.mark.parametrize("mode,groupsize,min_db", [("int8", None, 35.0), ("int4", 64, 15.0)])
def test_sqnr_on_real_weights_and_activations(float_model, linear_inputs, mode, groupsize, min_db):
    inputs = linear_inputs
    worst = (float("inf"), None)
    for name in target_linears(float_model):
        lin = float_model.get_submodule(name)
        q = Int8Linear(lin.in_features, lin.out_features) if mode == "int8" else \
            Int4Linear(lin.in_features, lin.out_features, groupsize=groupsize)
        q.set_weight(lin.weight.detach())
        q.pack(torch.float32)  # the kernel the engine runs (bf16 matmul on CPU)
        with torch.inference_mode():
            db = sqnr_db(F.linear(inputs[name], lin.weight), q(inputs[name]))
        worst = min(worst, (db, name))
    # Every single layer, the tied output head included, clears the bar.
    assert worst[0] >= min_db, worst


def test_quantize_dequantize_formulas():
    torch.manual_seed(0)
    w = torch.randn(48, 128)
    q, s = quantize_int8(w)
    assert q.dtype == torch.int8 and q.abs().max() == 127
    assert (dequantize_int8(q, s) - w).abs().max() <= s.max() / 2 + 1e-6
    packed, s4, z4 = quantize_int4(w, 32)
    assert packed.shape == (48, 64) and packed.dtype == torch.uint8 and s4.shape == (48, 4)
    err = (dequantize_int4(packed, s4, z4) - w).abs().reshape(48, 4, 32)
    assert (err <= s4[..., None] / 2 + 1e-6).all()
    # Both ends of every group are represented exactly (asymmetric min/max).
    wd = dequantize_int4(packed, s4, z4).reshape(48, 4, 32)
    torch.testing.assert_close(wd.amin(-1), w.reshape(48, 4, 32).amin(-1))
    torch.testing.assert_close(wd.amax(-1), w.reshape(48, 4, 32).amax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_packed_kernel_and_compile_match_eager_formula(mode, dtype):
    m = tiny_model(attention_bias=True).to(dtype)
    quantize_model(m, QuantConfig(mode, 32 if mode == "int4" else None))
    block = m.layers[0]
    lin = block.attention.wqkv
    x = torch.randn(2, 5, 64, dtype=dtype)
    with torch.inference_mode():
        formula = lin(x)  # unpacked: the plain formula in the activation dtype
    for mod in block.modules():
        if isinstance(mod, QuantizedLinear):
            mod.pack(dtype)
    assert lin.kernel == ("int8pack_bf16" if mode == "int8" else "int4pack_cpu")
    assert m.dtype == dtype and not hasattr(lin, "weight")  # caches read the model's dtype
    with torch.inference_mode():
        assert rel_err(lin(x), formula) < 1e-2  # the CPU kernels run a bf16 matmul
        # The engine compiles each block with fullgraph=True; the FFN holds three quantized
        # linears (the 3-D input takes the kernels' 2-D reshape path).
        ff = block.feed_forward
        compiled, eager = torch.compile(ff, fullgraph=True)(x), ff(x)
        if dtype == torch.float32:
            torch.testing.assert_close(compiled, eager)
        else:  # Inductor fuses silu * mul in float32, eager rounds in between
            assert rel_err(compiled, eager) < 1e-2


def test_failing_kernel_falls_back_to_the_formula(monkeypatch):
    lin = Int4Linear(64, 40, bias=True, groupsize=32)
    lin.set_weight(torch.randn(40, 64))
    x = torch.randn(3, 64)
    formula = lin(x)
    # A kernel that is missing (as on a build without it) is skipped with a warning.
    def missing(*args):
        raise NotImplementedError("no kernel for this build")
    monkeypatch.setattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu", missing)
    with pytest.warns(UserWarning, match="no fast kernel"):
        lin.pack(torch.float32)
    assert lin.kernel == "dequant"
    torch.testing.assert_close(lin(x), formula)


# ----------------------------------------------------------------------------------------------
# Checkpoints


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantized_checkpoint_round_trips(quantized, default_checkpoint, mode):
    from safetensors.torch import load_file
    out = quantized[mode]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization"] == {"mode": mode, "groupsize": None if mode == "int8" else 64}
    src_cfg = json.loads((default_checkpoint / "config.json").read_text())
    assert cfg["float_checkpoint"] == str(default_checkpoint)  # for bench.py's peers
    assert {k: v for k, v in cfg.items() if k not in ("quantization", "float_checkpoint")} == \
        {k: v for k, v in src_cfg.items() if k != "quantization"}
    assert (out / src_cfg["tokenizer"]["file"]).is_file()
    written = load_file(str(out / WEIGHTS_NAME))
    assert written["output.qweight"].dtype == (torch.int8 if mode == "int8" else torch.uint8)
    assert written["tok_embeddings.weight"].dtype == torch.float32  # tied: embeddings stay float

    model = load_model(out, pack=False)
    state = model.state_dict()
    assert sorted(state) == sorted(written)
    for k, t in written.items():
        assert state[k].dtype == t.dtype and torch.equal(state[k], t), k
    # What was written is the quantization of the float weights (the tied head: tok_embeddings).
    qcfg = QuantConfig.from_dict(cfg["quantization"])
    emb = load_file(str(default_checkpoint / WEIGHTS_NAME))["tok_embeddings.weight"]
    quantized_head = quantize_int8(emb) if mode == "int8" else quantize_int4(emb, qcfg.groupsize)
    for name, t in zip(("qweight", "scales", "zeros"), quantized_head):
        assert torch.equal(t, written[f"output.{name}"]), name
    args = model.args
    packed = load_model(out)
    assert packed.output.kernel == ("int8pack_bf16" if mode == "int8" else "int4pack_cpu")
    x = torch.randn(1, 3, args.dim, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert rel_err(packed.output(x), model.output(x)) < 1e-2  # bf16 kernel vs formula


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantized_greedy_tokens_match_float(quantized, float_greedy, default_checkpoint, mode):
    from engine.runtime.generation import Generator
    ids, ref = float_greedy
    n = SAME_TOKENS[mode]
    model = load_model(quantized[mode])
    got = Generator(model, 64).generate(ids, n).new_ids[0]
    assert got == ref[:n]
    # the compiled step, its blocks one nested compiled region, runs the same kernels
    assert Generator(model, 64, compile=True).generate(ids, n).new_ids[0] == got
    # bench.py's bytes per token count the packed codes and scales, not float weights
    from bench import weight_bytes_per_token
    a = model.args
    n_linear = (a.n_layer * a.dim * ((a.n_head + 2 * a.n_kv_heads) * a.head_dim + a.n_head * a.head_dim
                                     + 3 * a.intermediate_size) + a.dim * a.vocab_size)
    bits = {"int8": 8, "int4": 4}[mode]
    assert n_linear * bits / 8 < weight_bytes_per_token(model) < n_linear * bits / 8 * 1.3


def test_unknown_quantization_mode_is_a_user_error(quantized, tmp_path):
    cfg = json.loads((quantized["int8"] / "config.json").read_text())
    cfg["quantization"] = {"mode": "int3", "groupsize": None}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="unknown quantization mode 'int3'"):
        load_model(tmp_path)


def test_config_validation():
    with pytest.raises(ValueError, match="groupsize applies to int4"):
        QuantConfig("int8", 64)
    with pytest.raises(ValueError, match="groupsize must be one of"):
        QuantConfig("int4", 48)
    assert QuantConfig("int4").resolve([576, 1536]).groupsize == 32
    with pytest.raises(ValueError, match="groupsize 32 does not divide"):
        QuantConfig("int4").resolve([576, 1000])
    with pytest.raises(ValueError, match="does not divide in_features 576"):
        QuantConfig("int4", 128).resolve([576, 1536])


# ----------------------------------------------------------------------------------------------
# CLI errors


def one_line_error(proc, needle):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], proc.stderr


def test_cli_errors(quantized, default_checkpoint, tmp_path):
    env = {"OMP_NUM_THREADS": "1"}

    def q(*args):
        return run_cli("quantize.py", *args, env=env)

    one_line_error(q("--checkpoint_path", tmp_path / "nope", "--mode", "int8"), "does not exist")
    one_line_error(q("--checkpoint_path", default_checkpoint, "--mode", "int4",
                     "--groupsize", "128", "--out", tmp_path / "x"), "does not divide")
    one_line_error(q("--checkpoint_path", default_checkpoint, "--mode", "int4",
                     "--groupsize", "48"), "invalid choice")
    assert not (tmp_path / "x").exists()


def test_checkpoint_errors(quantized, default_checkpoint, tmp_path):
    # The same UserError path as the CLI cases above, without a process each.
    from engine.loading.checkpoint import quantize_checkpoint
    with pytest.raises(UserError, match="already quantized"):
        quantize_checkpoint(quantized["int8"], "int4", None, tmp_path / "x")
    with pytest.raises(UserError, match="int4 only"):
        quantize_checkpoint(default_checkpoint, "int8", 64, tmp_path / "x")
    with pytest.raises(UserError, match="pass a new `out` or remove it"):
        quantize_checkpoint(default_checkpoint, "int8", None, quantized["int8"])
    (tmp_path / "broken").mkdir()
    shutil.copy(default_checkpoint / "config.json", tmp_path / "broken")
    with pytest.raises(UserError, match="has no model.safetensors"):
        quantize_checkpoint(tmp_path / "broken", "int8", None, tmp_path / "x")
    assert not (tmp_path / "x").exists()
    assert not [p for p in quantized["int8"].parent.iterdir() if p.name.startswith(".")]


# ----------------------------------------------------------------------------------------------
# Alignment: the packed CPU kernels crash on AVX-512 when a weight starts off a 64-byte line
# (core/tensors.py). Asserted structurally, so a machine where the kernel survives cannot hide it.


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("mode", ["float", "int8", "int4"])
def test_loaded_checkpoint_tensors_are_64_byte_aligned(quantized, default_checkpoint, mode, pack,
                                                       dtype):
    path = default_checkpoint if mode == "float" else quantized[mode]
    model = load_model(path, dtype=dtype, pack=pack)
    named = list(model.named_parameters()) + list(model.named_buffers())
    assert len(named) > 100
    # oneDNN's packed float weights (quantize/dense.py) live in memory oneDNN allocates itself.
    onednn = {n for n, t in named if t is not None and t.is_mkldnn}
    assert bool(onednn) == (mode == "float" and pack and onednn_packs(dtype))
    bad = {n: t.data_ptr() % 64 for n, t in named
           if t is not None and n not in onednn and t.data_ptr() % 64}
    assert not bad


def test_read_safetensors_aligns_every_tensor_and_words_damage(tmp_path):
    from safetensors.torch import load_file, save_file

    from core.tensors import read_safetensors
    # Odd sizes put every tensor after the first at an offset that is not a multiple of 64.
    state = {f"t{i}": torch.arange(n, dtype=dt) for i, (n, dt) in
             enumerate([(3, torch.int8), (5, torch.float32), (7, torch.int8), (11, torch.bfloat16),
                        (40, torch.uint8)])}
    save_file(state, str(tmp_path / "w.safetensors"))
    raw = load_file(str(tmp_path / "w.safetensors"))
    assert any(t.data_ptr() % 64 for t in raw.values())  # what the plain reader returns
    got = read_safetensors(tmp_path / "w.safetensors")
    for k, t in got.items():
        assert t.data_ptr() % 64 == 0 and torch.equal(t, state[k]), k
        assert t.untyped_storage().nbytes() == t.nbytes  # owns its storage: no file buffer kept
    data = (tmp_path / "w.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:len(data) - 20])
    with pytest.raises(UserError, match="cannot read .*cut.safetensors.*truncated"):
        read_safetensors(tmp_path / "cut.safetensors")


MISALIGNED_INT8_KERNEL = r"""
import sys
import torch
sys.path.insert(0, sys.argv[1])
from quantize.weights import Int8Linear, quantize_int8

torch.manual_seed(0)
N, K, offset = 1728, 576, 8          # a layer-0 wqkv of the default model, 8 bytes off the line
q, scales = quantize_int8(torch.randn(N, K))
buf = torch.empty(N * K + 64, dtype=torch.int8)
start = -buf.data_ptr() % 64 + offset
lin = Int8Linear(K, N)
lin.qweight = buf[start:start + N * K].view(N, K)
lin.qweight.copy_(q)
lin.scales = scales
assert lin.qweight.data_ptr() % 64 == offset
lin.pack(torch.float32)
assert lin.kernel == "int8pack_bf16", lin.kernel
assert lin.qweight.data_ptr() % 64 == 0, "a misaligned weight reached the packed kernel"
with torch.inference_mode():
    for rows in (1, 16, 17, 64, 300):
        x = torch.randn(rows, K)
        ref = x @ (q.float() * scales[:, None]).T
        err = ((lin(x) - ref).norm() / ref.norm()).item()
        assert err < 1e-2, (rows, err)
print("ok")
"""


def test_int8_kernel_never_gets_a_misaligned_weight():
    # In a subprocess: on AVX-512 a misaligned weight with 17+ rows is a segfault, not an error.
    import subprocess
    import sys

    from conftest import ROOT
    proc = subprocess.run([sys.executable, "-c", MISALIGNED_INT8_KERNEL, str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode, proc.stderr)


# ----------------------------------------------------------------------------------------------
# Float linears in oneDNN's packed layout (quantize/dense.py)


@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_float_linears_match_f_linear_eager_and_compiled(dtype, onednn, monkeypatch):
    """onednn=False: as on a CPU without oneDNN's kernel for dtype, the plain weight alone."""
    from quantize.dense import PackedLinear, pack_dense_linears
    if not onednn:
        without_onednn(monkeypatch)
    m = tiny_model(attention_bias=True).to(dtype)
    plain = {n: mod for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear)}
    x = torch.randn(2, 5, 64, dtype=dtype)
    with torch.inference_mode():
        want = {n: lin(x if lin.in_features == 64 else x.repeat(1, 1, lin.in_features // 64))
                for n, lin in plain.items()}
        state = {k: v.clone() for k, v in m.state_dict().items()}
        pack_dense_linears(m)
        packed = dict(m.named_modules())
        assert all(isinstance(packed[n], PackedLinear) for n in plain)
        assert {packed[n].onednn for n in plain} == {onednn and onednn_packs(dtype)}
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
        for n, ref in want.items():
            lin = packed[n]
            got = lin(x if lin.in_features == 64 else x.repeat(1, 1, lin.in_features // 64))
            torch.testing.assert_close(got, ref, **tol)
        # The state dict is the checkpoint format, unchanged (the weights come back exactly).
        assert m.state_dict().keys() == state.keys()
        for k, v in m.state_dict().items():
            assert torch.equal(v, state[k]), k
        # One compiled graph serves blocks holding different packed weights (regional
        # compilation passes them as inputs, through the custom op).
        from torch._dynamo.testing import CompileCounter
        counter = CompileCounter()
        ff = torch.compile(lambda f, h: f(h), fullgraph=True, backend=counter)
        for block in m.layers:
            torch.testing.assert_close(ff(block.feed_forward, x), block.feed_forward(x), **tol)
        assert counter.frame_count == 1


def backend_recording(graphs: list):
    """A torch.compile backend that appends the op names of every graph to `graphs`."""
    def backend(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes])
        return gm.forward
    return backend


@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_few_row_steps_read_plain_weights_as_a_reduction(dtype, onednn, monkeypatch):
    """Where the GEMV kernel does not build (kernels.LINEARS False acts it).
    onednn=False: as on a CPU without oneDNN's kernel for dtype (an AVX2-only CPU in
    bfloat16): the same reduction, over the weight itself, and a float32 GEMM for more rows.
    (Both dtypes stream here, as on a CPU without AMX: see the next test.)"""
    import quantize.dense as dense
    from engine.runtime.generation import compile_decode, decode_one_token
    from quantize.dense import (STREAM_ROWS, PackedLinear, pack_dense_linears,
                                stream_compiled_decode)
    monkeypatch.setattr(kernels, "LINEARS", False)
    monkeypatch.setattr(dense, "STREAMED_DTYPES", dense.DTYPES)
    if not onednn:
        without_onednn(monkeypatch)
    onednn = onednn and onednn_packs(dtype)
    m = pack_dense_linears(tiny_model(attention_bias=True).to(dtype))
    state = {k: v.clone() for k, v in m.state_dict().items()}
    # A compiled decode of more rows than the reduction serves keeps oneDNN alone: no copies.
    compile_decode(decode_one_token, m, backend="eager", rows=STREAM_ROWS + 1)
    linears = [mod for mod in m.modules() if isinstance(mod, PackedLinear)]
    assert len(linears) == 11 and all((lin.plain is None) == onednn for lin in linears)
    compile_decode(decode_one_token, m, backend="eager", rows=STREAM_ROWS)
    in_blocks = {id(mod) for mod in m.layers.modules()}
    for lin in linears:  # the blocks' linears gain a plain copy; an untied head does not
        assert (lin.plain is not None) == (id(lin) in in_blocks or not onednn)
    assert not m.args.tie_embeddings
    assert stream_compiled_decode(m) == 0  # a second compiled session copies nothing again
    # Without oneDNN, the norms before the streamed linears store their output for them (one
    # hook each, however many sessions); the head's norm too where the head streams.
    norms = [n for layer in m.layers for n in (layer.attention_norm, layer.ffn_norm)] + [m.norm]
    assert [len(n._forward_hooks) for n in norms] == [int(not onednn)] * len(norms)
    graphs = []
    backend = backend_recording(graphs)

    def norms_and_linears(b, h):
        return b.attention.wqkv(b.attention_norm(h)), b.feed_forward(b.ffn_norm(h))
    step = torch.compile(norms_and_linears, fullgraph=True, dynamic=False, backend=backend)
    with torch.inference_mode():
        x = torch.randn(1, 1, m.args.dim, dtype=dtype)
        for got, want in zip(step(m.layers[0], x), norms_and_linears(m.layers[0], x)):
            torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    assert sum("regionkv.stored" in t for t in graphs[-1]) == 2 * int(not onednn), graphs[-1]
    for k, v in m.state_dict().items():  # the checkpoint format is unchanged
        assert torch.equal(v, state[k]), k
    step = torch.compile(lambda lin, h: lin(h), fullgraph=True, dynamic=False, backend=backend)
    lin = m.layers[0].attention.wqkv  # with a bias
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    with torch.inference_mode():
        for rows in (1, STREAM_ROWS, STREAM_ROWS + 2):
            x = torch.randn(rows, 1, lin.in_features, dtype=dtype)
            want = F.linear(x.float(), lin.weight.float(), lin.bias.float()).to(dtype)
            torch.testing.assert_close(step(lin, x), want, **tol)
            reduction = not any("linear" in t for t in graphs[-1])  # neither op
            assert reduction == (rows <= STREAM_ROWS), (rows, graphs[-1])
            assert any("packed_linear" in t for t in graphs[-1]) == (onednn and not reduction)
            torch.testing.assert_close(lin(x), want, **tol)  # eager: oneDNN, same values
    # A tied head reads the embedding table itself as its plain weight: no bytes added.
    from model import run_head
    tied = pack_dense_linears(tiny_model(tie_embeddings=True).to(dtype))
    copies = stream_compiled_decode(tied)
    assert copies == onednn * sum(lin.plain.numel() * lin.plain.element_size()
                                  for lin in tied.layers.modules() if isinstance(lin, PackedLinear))
    assert tied.output.plain.data_ptr() == tied.tok_embeddings.weight.data_ptr()
    head = torch.compile(run_head, fullgraph=True, dynamic=False, backend=backend)
    with torch.inference_mode():
        x = torch.randn(1, 1, tied.args.dim, dtype=dtype)
        torch.testing.assert_close(head(tied.norm, tied.output, x),
                                   run_head(tied.norm, tied.output, x), **tol)
    assert not any("linear" in target for target in graphs[-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_an_amx_cpu_compiled_bfloat16_steps_stay_on_onednn(dtype, monkeypatch):
    """Where oneDNN's bfloat16 kernel streams faster than the reduction (a CPU with AMX) and
    the GEMV kernel does not build, a compiled one-row step calls oneDNN, and no plain copies
    are made; float32 still streams, as do plain-only bfloat16 linears (a CPU without oneDNN's
    bfloat16 kernel)."""
    import quantize.dense as dense
    from engine.runtime.generation import compile_decode, decode_one_token
    from model import run_head
    from quantize.dense import PackedLinear, pack_dense_linears, stream_compiled_decode
    monkeypatch.setattr(kernels, "LINEARS", False)
    monkeypatch.setattr(dense, "STREAMED_DTYPES", (torch.float32,))
    streams = dtype == torch.float32 or not onednn_packs(dtype)
    m = pack_dense_linears(tiny_model(tie_embeddings=True).to(dtype))
    compile_decode(decode_one_token, m, backend="eager", rows=1)
    linears = [mod for mod in m.modules() if isinstance(mod, PackedLinear)]
    assert len(linears) == 11 and all((lin.plain is not None) == streams for lin in linears)
    assert stream_compiled_decode(m) == 0
    graphs = []
    backend = backend_recording(graphs)
    head = torch.compile(run_head, fullgraph=True, dynamic=False, backend=backend)
    step = torch.compile(lambda lin, h: lin(h), fullgraph=True, dynamic=False, backend=backend)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    with torch.inference_mode():
        x = torch.randn(1, 1, m.args.dim, dtype=dtype)
        torch.testing.assert_close(head(m.norm, m.output, x), run_head(m.norm, m.output, x),
                                   **tol)
        assert any("packed_linear" in t for t in graphs[-1]) != streams, graphs[-1]
        lin = m.layers[0].feed_forward.w2
        x = torch.randn(1, 1, lin.in_features, dtype=dtype)
        torch.testing.assert_close(step(lin, x), F.linear(x.float(), lin.weight.float()).to(dtype),
                                   **tol)
        assert any("packed_linear" in t for t in graphs[-1]) != streams, graphs[-1]


def gemv_kernels() -> list:
    """The kernels of core/kernels/decode.cpp this CPU runs: the portable one, and up to the best."""
    assert kernels.available(), "the decode kernels build on every x86 machine of the pool"
    return list(range(kernels.KERNEL + 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_gemv_kernel_gives_the_float32_sum_rounded_once(dtype):
    """regionkv::gemv: x @ w.T for 1 to 8 rows, float32 products and sums rounded once to the
    dtype, by each kernel this CPU has (tails of rows and of features included), for any
    leading shape and a strided x; bad input is a clear error, not a crash."""
    from core.kernels import gemv
    g = torch.Generator().manual_seed(0)
    for n, k in [(960, 576), (7, 40), (130, 34), (3, 1536)]:
        w = torch.randn(n, k, generator=g).to(dtype)
        for shape in [(1, k), (2, k), (2, 1, k), (k,), (5, k), (1, 8, k)]:
            x = torch.randn(*shape, generator=g).to(dtype)
            want = x.double() @ w.double().T
            for kernel in gemv_kernels():
                got = gemv(x, w, kernel)
                assert got.dtype == dtype and got.shape == want.shape, (kernel, shape)
                if dtype == torch.float32:
                    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
                else:  # the exact sum rounded once: at most an ulp off from float32's order
                    ulp = want.abs().clamp(min=1e-3) * 2 ** -7
                    assert ((got.double() - want).abs() <= ulp).all(), (kernel, n, k, shape)
        x = torch.randn(2, 2 * k, generator=g).to(dtype)[:, ::2]  # not contiguous
        torch.testing.assert_close(gemv(x, w).double(), x.double() @ w.double().T,
                                   rtol=1e-2, atol=1e-2)
    w = torch.randn(8, 16).to(dtype)
    with pytest.raises(RuntimeError, match="1 to 8 rows"):
        gemv(torch.randn(9, 16).to(dtype), w)
    with pytest.raises(RuntimeError, match="must both be float32 or both bfloat16"):
        gemv(torch.randn(1, 16, dtype=torch.float64), w)
    with pytest.raises(RuntimeError, match="features"):
        gemv(torch.randn(1, 15).to(dtype), w)
    with pytest.raises(RuntimeError, match="kernel 7 does not run here"):
        gemv(torch.randn(1, 16).to(dtype), w, 7)


@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_few_row_steps_call_the_gemv_kernel(dtype, onednn, monkeypatch):
    """Where the GEMV kernel builds, a compiled step of 1 to 8 rows (a batch, a verify step)
    streams every block linear and a tied head through it, in both dtypes (a plain copy beside
    oneDNN's, also where AMX keeps bfloat16 on oneDNN otherwise), with no stored norms; more
    rows stay on oneDNN."""
    from engine.runtime.generation import compile_decode, decode_one_token
    from model import run_head
    from core.kernels import GEMV_ROWS
    from quantize.dense import PackedLinear, pack_dense_linears, stream_compiled_decode
    gemv_kernels()
    if not onednn:
        without_onednn(monkeypatch)
    onednn = onednn and onednn_packs(dtype)
    m = pack_dense_linears(tiny_model(tie_embeddings=True, attention_bias=True).to(dtype))
    compile_decode(decode_one_token, m, backend="eager", rows=1)
    linears = [mod for mod in m.modules() if isinstance(mod, PackedLinear)]
    assert len(linears) == 11 and all(lin.plain is not None for lin in linears)
    assert m.output.plain.data_ptr() == m.tok_embeddings.weight.data_ptr()
    assert stream_compiled_decode(m) == 0
    graphs = []
    backend = backend_recording(graphs)

    def norms_and_linears(b, h):
        return b.attention.wqkv(b.attention_norm(h)), b.feed_forward(b.ffn_norm(h))
    step = torch.compile(norms_and_linears, fullgraph=True, dynamic=False, backend=backend)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    with torch.inference_mode():
        for rows in (1, 2, 5, GEMV_ROWS, GEMV_ROWS + 1):
            x = torch.randn(rows, 1, m.args.dim, dtype=dtype)
            for got, want in zip(step(m.layers[0], x), norms_and_linears(m.layers[0], x)):
                torch.testing.assert_close(got, want, **tol)
            calls = sum("regionkv.gemv" in t for t in graphs[-1])
            assert calls == (4 if rows <= GEMV_ROWS else 0), (rows, graphs[-1])
            assert not any("regionkv.stored" in t for t in graphs[-1])
        head = torch.compile(run_head, fullgraph=True, dynamic=False, backend=backend)
        x = torch.randn(1, 1, m.args.dim, dtype=dtype)
        torch.testing.assert_close(head(m.norm, m.output, x), run_head(m.norm, m.output, x),
                                   **tol)
        assert sum("regionkv.gemv" in t for t in graphs[-1]) == 1, graphs[-1]


def test_without_a_build_of_the_kernels_compiled_steps_read_reductions(monkeypatch):
    """A machine that cannot build core/kernels/decode.cpp (no compiler, no ninja) warns once, in
    one line, and its compiled steps read the plain weights (and the caches) as reductions,
    as before the kernels; a trace that meets no build yet reads reductions too."""
    import torch.utils.cpp_extension as ext
    from quantize import dense

    def no_ninja(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions\n(the rest)")
    monkeypatch.setattr(ext, "load", no_ninja)
    monkeypatch.setattr(kernels, "_built", None)
    lin = dense.PackedLinear(torch.nn.Linear(16, 8, bias=False))
    lin.plain = lin.weight.clone()
    graphs = []
    step = torch.compile(lambda lin, h: lin(h), fullgraph=True, dynamic=False,
                         backend=backend_recording(graphs))
    x = torch.randn(1, 16)
    torch.testing.assert_close(step(lin, x), F.linear(x, lin.weight), rtol=1e-5, atol=1e-5)
    assert kernels._built is None  # the trace did not try
    with pytest.warns(UserWarning, match=r"did not build \(Ninja is required to load C\+\+ "
                                         r"extensions\); compiled steps read their weights"):
        assert not kernels.available()
    assert not kernels.available() and not kernels.serve_linears()  # decided once
    torch.testing.assert_close(step(lin, x), F.linear(x, lin.weight), rtol=1e-5, atol=1e-5)
    assert not any("gemv" in t or "linear" in t for t in graphs[-1]), graphs[-1]
    monkeypatch.setenv("REGIONKV_KERNELS", "0")  # the switch: no kernel, and no build tried
    assert kernels.best_kernel() is None
    monkeypatch.delenv("REGIONKV_KERNELS")
    assert kernels.best_kernel() == kernels.KERNEL


def test_exact_matmul_of_bfloat16_is_the_float32_product_and_leaves_the_math_mode():
    """regionkv::exact_matmul (attention's scores over a prompt chunk, in bfloat16 on an AMX
    CPU) lets oneDNN compute from the bfloat16 values: as exact as the float32 product (both
    against float64), where a bfloat16 matmul's rounded output is not; the global math mode is
    back as it was, and compiled code calls the op."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 96, 64, generator=g).bfloat16()
    k = torch.randn(2, 3, 64, 130, generator=g).bfloat16()
    exact = q.double() @ k.double()
    mode = torch.backends.mkldnn.matmul.fp32_precision
    got = torch.ops.regionkv.exact_matmul(q, k)
    assert got.dtype == torch.float32 and got.shape == (2, 3, 96, 130)
    assert torch.backends.mkldnn.matmul.fp32_precision == mode
    float32_error = ((q.float() @ k.float()).double() - exact).abs().max()
    assert (got.double() - exact).abs().max() <= 2 * float32_error
    assert ((q @ k).double() - exact).abs().max() > 100 * float32_error
    graphs = []
    f = torch.compile(lambda a, b: torch.ops.regionkv.exact_matmul(a, b).exp(), fullgraph=True,
                      backend=backend_recording(graphs))
    torch.testing.assert_close(f(q, k), got.exp())
    assert "regionkv.exact_matmul" in graphs[-1]


def test_loaded_float_model_is_packed_and_scores_as_unpacked(default_checkpoint):
    from engine.runtime.generation import model_fingerprint
    from quantize.dense import PackedLinear
    plain, packed = load_model(default_checkpoint, pack=False), load_model(default_checkpoint)
    assert not any(isinstance(m, PackedLinear) for m in plain.modules())
    linears = [m for m in packed.modules() if isinstance(m, PackedLinear)]
    assert len(linears) == 5 * packed.args.n_layer + 1  # the tied head gets its own copy
    assert model_fingerprint(packed) == model_fingerprint(plain)  # sessions load in either
    ids = torch.tensor([[1, 504, 3000, 27, 9108, 314, 260, 2830, 282, 7384, 30]])
    with torch.inference_mode():
        logits = [m(ids, torch.arange(ids.shape[1]), build_caches(m, 1, 64))
                  for m in (plain, packed)]
    torch.testing.assert_close(logits[1], logits[0], rtol=0, atol=1e-4)


def test_missing_onednn_kernel_keeps_the_plain_weight_in_a_float32_gemm(monkeypatch):
    """As for bfloat16 on an AVX2-only CPU, whose own bfloat16 GEMM is several times slower
    than float32's from 32 rows on: no warning, the plain weight, float32 products for a
    prompt chunk's rows."""
    import warnings

    from quantize.dense import WIDEN_ROWS, PackedLinear, pack_dense_linears
    without_onednn(monkeypatch)
    m = tiny_model().to(torch.bfloat16)
    x = torch.randn(40, 64, dtype=torch.bfloat16)
    lin = m.layers[0].feed_forward.w1
    want = F.linear(x.float(), lin.weight.float()).to(torch.bfloat16)
    from bench import weight_bytes_per_token
    read = weight_bytes_per_token(m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pack_dense_linears(m)
    assert weight_bytes_per_token(m) == read  # bench counts the plain weights it reads
    lin = m.layers[0].feed_forward.w1
    assert isinstance(lin, PackedLinear) and not lin.onednn and "kernel=float32" in repr(lin)
    with torch.inference_mode():
        assert torch.equal(lin(x), want)
        # a few rows (eager decode): ATen's bfloat16 GEMM on the weight itself, as nn.Linear
        few = x[:WIDEN_ROWS - 1]
        assert torch.equal(lin(few), F.linear(few, lin.plain))

def test_a_build_lock_left_by_a_killed_build_is_cleared(tmp_path, monkeypatch):
    """A process killed while building the kernels leaves torch's `lock` file; every later
    build would wait on it forever. One older than any build goes, with a warning; a fresh
    one (a build under way in another process) stays."""
    import os
    import time

    from core import kernels
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    build = tmp_path / "regionkv_decode"
    build.mkdir()
    lock = build / "lock"
    lock.touch()
    kernels.clear_stale_lock("regionkv_decode")
    assert lock.exists()
    old = time.time() - 2 * kernels.STALE_LOCK_S
    os.utime(lock, (old, old))
    with pytest.warns(UserWarning, match="stale build lock"):
        kernels.clear_stale_lock("regionkv_decode")
    assert not lock.exists()
