"""Tokenizers: SentencePiece, Llama-3 tiktoken and byte-level BPE, behind one small interface.

Three kinds, each rebuilt from a file kept in the checkpoint directory:

- ``sentencepiece`` (Llama-2, Mistral): ``tokenizer.model`` run by ``sentencepiece``. Special tokens
  written in the text (``<s>``, ``</s>``, added tokens) are split out first and each piece of plain
  text in between is encoded on its own, with SentencePiece's dummy prefix, as Meta's and Mistral's
  reference code do (``<s>[INST] hi`` -> ``<s>``, ``▁[INST]``, ``▁hi``).
- ``tiktoken`` (Llama-3 ``tokenizer.model``: lines ``base64(token bytes) rank``): a
  ``tiktoken.Encoding`` with the Llama-3 split regex; special tokens sit after the ranks.
- ``bpe`` (GPT-2 style byte-level BPE from a Hugging Face ``tokenizer.json``, or written from a GGUF
  ``gpt2`` vocabulary): rebuilt as a ``tiktoken.Encoding`` whose token bytes come from inverting
  GPT-2's bytes-to-unicode table and whose rank is the token id (true for these vocabularies, whose
  ids follow merge order; the tests check ids against the reference tokenizer). The
  pre-tokenizer (Split regex, ByteLevel regex, Digits) becomes one equivalent regex.

The ``"tokenizer"`` section of the engine's ``config.json``::

    {"kind": "sentencepiece" | "tiktoken" | "bpe",
     "file": "tokenizer.model" | "tokenizer.json",   # inside the checkpoint directory
     "bos_id": int | null, "eos_ids": [int, ...],    # generation stops on any eos id
     "add_bos": bool,                                # encode() prepends bos_id by default
     "bos_token": str | null, "eos_token": str | null,   # strings given to chat templates
     "chat_template": str | null,                    # Jinja, Hugging Face conventions
     "special_tokens": {str: int},                   # recognised as single tokens in text
     "pattern": str,                                 # tiktoken/bpe only: the split regex
     "normalizer": null | "NFC"}                     # tiktoken/bpe: Unicode normalization first

GGUF vocabularies: ``gpt2`` ones are written out as a Hugging Face-compatible ``tokenizer.json``
(``tokenizer.ggml.pre`` picks the pre-tokenizer); ``llama`` ones as a SentencePiece
``tokenizer.model`` serialized here (BPE, identity normalization: what llama.cpp assumes).

decode() writes special tokens as their text and skips ids the vocabulary lacks (a padded
embedding); bytes of a character split across tokens are joined before UTF-8 decoding.
Rendered chat text already holds its BOS when the template writes ``bos_token``: encode it with
``bos=False`` (``encode_chat`` does), as Hugging Face's ``apply_chat_template(tokenize=True)`` does.
"""
from __future__ import annotations

import base64
import json
import re
import shutil
import struct
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import sentencepiece
import tiktoken

from core.errors import UserError

CONFIG_NAME = "config.json"

# Hugging Face tokenizers' ByteLevel(use_regex=True) split, as in GPT-2.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
                  r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
                 r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


