"""Convert a Hugging Face checkpoint, a hub repo id or a llama GGUF file into an engine checkpoint.

    convert(source, out_dir, dtype=None, force=False) -> Path

Sources:
  * a local HF directory: config.json + model.safetensors (or its sharded index), or
    pytorch_model.bin (or its sharded index); model_type llama, mistral or qwen2;
  * a hub repo id "org/name" that is not a local path: snapshot_download, then as above;
  * a .gguf file whose general.architecture is "llama" or "qwen2" (GGUF_ARCHITECTURES): every
    tensor is dequantized to float.

HF q_proj/k_proj rows are already in the half-split RoPE layout model.py uses; llama.cpp stores
llama's attn_q/attn_k in Meta's interleaved layout (un-permuted here) and qwen2's in the
half-split one (taken as is).

The output directory appears whole or not at all: everything is written into a hidden sibling
directory that is renamed into place at the end and removed on any failure or Ctrl-C.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from engine.loading.checkpoint import CONFIG_NAME, FORMAT, FORMAT_VERSION, WEIGHTS_NAME
from core.errors import UserError
from core.tensors import DTYPES
from engine.loading.files import publish_dir, save_weights, staging_dir
from model import ModelArgs, Transformer, rope_frequencies

HF_MODEL_TYPES = ("llama", "mistral", "qwen2")
HF_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")

# Files fetched from the hub: config and tokenizer first, weights in one of two formats.
HUB_BASE_PATTERNS = ["config.json", "generation_config.json", "tokenizer*",
                     "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
                     "*.model", "*.tiktoken", "chat_template*"]
HUB_WEIGHT_PATTERNS = (
    ["model.safetensors", "model.safetensors.index.json", "model-*.safetensors"],
    ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin"])
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class OutputExistsError(UserError):
    """The output directory already holds something and --force was not given."""


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# Entry point


def convert(source, out_dir, dtype=None, force: bool = False,
            log: Callable[[str], None] = _log) -> Path:
    """Convert `source` into an engine checkpoint at `out_dir`; returns the output path.

    dtype: "float32" | "bfloat16" | "float16" | torch.dtype | None (HF: the source's own dtype;
    GGUF: float32, since its tensors are dequantized).
    """
    out = Path(out_dir).expanduser().absolute()
    kind, src = _resolve_source(source, log)
    src_real = Path(src).resolve()
    if out.resolve() == src_real or out.resolve() in src_real.parents:
        raise UserError(f"--out {out} would overwrite the source {src}; choose another directory")
    _check_output(out, force)
    want = _parse_dtype(dtype)

    if kind == "hub":  # snapshot folders are named by commit: record which one
        label = f"hub:{source}@{src_real.name}" if src_real.parent.name == "snapshots" \
            else f"hub:{source}"
    else:
        label = f"{kind}:{src_real}"

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with staging_dir(out) as tmp:
            if kind == "gguf":
                cfg, state = _convert_gguf(Path(src), tmp, want or torch.float32, log)
            else:
                cfg, state = _convert_hf_dir(Path(src), tmp, want, log)
            cfg["source"] = label
            _save_weights(state, tmp / WEIGHTS_NAME)
            (tmp / CONFIG_NAME).write_text(json.dumps(cfg, indent=2) + "\n")
            del state
            try:
                publish_dir(tmp, out, replace=force)
            except FileExistsError:  # someone else created it while we converted
                raise OutputExistsError(f"--out {out} already exists and is not empty; pass "
                                        f"--force to replace it") from None
    except OSError as e:  # disk full, permissions, ...: one line, not a traceback
        raise UserError(f"converting into {out} failed: {e}") from None
    log(f"wrote {out}")
    return out


def _parse_dtype(dtype) -> Optional[torch.dtype]:
    if dtype is None or isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise UserError(f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)}")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _resolve_source(source, log) -> tuple[str, str]:
    """("hf" | "gguf", local path) or ("hub", local snapshot path)."""
    text = str(source)
    path = Path(text).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise UserError(f"{text!r} is a file but not a .gguf file; pass a Hugging Face "
                            f"checkpoint directory, a hub repo id or a .gguf file")
        return "gguf", str(path)
    if path.is_dir():
        return "hf", str(path)
    if isinstance(source, Path) or not _REPO_ID.match(text) or text.lower().endswith(".gguf"):
        raise UserError(f"{text!r} does not exist; pass a Hugging Face checkpoint directory, "
                        f"a hub repo id (org/name) or a .gguf file")
    return "hub", _download(text, log)


def _download(repo_id: str, log) -> str:
    from huggingface_hub import snapshot_download

    try:
        path = None
        for weights in HUB_WEIGHT_PATTERNS:  # safetensors first; .bin only when there is none
            path = snapshot_download(repo_id, allow_patterns=HUB_BASE_PATTERNS + weights)
            if _weight_files(Path(path)) is not None:
                break
    except UserError:
        raise
    except Exception as e:  # hub/network errors come in many classes; all mean "not available"
        reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
        reason = f"{type(e).__name__}: {reason}" if reason else type(e).__name__
        if len(reason) > 200:
            reason = reason[:197] + "..."
        raise UserError(f"cannot download {repo_id} from the hub ({reason}); pass a local "
                        f"checkpoint directory instead") from None
    log(f"fetched {repo_id} into {path}")
    return path


# ----------------------------------------------------------------------------------------------
# Atomic output


def _check_output(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise OutputExistsError(f"--out {out} already exists and is not empty; pass --force "
                                f"to replace it")


_save_weights = save_weights  # tests patch it here


# ----------------------------------------------------------------------------------------------
# Shared checks


def _make_args(fields: dict, where: str) -> ModelArgs:
    try:
        return ModelArgs(**fields)
    except (TypeError, ValueError) as e:
        raise UserError(f"{where}: {e}") from None


def _check_state(state: dict, args: ModelArgs, where: str) -> None:
    """Every tensor the engine model expects, with its exact shape, and nothing else."""
    with torch.device("meta"):
        expected = {k: tuple(t.shape) for k, t in Transformer(args).state_dict().items()}
    if args.tie_embeddings:
        expected.pop("output.weight")
    for name, shape in expected.items():
        if name not in state:
            raise UserError(f"{where}: missing tensor for {name}")
        if tuple(state[name].shape) != shape:
            raise UserError(f"{where}: {name} has shape {tuple(state[name].shape)}, the config "
                            f"implies {shape}")
    extra = sorted(set(state) - set(expected))
    if extra:
        raise UserError(f"{where}: unexpected tensor {extra[0]}")


def _engine_config(args: ModelArgs, tokenizer: dict) -> dict:
    return {"format": FORMAT, "version": FORMAT_VERSION, "architecture": "llama", "model": args.to_dict(),
            "tokenizer": tokenizer, "quantization": None, "source": None}


# ----------------------------------------------------------------------------------------------
# Hugging Face directories


def _weight_files(d: Path) -> Optional[tuple[str, list[Path]]]:
    """("safetensors" | "bin", weight files) of a HF directory, or None."""
    for fmt, single, index in (("safetensors", "model.safetensors", "model.safetensors.index.json"),
                               ("bin", "pytorch_model.bin", "pytorch_model.bin.index.json")):
        if (d / index).is_file():
            try:
                weight_map = json.loads((d / index).read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise UserError(f"cannot read {d / index}: {e}") from None
            return fmt, sorted({d / f for f in weight_map.values()})
        if (d / single).is_file():
            return fmt, [d / single]
    return None


class _HFTensors:
    """Reads tensors by HF name from safetensors (lazily) or pytorch_model.bin shards."""

    def __init__(self, d: Path):
        found = _weight_files(d)
        self.dir = d
        if found is None:
            raise UserError(f"{d} has no model.safetensors, pytorch_model.bin or sharded index "
                            f"of either")
        self.fmt, files = found
        for f in files:
            if not f.is_file():
                raise UserError(f"{d}: weight shard {f.name} is missing")
        self.where = {}
        self._handles = {}
        if self.fmt == "safetensors":
            from safetensors import safe_open
            for f in files:
                try:
                    h = safe_open(str(f), framework="pt", device="cpu")
                except Exception as e:  # safetensors raises its own error types
                    raise UserError(f"cannot read {f}: {e}") from None
                self._handles[f] = h
                self.where.update({k: f for k in h.keys()})
        else:
            for f in files:
                sd = self._load_bin(f)
                if not isinstance(sd, dict):
                    raise UserError(f"{f} does not hold a state dict")
                self._handles[f] = sd
                self.where.update({k: f for k in sd})

    @staticmethod
    def _load_bin(f: Path) -> dict:
        try:
            return torch.load(str(f), weights_only=True, map_location="cpu", mmap=True)
        except RuntimeError:
            pass  # the legacy (non-zip) format cannot be memory-mapped
        try:
            return torch.load(str(f), weights_only=True, map_location="cpu")
        except Exception as e:  # pickle/zip errors of a bad file
            raise UserError(f"cannot read {f}: {e}") from None

    def names(self) -> set:
        return set(self.where)

    def get(self, name: str) -> torch.Tensor:
        f = self.where.get(name)
        if f is None:
            raise UserError(f"{self.dir}: missing tensor {name}")
        h = self._handles[f]
        return h.get_tensor(name) if self.fmt == "safetensors" else h[name]


def _hf_rope(cfg: dict, where: str) -> tuple[float, Optional[dict]]:
    """rope theta and llama3 scaling from classic (rope_theta/rope_scaling) or transformers-5
    (rope_parameters) configs."""
    params = cfg.get("rope_parameters") or {}
    if any(isinstance(v, dict) for v in params.values()):
        raise UserError(f"{where}: per-layer-type rope_parameters are not supported")
    merged = {**(cfg.get("rope_scaling") or {}), **params}
    theta = float(merged.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    partial = merged.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise UserError(f"{where}: partial_rotary_factor={partial} is not supported")
    if rope_type in (None, "default"):
        return theta, None
    if rope_type != "llama3":
        raise UserError(f"{where}: rope scaling type {rope_type!r} is not supported (only the "
                        f"Llama-3.1 'llama3' scaling is)")
    try:
        scaling = {"factor": float(merged["factor"]),
                   "low_freq_factor": float(merged["low_freq_factor"]),
                   "high_freq_factor": float(merged["high_freq_factor"]),
                   "original_max_position_embeddings":
                       int(merged["original_max_position_embeddings"])}
    except KeyError as e:
        raise UserError(f"{where}: llama3 rope scaling lacks {e.args[0]}") from None
    return theta, scaling


def hf_model_args(cfg: dict, where: str = CONFIG_NAME, log: Callable[[str], None] = _log
                  ) -> ModelArgs:
    """ModelArgs from a HF config.json dict; UserError for anything the engine cannot run."""
    model_type = cfg.get("model_type")
    archs = cfg.get("architectures") or []
    if model_type not in HF_MODEL_TYPES:
        raise UserError(f"{where}: unsupported architecture {model_type or archs!r}; supported "
                        f"model types: {', '.join(HF_MODEL_TYPES)}")
    bad = [a for a in archs if a not in HF_ARCHITECTURES]
    if bad:
        raise UserError(f"{where}: unsupported architecture {bad[0]!r}; supported: "
                        f"{', '.join(HF_ARCHITECTURES)}")
    if cfg.get("hidden_act", "silu") != "silu":
        raise UserError(f"{where}: hidden_act {cfg['hidden_act']!r} is not supported (silu only)")
    if cfg.get("mlp_bias"):
        raise UserError(f"{where}: mlp_bias=true is not supported")
    try:
        dim, n_head = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        n_layer, ffn = int(cfg["num_hidden_layers"]), int(cfg["intermediate_size"])
        vocab = int(cfg["vocab_size"])
    except KeyError as e:
        raise UserError(f"{where}: missing field {e.args[0]}") from None
    theta, scaling = _hf_rope(cfg, where)
    max_pos = int(cfg.get("max_position_embeddings") or 2048)

    # The engine has no sliding-window attention. Up to `sliding_window` tokens full attention
    # is exactly the same computation, so the model's usable context is clamped to the window.
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types") or []
    sliding = window is not None and (
        model_type == "mistral"
        or (model_type == "qwen2" and cfg.get("use_sliding_window", False))
        or "sliding_attention" in layer_types)
    if sliding and int(window) < max_pos:
        log(f"note: sliding_window={window} < max_position_embeddings={max_pos}: the engine uses "
            f"full attention, identical up to {window} tokens; max_position_embeddings set to "
            f"{window}")
        max_pos = int(window)

    return _make_args(dict(
        vocab_size=vocab, n_layer=n_layer, dim=dim, n_head=n_head,
        n_kv_heads=int(cfg.get("num_key_value_heads") or n_head),
        head_dim=int(cfg.get("head_dim") or dim // n_head),
        intermediate_size=ffn, norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_base=theta, rope_scaling=scaling,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
        max_position_embeddings=max_pos), where)


def _hf_default_dtype(cfg: dict, tensors: _HFTensors) -> torch.dtype:
    name = cfg.get("dtype") or cfg.get("torch_dtype")
    if isinstance(name, str) and name.replace("torch.", "") in DTYPES:
        return DTYPES[name.replace("torch.", "")]
    embed = tensors.get("model.embed_tokens.weight")
    return embed.dtype if embed.dtype in DTYPES.values() else torch.float32


def _convert_hf_dir(d: Path, out: Path, dtype: Optional[torch.dtype], log):
    from engine.loading.tokenizer import prepare_hf_tokenizer

    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise UserError(f"{d} has no config.json; pass a Hugging Face checkpoint directory")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {cfg_path}: {e}") from None
    if cfg.get("format") == FORMAT:
        raise UserError(f"{d} is already an engine checkpoint; use it directly")
    args = hf_model_args(cfg, str(cfg_path), log)
    tokenizer = prepare_hf_tokenizer(d, out, cfg)  # before the weights: fail fast
    tensors = _HFTensors(d)
    dtype = dtype or _hf_default_dtype(cfg, tensors)
    log(f"converting {d} ({cfg['model_type']}, {args.n_layer} layers, dim {args.dim}) "
        f"to {_dtype_name(dtype)}")

    used = set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        return tensors.get(name).to(dtype)

    state = {"tok_embeddings.weight": take("model.embed_tokens.weight"),
             "norm.weight": take("model.norm.weight")}
    if args.tie_embeddings:
        used.add("lm_head.weight")  # a saved copy of the tied matrix, if present, is redundant
    else:
        state["output.weight"] = take("lm_head.weight")
    for i in range(args.n_layer):
        p, e = f"model.layers.{i}.", f"layers.{i}."
        att = p + "self_attn."
        state[e + "attention.wqkv.weight"] = torch.cat(
            [take(att + f"{x}_proj.weight") for x in "qkv"])
        if args.attention_bias:
            state[e + "attention.wqkv.bias"] = torch.cat(
                [take(att + f"{x}_proj.bias") for x in "qkv"])
            if att + "o_proj.bias" in tensors.names():
                # Llama's attention_bias also biases o_proj; model.py's wo has none, which is
                # exact only while that bias is zero.
                if take(att + "o_proj.bias").abs().max() != 0:
                    raise UserError(f"{d}: a non-zero {att}o_proj.bias is not supported")
        state[e + "attention.wo.weight"] = take(att + "o_proj.weight")
        state[e + "feed_forward.w1.weight"] = take(p + "mlp.gate_proj.weight")
        state[e + "feed_forward.w3.weight"] = take(p + "mlp.up_proj.weight")
        state[e + "feed_forward.w2.weight"] = take(p + "mlp.down_proj.weight")
        state[e + "attention_norm.weight"] = take(p + "input_layernorm.weight")
        state[e + "ffn_norm.weight"] = take(p + "post_attention_layernorm.weight")
    # Old checkpoints carry recomputable RoPE buffers; anything else means a model we don't know.
    extra = sorted(n for n in tensors.names() - used if not n.endswith("rotary_emb.inv_freq"))
    if extra:
        raise UserError(f"{d}: unexpected tensor {extra[0]} for a plain {cfg['model_type']} model")
    _check_state(state, args, str(d))
    return _engine_config(args, tokenizer), state


# ----------------------------------------------------------------------------------------------
# GGUF


# engine name inside layers.N -> GGUF name inside blk.N (Q/K/V are fused separately)
GGUF_LAYER_NAMES = {
    "attention.wo.weight": "attn_output.weight",
    "feed_forward.w1.weight": "ffn_gate.weight",
    "feed_forward.w3.weight": "ffn_up.weight",
    "feed_forward.w2.weight": "ffn_down.weight",
    "attention_norm.weight": "attn_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
}


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Meta's interleaved RoPE rows (llama.cpp) -> the half-split layout of HF and model.py.

    Within each head, interleaved row 2i/2i+1 is the (i)th pair; half-split puts it at i and
    i + head_dim/2.
    """
    rows, cols = w.shape
    return w.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _gguf_rope_scaling(fields: dict, arch: str, freqs: Optional[torch.Tensor], head_dim: int,
                       theta: float, where: str) -> Optional[dict]:
    kind = fields.get(f"{arch}.rope.scaling.type")
    factor = fields.get(f"{arch}.rope.scaling.factor")
    if kind not in (None, "none") and not (kind == "linear" and factor in (None, 1.0)):
        raise UserError(f"{where}: rope scaling type {kind!r} is not supported")
    if freqs is None:
        return None
    # llama.cpp stores Llama-3.1 scaling as per-frequency divisors (rope_freqs); rebuild the
    # parameters (Meta's defaults: low 1, high 4, original context 8192) and check them.
    scaling = {"factor": float(freqs.max()), "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings":
                   int(fields.get(f"{arch}.rope.scaling.original_context_length") or 8192)}
    plain = rope_frequencies(head_dim, theta, None)
    implied = plain / rope_frequencies(head_dim, theta, scaling)
    if freqs.shape != implied.shape or not torch.allclose(freqs.float(), implied, rtol=1e-3):
        raise UserError(f"{where}: rope_freqs does not match Llama-3.1 rope scaling; not supported")
    return scaling


