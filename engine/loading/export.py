"""The engine's weights as a GGUF file that llama.cpp runs (bench.py --peer llama.cpp).

    export_gguf(model, source_gguf, out_path, weight_type)   # "F32", "F16", "BF16" or "Q8_0"

The metadata (architecture, hyperparameters, vocabulary, chat template) is copied from the GGUF
the checkpoint was converted from; the tensors are the engine's own weights, split back into
llama.cpp's names and, where the architecture stores them so (`llama`), permuted back into
Meta's interleaved RoPE rows. So llama.cpp runs the numbers the engine runs: exactly in F32,
F16 and BF16; Q8_0 is llama.cpp's own 8-bit format (blocks of 32 with one scale each).
Norms and biases stay F32, as llama.cpp's converter writes them.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from core.errors import UserError
from engine.loading.convert import GGUF_ARCHITECTURES, GGUF_LAYER_NAMES

WEIGHT_TYPES = ("F32", "F16", "BF16", "Q8_0")
# Written by the writer itself, or describing the tensors, which are ours now.
_SKIPPED_KEYS = ("general.architecture", "general.file_type", "general.quantization_version")


def _permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The half-split RoPE rows of model.py -> Meta's interleaved rows (engine.loading.convert's
    _unpermute, inverted)."""
    rows, cols = w.shape
    return w.view(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def gguf_tensors(state: dict, args, arch: str) -> dict:
    """Engine state dict (float tensors) -> {GGUF name: float32 tensor}."""
    interleaved = GGUF_ARCHITECTURES[arch].rope_rows == "interleaved"
    H, Hkv = args.n_head * args.head_dim, args.n_kv_heads * args.head_dim
    out = {"token_embd.weight": state["tok_embeddings.weight"],
           "output_norm.weight": state["norm.weight"]}
    if not args.tie_embeddings:
        out["output.weight"] = state["output.weight"]
    for i in range(args.n_layer):
        e, b = f"layers.{i}.", f"blk.{i}."
        for kind in ("weight", "bias") if args.attention_bias else ("weight",):
            q, k, v = state[e + f"attention.wqkv.{kind}"].split([H, Hkv, Hkv])
            if interleaved:
                q = _permute(q.reshape(H, -1), args.n_head).reshape(q.shape)
                k = _permute(k.reshape(Hkv, -1), args.n_kv_heads).reshape(k.shape)
            out.update({b + f"attn_q.{kind}": q, b + f"attn_k.{kind}": k,
                        b + f"attn_v.{kind}": v})
        for ours, theirs in GGUF_LAYER_NAMES.items():
            out[b + theirs] = state[e + ours]
    return {name: t.detach().float().contiguous() for name, t in out.items()}


def export_gguf(state: dict, args, source: Path, out: Path, weight_type: str) -> Path:
    """Write `state` (an engine state dict of float weights, shape `args`) as a GGUF at `out`
    with the metadata of `source` (the GGUF the checkpoint came from); matrices in
    `weight_type`. Written atomically (a temporary file renamed into place)."""
    import gguf
    import numpy as np

    if weight_type not in WEIGHT_TYPES:
        raise UserError(f"GGUF weight type must be one of {', '.join(WEIGHT_TYPES)}, got "
                        f"{weight_type!r}")
    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    if arch not in GGUF_ARCHITECTURES:
        raise UserError(f"{source}: unsupported GGUF architecture {arch!r}")
    qtype = gguf.GGMLQuantizationType[weight_type]
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    try:
        for key, field in reader.fields.items():
            if key.startswith("GGUF.") or key in _SKIPPED_KEYS:
                continue
            sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
        writer.add_file_type({"F32": gguf.LlamaFileType.ALL_F32,
                              "F16": gguf.LlamaFileType.MOSTLY_F16,
                              "BF16": gguf.LlamaFileType.MOSTLY_BF16,
                              "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[weight_type])
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for name, t in gguf_tensors(state, args, arch).items():
            data = t.numpy()
            if data.ndim == 1 or weight_type == "F32":
                writer.add_tensor(name, data)
            elif weight_type == "F16":
                writer.add_tensor(name, data.astype(np.float16))
            else:
                writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