def _gpt2_pattern_after_digits(individual: bool) -> str:
    """GPT2_PATTERN applied after a Digits pre-tokenizer, as one regex.

    Digits cuts the text before and after every digit (or digit run), so the ByteLevel regex never
    sees a digit together with the space before it, and a whitespace run that ends at a digit ends
    its piece: `\\s+(?!\\S)` then takes the whole run. The third-to-last alternative says the same.
    """
    digits = r"\p{N}" if individual else r"\p{N}+"
    return (r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|""" + digits +
            r"""| ?[^\s\p{L}\p{N}]+|\s+(?=\p{N})|\s+(?!\S)|\s+""")


# ---------------------------------------------------------------------------------------------
# Tokenizer classes
# ---------------------------------------------------------------------------------------------

class Tokenizer:
    """Text <-> token ids for one checkpoint. Subclasses implement `encode` and `decode`."""

    kind: str = ""

    def __init__(self, section: dict):
        self.bos_id: int | None = section.get("bos_id")
        self.eos_ids: list[int] = [int(i) for i in section.get("eos_ids") or []]
        self.add_bos: bool = bool(section.get("add_bos")) and self.bos_id is not None
        self.bos_token: str | None = section.get("bos_token")
        self.eos_token: str | None = section.get("eos_token")
        self.chat_template: str | None = section.get("chat_template") or None
        self.special_tokens: dict[str, int] = {str(k): int(v) for k, v in
                                               (section.get("special_tokens") or {}).items()}
        self.vocab_size: int = 0
        self._template = None

    def encode(self, text: str, bos: bool | None = None) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError

    def _with_bos(self, ids: list[int], bos: bool | None) -> list[int]:
        if (self.add_bos if bos is None else bos) and self.bos_id is not None:
            return [self.bos_id] + ids
        return ids

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **kwargs) -> str:
        """Render `messages` with the checkpoint's chat template (Hugging Face's conventions)."""
        import jinja2

        if not self.chat_template:
            raise UserError("this checkpoint's tokenizer has no chat template; "
                            "prompt it with plain text instead")
        if self._template is None:
            try:
                self._template = _jinja_env().from_string(self.chat_template)
            except jinja2.TemplateError as e:
                raise UserError(f"invalid chat template: {_one_line(e)}") from None
        context = {"bos_token": self.bos_token or "", "eos_token": self.eos_token or "", **kwargs}
        try:
            return self._template.render(
                context, messages=messages, add_generation_prompt=add_generation_prompt)
        except jinja2.TemplateError as e:
            raise UserError(f"chat template: {_one_line(e)}") from None

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Rendered chat template -> ids (no BOS added: templates write their own)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt), bos=False)

    def __repr__(self):
        return (f"{type(self).__name__}(vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
                f"eos_ids={self.eos_ids}, add_bos={self.add_bos})")


def _one_line(error) -> str:
    return " ".join(str(error).split())


def _raise_exception(message):
    import jinja2
    raise jinja2.TemplateError(message)


def _strftime_now(fmt):
    from datetime import datetime
    return datetime.now().strftime(fmt)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _jinja_env():
    """A sandbox configured like transformers' chat-template environment."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class StreamingDetokenizer:
    """Text as tokens arrive, in time linear in the number of tokens: each step decodes only the
    last few tokens (from `prefix`, a few tokens back, so that a leading space or a merge across
    the boundary decodes as it would in the whole text) and emits what they add. Text that ends
    in an incomplete UTF-8 sequence waits for the next token.

        detok = StreamingDetokenizer(tokenizer)
        for t in ids: print(detok.add(t), end="")
    """

    def __init__(self, tokenizer: "Tokenizer"):
        self.tokenizer = tokenizer
        self.ids: list = []
        self.prefix = 0  # decoding starts here
        self.read = 0    # ids before this have been emitted

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        done = self.tokenizer.decode(self.ids[self.prefix:self.read])
        text = self.tokenizer.decode(self.ids[self.prefix:])
        if len(text) <= len(done) or text.endswith("\ufffd"):
            return ""
        # Keep a few emitted tokens as context for the next decode, drop the rest.
        self.prefix, self.read = max(self.read, len(self.ids) - 4), len(self.ids)
        return text[len(done):]


class StopText:
    """The text of a generation as tokens arrive, cut at the first of some stop strings: `add`
    returns the text that is safe to show (a tail that could begin a stop string waits), and
    sets `stopped` once a stop string appears (it and everything after it are never shown).
    Tokens in `skip_ids` (end-of-turn tokens) add no text."""

    def __init__(self, tokenizer: "Tokenizer", stop=(), skip_ids=()):
        self.detok = StreamingDetokenizer(tokenizer)
        self.stop, self.skip = [s for s in stop if s], set(skip_ids)
        self.held = ""
        self.stopped = False

    def add(self, token_id: int) -> str:
        if self.stopped or token_id in self.skip:
            return ""
        self.held += self.detok.add(token_id)
        cuts = [i for i in (self.held.find(s) for s in self.stop) if i >= 0]
        if cuts:
            self.stopped = True
            out, self.held = self.held[:min(cuts)], ""
            return out
        keep = max((n for s in self.stop for n in range(len(s) - 1, 0, -1)
                    if self.held.endswith(s[:n])), default=0)
        out, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
        return out

    def flush(self) -> str:
        """The held-back tail, at the end of a generation that did not stop on a string."""
        out, self.held = ("" if self.stopped else self.held), ""
        return out


