"""The second embedded model, Qwen2.5-Coder-0.5B-Instruct (a qwen2 GGUF in six pip parts):
assembled and converted on first use, then checked against transformers loading the same GGUF
(logits, greedy tokens, tokenizer, chat template); other GGUF architectures are refused."""
import numpy as np
import pytest
import torch

from caches import build_caches
from conftest import DATA, convert_in_fresh_home, run_cli
from core.errors import UserError
from engine.loading.checkpoint import load_model, read_config
from engine.loading.convert import convert
from engine.loading.default_model import EMBEDDED, embedded_gguf, resolve_checkpoint
from engine.loading.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

NAME = "qwen2.5-coder-0.5b"
TEXT = (DATA / "kjv_genesis_1_2.txt").read_text()
N_LOGITS, N_PROMPT, N_GREEDY = 300, 32, 32


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The model converted in a fresh REGIONKV_HOME: (home, checkpoint, what it printed)."""
    return convert_in_fresh_home(tmp_path_factory, NAME)


def assembled(converted):
    home, _, _ = converted
    return home / "gguf" / EMBEDDED[NAME].gguf_name()


@pytest.fixture(scope="module")
def reference_tokenizer(converted):
    g = assembled(converted)
    return transformers.AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name)


@pytest.fixture(scope="module")
def reference(converted, reference_tokenizer):
    """transformers' own GGUF loader (float32) on the assembled file."""
    g, tok = assembled(converted), reference_tokenizer
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(g.parent), gguf_file=g.name, dtype=torch.float32).eval()
    ids = torch.tensor([tok.encode(TEXT)[:N_LOGITS]])
    assert ids.shape[1] == N_LOGITS
    with torch.no_grad():
        logits = model(ids).logits
        out = model(ids[:, :N_PROMPT], use_cache=True)
        greedy = []
        for _ in range(N_GREEDY):  # the reference's own KV cache
            nxt = out.logits[:, -1].argmax(-1)
            greedy.append(int(nxt))
            out = model(nxt.view(1, 1), past_key_values=out.past_key_values, use_cache=True)
    return dict(tok=tok, ids=ids, logits=logits, greedy=greedy)


def test_assembled_once_and_converted(converted, monkeypatch, capsys):
    home, path, message = converted
    g = home / "gguf" / EMBEDDED[NAME].gguf_name()
    assert "assembling" in message and str(path) in message
    assert gguf.GGUFReader(str(g)).fields["general.architecture"].contents() == "qwen2"
    assert [p.name for p in g.parent.iterdir()] == [g.name]  # no staging file left behind
    cfg = read_config(path)
    assert cfg["model"] == dict(cfg["model"], n_layer=24, dim=896, n_head=14, n_kv_heads=2,
                                head_dim=64, intermediate_size=4864, vocab_size=151936,
                                rope_base=1000000.0, tie_embeddings=False, attention_bias=True)
    assert cfg["source"].startswith("gguf:")

    # Reused afterwards, by name and from the CLI's --checkpoint_path
    def no_conversion(*a, **k):
        raise AssertionError("converted again")
    monkeypatch.setattr("engine.loading.convert.convert", no_conversion)
    monkeypatch.setenv("REGIONKV_HOME", str(home))
    assert resolve_checkpoint(NAME) == path and embedded_gguf(NAME) == g
    assert capsys.readouterr().err == ""


# slow (minutes on a 2-core CPU, most of them transformers dequantizing the file): CI checks
# the qwen2 layout on a tiny model against transformers (tests/test_convert.py)
@pytest.mark.slow
def test_logits_and_greedy_tokens_match_transformers(converted, reference):
    _, path, _ = converted
    ids = reference["ids"]
    model = load_model(path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(ids, torch.arange(ids.shape[1]), build_caches(model, 1, 512))
        caches = build_caches(model, 1, 512)
        last = model(ids[:, :N_PROMPT], torch.arange(N_PROMPT), caches)[:, -1]
        greedy = []
        for pos in range(N_PROMPT, N_PROMPT + N_GREEDY):
            nxt = last.argmax(-1)
            greedy.append(int(nxt))
            last = model(nxt.view(1, 1), torch.tensor([pos]), caches)[:, -1]
    # The RoPE row layout is the silent failure: a wrong one still runs, far off these bounds.
    assert (logits - reference["logits"]).abs().max().item() < 1e-4
    assert greedy == reference["greedy"]


def test_tokenizer_and_chat_template_match_transformers(converted, reference_tokenizer):
    _, path, _ = converted
    ours, ref = load_tokenizer(path), reference_tokenizer
    assert ours.encode(TEXT) == ref.encode(TEXT)
    assert ours.decode(ours.encode(TEXT)) == TEXT
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3+3?"}]
    text = ours.apply_chat_template(messages, add_generation_prompt=True)
    assert text == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.encode_chat(messages) == ref.encode(text, add_special_tokens=False)


def test_generate_runs_it_by_name(converted):
    home, _, _ = converted
    r = run_cli("generate.py", "--checkpoint_path", NAME, "--prompt", "def add(a, b):",
                "--max_new_tokens", "8", "--temperature", "0", "--cache", "weightedkv",
                "--cache_size", "64", env={"REGIONKV_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert "Qwen2.5-Coder-0.5B-Instruct" in r.stderr and "8 tokens" in r.stderr


@pytest.mark.parametrize("arch, tensor", [("qwen3", "blk.0.attn_q_norm.weight"),
                                          ("gemma3", "blk.0.attn_q_norm.weight")])
def test_other_gguf_architectures_are_named_and_refused(arch, tensor, tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / f"{arch}.gguf"), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.add_tensor(tensor, np.ones(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UserError, match=f"unsupported GGUF architecture '{arch}'; supported: "
                                        f"llama, qwen2"):
        convert(tmp_path / f"{arch}.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    r = run_cli("convert_hf.py", tmp_path / f"{arch}.gguf", "--out", tmp_path / "out")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and arch in r.stderr, r.stderr
