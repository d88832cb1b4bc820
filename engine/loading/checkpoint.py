"""The engine's checkpoint directory: config.json + model.safetensors + tokenizer files.

config.json:
    {"format": "regionkv", "version": 1, "architecture": "llama",
     "model": {ModelArgs fields}, "tokenizer": {see engine/loading/tokenizer.py},
     "quantization": null, "source": "where it was converted from"}
Weights use the engine's module names (model.py); output.weight is absent when embeddings are tied.
A checkpoint made by quantize.py has "quantization": {"mode": "int8"|"int4", "groupsize": G|null}
and stores each quantized linear as qweight/scales(/zeros) (quantize/weights.py), the head included.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from core.errors import UserError
from core.memory import move_to_huge_pages
from core.tensors import read_safetensors
from engine.loading.files import publish_dir, save_weights, staging_dir
from model import ModelArgs, Transformer
from quantize.dense import pack_dense_linears
from quantize.weights import (QuantConfig, QuantizedLinear, pack_model, quantize_state_dict,
                              resolve_config, swap_linears)

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT = "regionkv"
FORMAT_VERSION = 1  # bump when converted checkpoints change; the default model is then redone
SUPPORTED_ARCHITECTURES = ("llama",)


def read_config(checkpoint_dir) -> dict:
    path = Path(checkpoint_dir)
    if not path.is_dir():
        raise UserError(f"checkpoint directory {str(path)!r} does not exist; pass a directory "
                        f"made by convert_hf.py (or omit --checkpoint_path for the default model)")
    cfg_path = path / CONFIG_NAME
    if not cfg_path.is_file():
        raise UserError(f"{str(path)!r} has no {CONFIG_NAME}; convert the model first with "
                        f"`python convert_hf.py SOURCE --out {path}`")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read {cfg_path}: {e}") from None
    if not isinstance(cfg, dict) or cfg.get("format") != FORMAT:
        raise UserError(f"{cfg_path} is not an engine config (a Hugging Face directory?); convert "
                        f"it first with `python convert_hf.py {path} --out NEW_DIR`")
    arch = cfg.get("architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UserError(f"{cfg_path}: unsupported architecture {arch!r}; this engine runs "
                        f"{', '.join(SUPPORTED_ARCHITECTURES)} models")
    return cfg


def model_args(cfg: dict) -> ModelArgs:
    """The config's model section checked against ModelArgs' schema (types and ranges)."""
    try:
        return ModelArgs.from_dict(cfg["model"])
    except KeyError:
        raise UserError(f"{CONFIG_NAME} has no model section; re-run convert_hf.py") from None
    except (TypeError, ValueError) as e:
        raise UserError(f"invalid model section in {CONFIG_NAME}: {e}; re-run convert_hf.py or "
                        f"fix the file") from None


def quant_config(cfg: dict):
    """The checkpoint's QuantConfig (quantize/weights.py), or None for a float checkpoint."""
    q = cfg.get("quantization")
    if q is None:
        return None
    try:
        return QuantConfig.from_dict(q)
    except (TypeError, ValueError) as e:
        raise UserError(f"{CONFIG_NAME}: {e}; this engine loads float, int8 and int4 "
                        f"checkpoints made by quantize.py") from None