class SentencePieceTokenizer(Tokenizer):
    kind = "sentencepiece"

    def __init__(self, path: Path, section: dict):
        super().__init__(section)
        self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        self._n_pieces = self._sp.get_piece_size()
        self._special_by_id = {i: s for s, i in self.special_tokens.items()}
        self._split = _special_splitter(self.special_tokens)
        self.vocab_size = max([self._n_pieces] + [i + 1 for i in self._special_by_id])

    def encode(self, text: str, bos: bool | None = None) -> list[int]:
        ids: list[int] = []
        if self._split is None:
            ids = self._sp.encode(text) if text else []
        else:
            for k, part in enumerate(self._split.split(text)):
                if k % 2:  # odd parts are the captured special tokens
                    ids.append(self.special_tokens[part])
                elif part:
                    ids.extend(self._sp.encode(part))
        return self._with_bos(ids, bos)

    def decode(self, ids: list[int]) -> str:
        out: list[str] = []
        run: list[int] = []
        for i in ids:
            i = int(i)
            special = self._special_by_id.get(i)
            if special is None and 0 <= i < self._n_pieces:
                run.append(i)
                continue
            if run:
                out.append(self._sp.decode(run))
                run = []
            if special is not None:
                out.append(special)
            # ids outside the vocabulary (a padded embedding) decode to nothing
        if run:
            out.append(self._sp.decode(run))
        return "".join(out)


class TiktokenTokenizer(Tokenizer):
    """tiktoken kind (Llama-3 tokenizer.model) and, through subclass BPETokenizer, bpe kind."""

    kind = "tiktoken"

    def __init__(self, ranks: dict[bytes, int], section: dict, name: str):
        super().__init__(section)
        pattern = section.get("pattern")
        if not pattern:
            raise UserError(f"tokenizer section in {CONFIG_NAME} has no split pattern; "
                            f"re-run convert_hf.py")
        specials = self.special_tokens
        special_ids = set(specials.values())
        ranks = {b: r for b, r in ranks.items() if r not in special_ids}
        self.normalizer = section.get("normalizer")
        try:
            self._enc = tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks,
                                          special_tokens=specials)
        except Exception as e:  # invalid regex, duplicate ids ...
            raise UserError(f"cannot build the {self.kind} tokenizer: {_one_line(e)}") from None
        self.vocab_size = self._enc.max_token_value + 1
        self._ranks = ranks
        self._valid: set[int] | None = None
        # Some vocabularies lack a few single bytes (SmolLM2: 21, e.g. 0x04 and 0xF1). Hugging Face
        # drops such bytes from the word before merging; tiktoken would panic on them.
        missing = sorted(set(range(256)) - {b[0] for b in ranks if len(b) == 1})
        self._missing = (re.compile(b"[" + b"".join(re.escape(bytes([b])) for b in missing) + b"]")
                         if missing else None)
        self._pattern, self._compiled = pattern, None
        self._split = _special_splitter(specials)

    def encode(self, text: str, bos: bool | None = None) -> list[int]:
        if self.normalizer == "NFC":
            text = unicodedata.normalize("NFC", text)
        if self._missing is not None and self._missing.search(text.encode("utf-8", "replace")):
            ids = self._encode_dropping_missing_bytes(text)
        else:
            ids = self._enc.encode(text, allowed_special="all", disallowed_special=())
        return self._with_bos(ids, bos)

    def _encode_dropping_missing_bytes(self, text: str) -> list[int]:
        """The slow path of encode(): the same split, done here, then BPE of each piece less the
        bytes the vocabulary lacks."""
        if self._compiled is None:
            import regex  # a tiktoken dependency; tiktoken uses it for the same purpose
            self._compiled = regex.compile(self._pattern)
        parts = self._split.split(text) if self._split is not None else [text]
        ids: list[int] = []
        for k, part in enumerate(parts):
            if k % 2:  # odd parts are the captured special tokens
                ids.append(self.special_tokens[part])
                continue
            for piece in self._compiled.findall(part):
                data = self._missing.sub(b"", piece.encode("utf-8", "replace"))
                if data:
                    ids.extend(self._enc._encode_single_piece(data))
        return ids

    def decode(self, ids: list[int]) -> str:
        ids = [int(i) for i in ids]
        try:
            data = self._enc.decode_bytes(ids)
        except (KeyError, ValueError, OverflowError):  # ids the vocabulary lacks decode to nothing
            if self._valid is None:
                self._valid = set(self._ranks.values()) | set(self.special_tokens.values())
            data = self._enc.decode_bytes([i for i in ids if i in self._valid])
        return data.decode("utf-8", errors="replace")


class BPETokenizer(TiktokenTokenizer):
    kind = "bpe"


