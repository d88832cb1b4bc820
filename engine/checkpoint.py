"""The engine's checkpoint directory: config.json + model.safetensors + tokenizer files.

config.json:
    {"format": "regionkv", "version": 1, "architecture": "llama",
     "model": {ModelArgs fields}, "tokenizer": {see engine/tokenizer.py},
     "quantization": null, "source": "where it was converted from"}
Weights use the engine's module names (model.py); output.weight is absent when embeddings are tied.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.errors import UserError
from model import ModelArgs, Transformer

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
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read {cfg_path}: {e}") from None
    if cfg.get("format") != FORMAT:
        raise UserError(f"{cfg_path} is not an engine config (a Hugging Face directory?); convert "
                        f"it first with `python convert_hf.py {path} --out NEW_DIR`")
    arch = cfg.get("architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UserError(f"{cfg_path}: unsupported architecture {arch!r}; this engine runs "
                        f"{', '.join(SUPPORTED_ARCHITECTURES)} models")
    return cfg


def model_args(cfg: dict) -> ModelArgs:
    try:
        return ModelArgs.from_dict(cfg["model"])
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"invalid model section in {CONFIG_NAME}: {e}") from None


def load_model(checkpoint_dir, device="cpu", dtype=torch.float32) -> Transformer:
    from safetensors.torch import load_file

    path = Path(checkpoint_dir)
    args = model_args(read_config(path))
    weights = path / WEIGHTS_NAME
    if not weights.is_file():
        raise UserError(f"{str(path)!r} has no {WEIGHTS_NAME}; re-run convert_hf.py")
    with torch.device("meta"):
        model = Transformer(args)
    state = load_file(str(weights), device="cpu")
    if args.tie_embeddings and "tok_embeddings.weight" in state:
        state.setdefault("output.weight", state["tok_embeddings.weight"])
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise UserError(f"{weights}: weights do not match config.json (missing {missing[:3]}, "
                        f"unexpected {unexpected[:3]}); re-run convert_hf.py")
    state = {k: t.to(dtype=dtype) for k, t in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    if args.tie_embeddings:
        model.output.weight = model.tok_embeddings.weight
    return model.to(device=device).eval()