def load_model(checkpoint_dir, device="cpu", dtype=torch.float32, pack: bool = True,
               tp=None) -> Transformer:
    """Load a checkpoint; `dtype` is the activation (and float weight) dtype. With `tp` (an
    engine.runtime.tp.TP), keep this rank's shard of every block (before packing quantized weights).

    A quantized checkpoint (config "quantization") gets Int8Linear/Int4Linear modules in place of
    its linears, loaded strictly from the storage format and, with `pack`, converted on `device`
    to the fastest kernel layout for `dtype` (without: the storage tensors, plain formula). With
    `pack`, float linears on CPU take oneDNN's packed layout (quantize/dense.py).
    """
    path = Path(checkpoint_dir)
    cfg = read_config(path)
    args = model_args(cfg)
    qconfig = quant_config(cfg)
    weights = path / WEIGHTS_NAME
    if not weights.is_file():
        raise UserError(f"{str(path)!r} has no {WEIGHTS_NAME}; re-run convert_hf.py")
    if tp is not None:
        from engine.runtime.tp import check_divides
        check_divides(tp, args, qconfig)
    with torch.device("meta"):
        model = Transformer(args)
        if qconfig is not None:
            try:
                swap_linears(model, qconfig)  # unties a tied head: it is stored quantized
            except ValueError as e:
                raise UserError(f"{CONFIG_NAME}: {e}") from None
    state = read_safetensors(weights)  # every tensor 64-byte aligned (core/tensors.py)
    if args.tie_embeddings and qconfig is None and "tok_embeddings.weight" in state:
        state.setdefault("output.weight", state["tok_embeddings.weight"])
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise UserError(f"{weights}: weights do not match config.json (missing {missing[:3]}, "
                        f"unexpected {unexpected[:3]}); re-run convert_hf.py")
    quantized = {k for k in expected if _in_quantized(model, k)}
    for k, t in expected.items():
        # codes keep their integer dtype; every other tensor must be floating point
        wrong_dtype = state[k].dtype != t.dtype if k in quantized else \
            not state[k].is_floating_point()
        if tuple(state[k].shape) != tuple(t.shape) or wrong_dtype:
            raise UserError(f"{weights}: {k} is {str(state[k].dtype)[6:]} {tuple(state[k].shape)}, "
                            f"config.json implies {str(t.dtype)[6:]} {tuple(t.shape)}")
    # Float tensors take the activation dtype; a quantized module's tensors (codes, float32
    # scales/zeros, bias) stay as stored until pack() converts them.
    state = {k: t if k in quantized else t.to(dtype=dtype) for k, t in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    del state  # the model holds its tensors: each is freed as it is packed or moved
    if args.tie_embeddings and qconfig is None:
        model.output.weight = model.tok_embeddings.weight
    if tp is not None:
        from engine.runtime.tp import shard_model
        shard_model(model, tp)
    model = model.to(device=device).eval()
    if pack:
        pack_model(model, dtype)  # quantized linears
        pack_dense_linears(model)  # float linears on CPU (quantize/dense.py)
    if model.device.type == "cpu":
        move_to_huge_pages(model)  # a step streams every weight: 2 MiB pages read faster
    return model


def _in_quantized(model, key: str) -> bool:
    mod = key.rpartition(".")[0]
    return isinstance(model.get_submodule(mod), QuantizedLinear) if mod else False


def quantize_checkpoint(checkpoint_path, mode: str, groupsize=None, out=None) -> Path:
    """Write a quantized copy of a float engine checkpoint to `out` (default DIR-int8 /
    DIR-int4-gG next to it), atomically; UserError on bad input."""
    src = Path(checkpoint_path).expanduser().absolute()
    cfg = read_config(src)
    args = model_args(cfg)
    if cfg.get("quantization") is not None:
        raise UserError(f"{src} is already quantized ({cfg['quantization']}); quantize its float "
                        f"checkpoint instead")
    if mode == "int8" and groupsize is not None:
        raise UserError("`groupsize` applies to `mode` int4 only (int8 has one scale per output "
                        "channel)")
    try:
        config = resolve_config(QuantConfig(mode, groupsize), args)
    except ValueError as e:
        raise UserError(f"`groupsize`: {e}") from None
    suffix = "int8" if mode == "int8" else f"int4-g{config.groupsize}"
    dst = Path(out).expanduser().absolute() if out else src.parent / f"{src.name}-{suffix}"
    if dst.exists():
        raise UserError(f"`out` {dst} already exists; pass a new `out` or remove it")
    weights = src / WEIGHTS_NAME
    if not weights.is_file():
        raise UserError(f"{src} has no {WEIGHTS_NAME}; re-run convert_hf.py")
    state = read_safetensors(weights)
    try:
        qstate = quantize_state_dict(state, args, config)
    except KeyError as e:
        raise UserError(f"{weights}: {e.args[0]}; re-run convert_hf.py") from None
    del state

    # `source` stays the float model's origin (a GGUF's metadata for llama.cpp's peer); the
    # float weights themselves are found by `float_checkpoint` (bench.py's peers)
    qcfg = dict(cfg, quantization=config.to_dict(), float_checkpoint=str(src))
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        with staging_dir(dst) as tmp:
            for f in src.iterdir():  # tokenizer files and anything else the loader reads
                if f.name not in (CONFIG_NAME, WEIGHTS_NAME) and f.is_file():
                    shutil.copy2(f, tmp / f.name)
            save_weights(qstate, tmp / WEIGHTS_NAME)
            (tmp / CONFIG_NAME).write_text(json.dumps(qcfg, indent=2) + "\n")
            try:
                publish_dir(tmp, dst)
            except FileExistsError:  # it appeared while we quantized
                raise UserError(f"`out` {dst} already exists; pass a new `out` or remove "
                                f"it") from None
    except OSError as e:
        raise UserError(f"writing {dst} failed: {e}") from None
    return dst