def _special_splitter(specials: dict[str, int]):
    if not specials:
        return None
    alternatives = sorted(specials, key=len, reverse=True)  # longest first: "<|a|>b" before "<|a|>"
    return re.compile("(" + "|".join(re.escape(s) for s in alternatives) + ")")


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

def load_tokenizer(checkpoint_dir) -> Tokenizer:
    """The tokenizer of an engine checkpoint directory (config.json's "tokenizer" section)."""
    from engine.loading.checkpoint import read_config

    path = Path(checkpoint_dir)
    cfg_path = path / CONFIG_NAME
    cfg = read_config(path)
    section = cfg.get("tokenizer") if isinstance(cfg, dict) else None
    if not isinstance(section, dict):
        raise UserError(f"{cfg_path} has no tokenizer section; re-run convert_hf.py")
    kind, name = section.get("kind"), section.get("file")
    if kind not in ("sentencepiece", "tiktoken", "bpe") or not name:
        raise UserError(f"{cfg_path}: tokenizer section needs kind (sentencepiece, tiktoken or "
                        f"bpe) and file; got kind={kind!r} file={name!r}")
    file = path / name
    if not file.is_file():
        raise UserError(f"tokenizer file {str(file)!r} is missing; re-run convert_hf.py")
    if kind == "sentencepiece":
        try:
            return SentencePieceTokenizer(file, section)
        except (RuntimeError, OSError) as e:
            raise UserError(f"cannot load SentencePiece model {file}: {_one_line(e)}") from None
    if kind == "tiktoken":
        return TiktokenTokenizer(_read_tiktoken_ranks(file), section, name=f"tiktoken:{path.name}")
    vocab = _read_json(file, required=True).get("model", {}).get("vocab")
    if not isinstance(vocab, dict):
        raise UserError(f"{file}: no model.vocab; not a byte-level BPE tokenizer.json")
    return BPETokenizer(_byte_level_ranks(vocab), section, name=f"bpe:{path.name}")


def _read_json(path: Path, required=False) -> dict | None:
    if not path.is_file():
        if required:
            raise UserError(f"{path} is missing")
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read {path}: {_one_line(e)}") from None


def _read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    ranks = {}
    try:
        for n, line in enumerate(path.read_bytes().splitlines(), 1):
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
    except (ValueError, OSError) as e:
        raise UserError(f"{path}: not a tiktoken vocabulary (line {n}: {e})") from None
    return ranks


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (byte-level BPE vocabularies)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_UNICODE_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}


def _byte_level_ranks(vocab: dict[str, int]) -> dict[bytes, int]:
    """Token string -> bytes via the inverted GPT-2 table; rank = id. Tokens holding characters
    outside the table (added tokens such as "<|im_start|>" are inside it) are left out."""
    ranks = {}
    for token, i in vocab.items():
        try:
            ranks[bytes(_UNICODE_TO_BYTE[c] for c in token)] = int(i)
        except KeyError:
            continue
    return ranks


# ---------------------------------------------------------------------------------------------
# Pre-tokenizer (tokenizer.json) -> one split regex
# ---------------------------------------------------------------------------------------------

def _flatten_pre_tokenizer(node) -> list[dict]:
    if node is None:
        return []
    if node.get("type") == "Sequence":
        return [leaf for child in node.get("pretokenizers", []) for leaf in
                _flatten_pre_tokenizer(child)]
    return [node]


def pattern_from_pre_tokenizer(pre: dict | None) -> str:
    """One regex equivalent to a byte-level BPE pre-tokenizer of tokenizer.json.

    Supported: ByteLevel(use_regex) alone or after Digits (GPT-2, StarCoder, SmolLM), and one
    Split(Regex, Isolated) followed by ByteLevel(use_regex=false) (Llama-3, Qwen2)."""
    nodes = _flatten_pre_tokenizer(pre)
    types = [n.get("type") for n in nodes]
    desc = "+".join(types) or "none"
    if not nodes or types[-1] != "ByteLevel":
        raise UserError(f"unsupported pre_tokenizer {desc}: byte-level BPE needs a final ByteLevel")
    bytelevel = nodes[-1]
    if bytelevel.get("add_prefix_space"):
        raise UserError("unsupported pre_tokenizer: ByteLevel with add_prefix_space=true")
    use_regex = bytelevel.get("use_regex", True)
    if types == ["ByteLevel"] and use_regex:
        return GPT2_PATTERN
    if types == ["Digits", "ByteLevel"] and use_regex:
        return _gpt2_pattern_after_digits(bool(nodes[0].get("individual_digits")))
    if types == ["Split", "ByteLevel"] and not use_regex:
        split = nodes[0]
        regex = (split.get("pattern") or {}).get("Regex")
        if regex and split.get("behavior") == "Isolated" and not split.get("invert"):
            return regex
        raise UserError(f"unsupported pre_tokenizer Split {json.dumps(split)[:120]}: need an "
                        f"isolated, non-inverted Regex")
    raise UserError(f"unsupported pre_tokenizer {desc} (use_regex={use_regex})")