@dataclass(frozen=True)
class GGUFArchitecture:
    """How one llama.cpp architecture maps onto the engine's model (metadata keys are prefixed
    with the architecture name; tensor names are llama.cpp's, shared by all of them)."""
    # Row order of attn_q/attn_k (and their biases) as llama.cpp stores them: "interleaved" is
    # Meta's RoPE layout (llama.cpp's convert permutes HF rows into it for LLAMA rope), un-permuted
    # here; "half-split" is the NEOX layout of HF and model.py, taken as is. Getting it wrong is
    # silent (a still-running, wrong model), so each architecture states it.
    rope_rows: str
    # Whether q/k/v carry biases: "required" (qwen2 always has them) or "optional" (llama may).
    qkv_bias: str


GGUF_ARCHITECTURES = {
    "llama": GGUFArchitecture(rope_rows="interleaved", qkv_bias="optional"),
    "qwen2": GGUFArchitecture(rope_rows="half-split", qkv_bias="required"),
}


def _convert_gguf(path: Path, out: Path, dtype: torch.dtype, log):
    import gguf
    import numpy as np

    from engine.loading.tokenizer import prepare_gguf_tokenizer

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # bad magic, truncated file, ...
        raise UserError(f"cannot read {path} as GGUF: {e}") from None
    fields = {k: f.contents() for k, f in reader.fields.items()}
    name = fields.get("general.architecture")
    arch = GGUF_ARCHITECTURES.get(name)
    if arch is None:
        raise UserError(f"{path}: unsupported GGUF architecture {name!r}; supported: "
                        f"{', '.join(GGUF_ARCHITECTURES)}")
    where = str(path)
    tokenizer = prepare_gguf_tokenizer(fields, out)

    def meta(key, default=None, required=True):
        v = fields.get(f"{name}.{key}", default)
        if v is None and required:
            raise UserError(f"{where}: missing metadata {name}.{key}")
        return v

    raw = {t.name: t for t in reader.tensors}

    def tensor(tname: str) -> torch.Tensor:
        if tname not in raw:
            raise UserError(f"{where}: missing tensor {tname}")
        t = raw.pop(tname)
        # dequantize returns float32 in numpy order: [out, in] for matrices (GGUF ne reversed).
        # (A plain ndarray view dequantizes ~2x faster than the reader's memmap.)
        data = gguf.quants.dequantize(t.data.view(np.ndarray), t.tensor_type)
        return torch.from_numpy(np.array(data, dtype=np.float32, order="C"))  # owned, writable

    def rope_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
        return _unpermute(w, heads) if arch.rope_rows == "interleaved" else w

    dim, n_head = int(meta("embedding_length")), int(meta("attention.head_count"))
    n_kv = int(meta("attention.head_count_kv", n_head))
    head_dim = int(meta("attention.key_length", None, False) or
                   meta("rope.dimension_count", None, False) or dim // n_head)
    rot = meta("rope.dimension_count", None, False)
    if rot is not None and int(rot) != head_dim:
        raise UserError(f"{where}: partial RoPE (rope.dimension_count={rot} < head_dim="
                        f"{head_dim}) is not supported")
    theta = float(meta("rope.freq_base", 10000.0))
    freqs = tensor("rope_freqs.weight") if "rope_freqs.weight" in raw else None
    embed = tensor("token_embd.weight")
    tied = "output.weight" not in raw
    bias = "blk.0.attn_q.bias" in raw
    if arch.qkv_bias == "required" and not bias:
        raise UserError(f"{where}: a {name} model has q/k/v biases; blk.0.attn_q.bias is missing")
    vocab = int(meta("vocab_size", None, False) or embed.shape[0])
    args = _make_args(dict(
        vocab_size=vocab, n_layer=int(meta("block_count")), dim=dim, n_head=n_head,
        n_kv_heads=n_kv, head_dim=head_dim, intermediate_size=int(meta("feed_forward_length")),
        norm_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-5)), rope_base=theta,
        rope_scaling=_gguf_rope_scaling(fields, name, freqs, head_dim, theta, where),
        tie_embeddings=tied, attention_bias=bias,
        max_position_embeddings=int(meta("context_length", 2048))), where)
    log(f"converting {path} ({name}, {args.n_layer} layers, dim {dim}, dequantized) "
        f"to {_dtype_name(dtype)}")

    state = {"tok_embeddings.weight": embed, "norm.weight": tensor("output_norm.weight")}
    if not tied:
        state["output.weight"] = tensor("output.weight")
    for i in range(args.n_layer):
        b, e = f"blk.{i}.", f"layers.{i}.attention."
        q = rope_rows(tensor(b + "attn_q.weight"), n_head)
        k = rope_rows(tensor(b + "attn_k.weight"), n_kv)
        state[e + "wqkv.weight"] = torch.cat([q, k, tensor(b + "attn_v.weight")])
        if args.attention_bias:  # biases are stored in their rows' layout
            qb = rope_rows(tensor(b + "attn_q.bias")[:, None], n_head)[:, 0]
            kb = rope_rows(tensor(b + "attn_k.bias")[:, None], n_kv)[:, 0]
            state[e + "wqkv.bias"] = torch.cat([qb, kb, tensor(b + "attn_v.bias")])
        for ours, theirs in GGUF_LAYER_NAMES.items():
            state[f"layers.{i}.{ours}"] = tensor(b + theirs)
    state = {k: t.to(dtype) for k, t in state.items()}
    if raw:
        raise UserError(f"{where}: unexpected tensor {sorted(raw)[0]} for a plain {name} model "
                        f"(e.g. q/k norms, which the engine does not have)")
    _check_state(state, args, where)
    return _engine_config(args, tokenizer), state