def _normalizer_name(norm) -> str | None:
    if norm is None or (norm.get("type") == "Sequence" and not norm.get("normalizers")):
        return None
    if norm.get("type") == "NFC":
        return "NFC"
    raise UserError(f"unsupported tokenizer.json normalizer {norm.get('type')!r} for a "
                    f"byte-level BPE")


def _bpe_section(tj: dict, where) -> dict:
    """Checks on a byte-level BPE tokenizer.json; returns pattern, normalizer, special tokens."""
    model = tj.get("model") or {}
    if model.get("type") != "BPE":
        raise UserError(f"{where}: unsupported tokenizer model type {model.get('type')!r}; "
                        f"only byte-level BPE tokenizer.json files are supported")
    if model.get("byte_fallback"):
        raise UserError(f"{where}: SentencePiece-style BPE (byte_fallback) is supported only "
                        f"through tokenizer.model")
    if not isinstance(model.get("vocab"), dict):
        raise UserError(f"{where}: tokenizer.json has no model.vocab")
    try:
        pattern = pattern_from_pre_tokenizer(tj.get("pre_tokenizer"))
        normalizer = _normalizer_name(tj.get("normalizer"))
    except UserError as e:
        raise UserError(f"{where}: {_one_line(e)}") from None
    specials = {t["content"]: int(t["id"]) for t in tj.get("added_tokens") or []}
    return {"pattern": pattern, "normalizer": normalizer, "special_tokens": specials}


def _bos_from_post_processor(post) -> str | None:
    """The special token a TemplateProcessing post-processor puts before a single sequence."""
    if not post:
        return None
    if post.get("type") == "Sequence":
        for p in post.get("processors", []):
            found = _bos_from_post_processor(p)
            if found:
                return found
        return None
    if post.get("type") == "TemplateProcessing":
        single = post.get("single") or []
        if single and "SpecialToken" in single[0]:
            return single[0]["SpecialToken"]["id"]
    return None


# ---------------------------------------------------------------------------------------------
# Hugging Face directories
# ---------------------------------------------------------------------------------------------

# Meta's list for Llama 3.x (ids 128000..128255 after the 128000 ranks); the ids that matter
# (begin/end of text, headers, eom, eot) are the same in every 3.x release.
LLAMA3_SPECIAL_TOKENS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
    "<|image|>",
] + [f"<|reserved_special_token_{i}|>" for i in range(2, 246)]


def _token_text(v) -> str | None:
    """tokenizer_config.json writes a token as a string or as an AddedToken dict."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def _int_list(v) -> list[int]:
    if v is None:
        return []
    return [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)]


def _hf_chat_template(src: Path, tok_cfg: dict) -> str | None:
    jinja = src / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    from_json = _read_json(src / "chat_template.json")
    template = (from_json or {}).get("chat_template", tok_cfg.get("chat_template"))
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) and template else None


def _is_tiktoken_file(path: Path) -> bool:
    with open(path, "rb") as f:
        first = f.readline(1024).strip()
    return re.fullmatch(rb"[A-Za-z0-9+/]+=* \d+", first) is not None


def _copy(src: Path, dst: Path):
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.resolve() != dst.resolve():
        shutil.copyfile(src, dst)


def _unique(ids) -> list[int]:
    out: list[int] = []
    for i in ids:
        if i is not None and int(i) not in out:
            out.append(int(i))
    return out


@dataclass
class _HFVocab:
    """What prepare_hf_tokenizer needs to know of one tokenizer file."""
    kind: str
    file: str
    section: dict                      # kind-specific keys: special_tokens, pattern, normalizer
    lookup: Callable[[str], int | None]  # token text -> id
    name: Callable[[int], str | None]    # id -> token text
    default_bos: str | None            # used when no config names a BOS
    default_eos: list[str]             # used when no config names an EOS
    default_add_bos: bool              # used when tokenizer_config has no add_bos_token


def _hf_tiktoken(path: Path, added: dict[str, int]) -> _HFVocab:
    n_ranks = len(_read_tiktoken_ranks(path))
    specials = {s: i for s, i in added.items() if i >= n_ranks} or \
        {s: n_ranks + k for k, s in enumerate(LLAMA3_SPECIAL_TOKENS)}
    by_id = {i: s for s, i in specials.items()}
    return _HFVocab("tiktoken", path.name,
                    {"pattern": LLAMA3_PATTERN, "normalizer": None, "special_tokens": specials},
                    specials.get, by_id.get, "<|begin_of_text|>",
                    ["<|end_of_text|>", "<|eot_id|>"], True)


def _hf_sentencepiece(path: Path, added: dict[str, int]) -> _HFVocab:
    try:
        sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
    except (RuntimeError, OSError) as e:
        raise UserError(f"{path}: not a SentencePiece or tiktoken model ({_one_line(e)})") from None
    n = sp.get_piece_size()
    specials = {sp.id_to_piece(i): i for i in range(n) if sp.is_control(i)}
    specials.update(added)
    by_id = {i: s for s, i in specials.items()}

    def lookup(text):
        if text in specials:
            return specials[text]
        i = sp.piece_to_id(text)  # the unknown piece's id when text is not a piece
        return i if sp.id_to_piece(i) == text else None

    def name(i):
        return by_id.get(i) or (sp.id_to_piece(i) if 0 <= i < n else None)

    return _HFVocab("sentencepiece", path.name, {"special_tokens": specials}, lookup, name,
                    name(sp.bos_id()) if sp.bos_id() >= 0 else None,
                    [name(sp.eos_id())] if sp.eos_id() >= 0 else [], True)


def _hf_bpe(path: Path, tj: dict, added: dict[str, int]) -> _HFVocab:
    section = _bpe_section(tj, path)
    section["special_tokens"].update(added)
    vocab = {**tj["model"]["vocab"], **section["special_tokens"]}
    by_id = {i: s for s, i in vocab.items()}
    prefix = _bos_from_post_processor(tj.get("post_processor"))
    return _HFVocab("bpe", path.name, section, vocab.get, by_id.get, prefix, [],
                    prefix is not None)


def prepare_hf_tokenizer(src_dir, out_dir, hf_config: dict) -> dict:
    """Copy the tokenizer file of a Hugging Face directory into out_dir; return the section.

    tokenizer.model (SentencePiece or Llama-3 tiktoken) wins over tokenizer.json.
    bos: tokenizer_config's bos_token, else generation_config/config bos_token_id.
    eos_ids: generation_config's eos_token_id (else config's), then tokenizer_config's eos_token."""
    src, out = Path(src_dir), Path(out_dir)
    hf_config = hf_config or {}
    tok_cfg = _read_json(src / "tokenizer_config.json") or {}
    gen_cfg = _read_json(src / "generation_config.json") or {}
    tj_path, model_path = src / "tokenizer.json", src / "tokenizer.model"
    tj = _read_json(tj_path)

    added: dict[str, int] = {}  # every added token is matched as a whole in text, as in HF
    for t in (tj or {}).get("added_tokens") or []:
        added[t["content"]] = int(t["id"])
    for i, t in (tok_cfg.get("added_tokens_decoder") or {}).items():
        if _token_text(t) is not None:
            added[_token_text(t)] = int(i)

    if model_path.is_file() and _is_tiktoken_file(model_path):
        vocab = _hf_tiktoken(model_path, added)
    elif model_path.is_file():
        vocab = _hf_sentencepiece(model_path, added)
    elif tj is not None:
        vocab = _hf_bpe(tj_path, tj, added)
    else:
        raise UserError(f"{src}: no tokenizer.model or tokenizer.json found")

    bos_text = _token_text(tok_cfg.get("bos_token"))
    eos_text = _token_text(tok_cfg.get("eos_token"))
    bos_id = vocab.lookup(bos_text) if bos_text else None
    if bos_id is None:
        configured = _int_list(gen_cfg.get("bos_token_id", hf_config.get("bos_token_id")))
        bos_id = configured[0] if configured else None
    if bos_id is None and vocab.default_bos:
        bos_id = vocab.lookup(vocab.default_bos)
    eos_ids = _int_list(gen_cfg.get("eos_token_id")) or _int_list(hf_config.get("eos_token_id"))
    eos_ids = _unique(eos_ids + [vocab.lookup(eos_text) if eos_text else None])
    if not eos_ids:
        eos_ids = _unique(vocab.lookup(s) for s in vocab.default_eos)
    add_bos = tok_cfg.get("add_bos_token")
    add_bos = vocab.default_add_bos if add_bos is None else bool(add_bos)

    _copy(src / vocab.file, out / vocab.file)
    return _ordered(dict(
        vocab.section, kind=vocab.kind, file=vocab.file, bos_id=bos_id, eos_ids=eos_ids,
        add_bos=bool(add_bos and bos_id is not None),
        bos_token=bos_text or (vocab.name(bos_id) if bos_id is not None else None),
        eos_token=eos_text or (vocab.name(eos_ids[0]) if eos_ids else None),
        chat_template=_hf_chat_template(src, tok_cfg)))


def _ordered(section: dict) -> dict:
    keys = ["kind", "file", "bos_id", "eos_ids", "add_bos", "bos_token", "eos_token",
            "chat_template", "pattern", "normalizer", "special_tokens"]
    return {k: section[k] for k in keys if k in section}


# ---------------------------------------------------------------------------------------------
# GGUF metadata
# ---------------------------------------------------------------------------------------------

def _byte_level(use_regex: bool) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
            "use_regex": use_regex}


def _split_then_byte_level(regex: str) -> dict:
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        _byte_level(False)]}


def _digits_then_byte_level() -> dict:
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, _byte_level(True)]}


# tokenizer.ggml.pre (llama.cpp's names) -> Hugging Face pre-tokenizer. "default" (llama.cpp's
# fallback for unnamed vocabularies) is taken as plain GPT-2.
_GPT2_PRES = ("default", "gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais")
_DIGITS_PRES = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b")
_LLAMA3_PRES = ("llama3", "llama-v3", "llama-bpe", "falcon3")
_QWEN2_PRES = ("qwen2", "deepseek-r1-qwen", "megrez")


def _gguf_pre_tokenizer(pre: str) -> tuple[dict, dict | None, bool]:
    """-> (pre_tokenizer, normalizer, ignore_merges) in tokenizer.json form."""
    if pre in _GPT2_PRES:
        return _byte_level(True), None, False
    if pre in _DIGITS_PRES:
        return _digits_then_byte_level(), None, False
    if pre in _LLAMA3_PRES:
        return _split_then_byte_level(LLAMA3_PATTERN), None, True
    if pre in _QWEN2_PRES:
        return _split_then_byte_level(QWEN2_PATTERN), {"type": "NFC"}, False
    known = ", ".join(_GPT2_PRES + _DIGITS_PRES + _LLAMA3_PRES + _QWEN2_PRES)
    raise UserError(f"unsupported GGUF pre-tokenizer tokenizer.ggml.pre={pre!r} "
                    f"(supported: {known})")


# GGUF token types (the same numbers as SentencePiece's piece types).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def prepare_gguf_tokenizer(fields: dict, out_dir) -> dict:
    """Write the tokenizer file of a GGUF vocabulary into out_dir; return the section.

    gpt2 vocabularies become a Hugging Face-compatible tokenizer.json (kind bpe); llama
    (SentencePiece) vocabularies become a SentencePiece tokenizer.model."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = fields.get("tokenizer.ggml.model")
    tokens = _field_list(fields, "tokenizer.ggml.tokens")
    if model is None or not tokens:
        raise UserError("GGUF file has no tokenizer (tokenizer.ggml.model / tokens missing)")
    tokens = [str(t) for t in tokens]
    types = [int(t) for t in _field_list(fields, "tokenizer.ggml.token_type") or
             [NORMAL] * len(tokens)]
    if len(types) != len(tokens):
        raise UserError("GGUF tokenizer: token_type and tokens differ in length")

    def opt_id(key):
        v = fields.get(key)
        return int(v) if v is not None and 0 <= int(v) < len(tokens) else None

    bos_id = opt_id("tokenizer.ggml.bos_token_id")
    eos_id = opt_id("tokenizer.ggml.eos_token_id")
    eos_ids = _unique([eos_id, opt_id("tokenizer.ggml.eot_token_id"),
                       opt_id("tokenizer.ggml.eom_token_id")])
    add_bos = fields.get("tokenizer.ggml.add_bos_token")
    template = fields.get("tokenizer.chat_template") or None

    if model == "gpt2":
        kind, file = "bpe", "tokenizer.json"
        pre = str(fields.get("tokenizer.ggml.pre") or "default")
        pre_tokenizer, normalizer, ignore_merges = _gguf_pre_tokenizer(pre)
        merges = [str(m).split(" ") for m in _field_list(fields, "tokenizer.ggml.merges") or []]
        added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": ty == USER_DEFINED, "special": ty == CONTROL}
                 for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (CONTROL, USER_DEFINED)]
        tj = {
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
            "post_processor": {"type": "ByteLevel", "add_prefix_space": True,
                               "trim_offsets": False, "use_regex": True},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore_merges,
                      "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
        }
        section = _bpe_section(tj, "GGUF tokenizer")
        (out / file).write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
        add_bos = False if add_bos is None else bool(add_bos)
    elif model == "llama":
        kind, file = "sentencepiece", "tokenizer.model"
        scores = _field_list(fields, "tokenizer.ggml.scores") or [0.0] * len(tokens)
        if UNKNOWN not in types:
            raise UserError("GGUF SentencePiece vocabulary has no unknown token; not supported")
        proto = _sentencepiece_model_proto(
            tokens, [float(s) for s in scores], types, bos_id, eos_id,
            add_dummy_prefix=bool(fields.get("tokenizer.ggml.add_space_prefix", True)),
            remove_extra_whitespaces=bool(fields.get("tokenizer.ggml.remove_extra_whitespaces",
                                                     False)))
        (out / file).write_bytes(proto)
        try:
            sentencepiece.SentencePieceProcessor(model_proto=proto)
        except RuntimeError as e:
            raise UserError(f"GGUF SentencePiece vocabulary not supported: "
                            f"{_one_line(e)}") from None
        section = {"special_tokens": {t: i for i, (t, ty) in enumerate(zip(tokens, types))
                                      if ty == CONTROL}}
        add_bos = True if add_bos is None else bool(add_bos)
    else:
        raise UserError(f"unsupported GGUF tokenizer model {model!r} (supported: gpt2, llama)")

    section.update(kind=kind, file=file, bos_id=bos_id, eos_ids=eos_ids,
                   add_bos=bool(add_bos and bos_id is not None),
                   bos_token=tokens[bos_id] if bos_id is not None else None,
                   eos_token=tokens[eos_id] if eos_id is not None else None,
                   chat_template=str(template) if template else None)
    if kind == "bpe":
        section.setdefault("normalizer", None)
    return _ordered(section)


def _field_list(fields: dict, key: str) -> list | None:
    value = fields.get(key)
    return None if value is None else list(value)


def _pb_varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int32 fields are written as 10-byte two's complement
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _pb_int(field: int, value: int) -> bytes:
    return _pb_varint(field << 3) + _pb_varint(int(value))


def _pb_bytes(field: int, data: bytes) -> bytes:
    return _pb_varint(field << 3 | 2) + _pb_varint(len(data)) + data


def _pb_float(field: int, value: float) -> bytes:
    return _pb_varint(field << 3 | 5) + struct.pack("<f", value)


def _sentencepiece_model_proto(tokens, scores, types, bos_id, eos_id, add_dummy_prefix,
                               remove_extra_whitespaces) -> bytes:
    """Serialize a SentencePiece ModelProto (sentencepiece_model.proto field numbers) without a
    protobuf dependency: BPE model, identity normalization (what llama.cpp assumes for SPM)."""
    out = bytearray()
    for piece, score, ty in zip(tokens, scores, types):
        out += _pb_bytes(1, _pb_bytes(1, piece.encode("utf-8")) + _pb_float(2, score) +
                         _pb_int(3, ty))
    unk_id = types.index(UNKNOWN)
    trainer = (_pb_int(3, 2) +  # model_type = BPE
               _pb_int(4, len(tokens)) +  # vocab_size
               _pb_int(35, int(BYTE in types)) +  # byte_fallback
               _pb_int(40, unk_id) + _pb_int(41, -1 if bos_id is None else bos_id) +
               _pb_int(42, -1 if eos_id is None else eos_id) + _pb_int(43, -1) +  # pad_id
               _pb_bytes(45, tokens[unk_id].encode()))
    if bos_id is not None:
        trainer += _pb_bytes(46, tokens[bos_id].encode())
    if eos_id is not None:
        trainer += _pb_bytes(47, tokens[eos_id].encode())
    normalizer = (_pb_bytes(1, b"identity") + _pb_int(3, add_dummy_prefix) +
                  _pb_int(4, remove_extra_whitespaces) + _pb_int(5, 1))  # escape_whitespaces
    out += _pb_bytes(2, trainer) + _pb_bytes(3, normalizer)
    return bytes(out)
