"""An engine checkpoint of a known model's shapes with random weights, for speed and memory
measurements of models whose weights are not here (decode time depends on shapes, not values):

    python scripts/random_checkpoint.py llama-3-8b checkpoints/llama-3-8b-random --dtype bfloat16
    python bench.py --checkpoint_path checkpoints/llama-3-8b-random --contexts 1024,4096

The tokenizer is the default model's, or --like's (its ids fit every shape's vocabulary); text it generates
is noise. Weights are N(0, 0.02) from a fixed seed, norms 1; the directory appears atomically.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from core.errors import UserError  # noqa: E402
from engine.cli import run  # noqa: E402
from engine.loading.files import publish_dir, save_weights, staging_dir  # noqa: E402

# ModelArgs fields of published configurations (their config.json files).
SHAPES = {
    "llama-3-8b": dict(vocab_size=128256, n_layer=32, dim=4096, n_head=32, n_kv_heads=8,
                       head_dim=128, intermediate_size=14336, norm_eps=1e-5, rope_base=500000.0,
                       rope_scaling=None, tie_embeddings=False, attention_bias=False,
                       max_position_embeddings=8192),
}
# Llama-3.1-8B: the same shapes, 128k positions by its RoPE frequency scaling (contexts past 8k)
SHAPES["llama-3.1-8b"] = dict(
    SHAPES["llama-3-8b"], max_position_embeddings=131072,
    rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=8192))
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shape", help=f"one of {', '.join(SHAPES)}, an embedded model's name "
                                 f"(smollm2-135m, qwen2.5-coder-0.5b) or a checkpoint directory: "
                                 f"its shapes")
    p.add_argument("out", help="new checkpoint directory")
    p.add_argument("--dtype", choices=list(DTYPES), default="bfloat16",
                   help="stored weight dtype (default bfloat16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="where to draw the weights (cuda: faster)")
    p.add_argument("--like", default=None,
                   help="checkpoint whose tokenizer and config format to take (default: the "
                        "default model's)")
    args = p.parse_args(argv)

    from engine.loading.checkpoint import model_args, read_config
    from engine.loading.default_model import EMBEDDED, default_checkpoint, resolve_checkpoint
    from model import Transformer
    if args.shape not in SHAPES and args.shape not in EMBEDDED and not Path(args.shape).is_dir():
        raise UserError(f"unknown shape {args.shape!r}; choose from "
                        f"{', '.join([*SHAPES, *EMBEDDED])}")
    out = Path(args.out)
    if out.exists():
        raise UserError(f"{out} exists; pass a new directory")
    source = Path(args.like) if args.like else default_checkpoint()  # format and tokenizer
    cfg = read_config(source)
    shape = SHAPES.get(args.shape) or read_config(resolve_checkpoint(args.shape))["model"]
    cfg.update(model=dict(shape), source=f"random:{args.shape}:seed{args.seed}")
    margs = model_args(cfg)
    with torch.device("meta"):
        names = {k: (tuple(t.shape)) for k, t in Transformer(margs).state_dict().items()}
    if margs.tie_embeddings:
        names.pop("output.weight")
    gen = torch.Generator(args.device).manual_seed(args.seed)
    dtype = DTYPES[args.dtype]
    state = {}
    for k, shape in names.items():
        if len(shape) == 1 and k.endswith("norm.weight"):
            state[k] = torch.ones(shape, dtype=dtype)
        else:
            state[k] = (torch.randn(shape, generator=gen, device=args.device) * 0.02).to(dtype).cpu()
    out.parent.mkdir(parents=True, exist_ok=True)
    with staging_dir(out) as tmp:
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        shutil.copy(source / cfg["tokenizer"]["file"], tmp)
        save_weights(state, tmp / "model.safetensors")
        publish_dir(tmp, out)
    n = sum(t.numel() for t in state.values())
    print(f"wrote {out}: {args.shape} shapes, {n / 1e9:.2f}B parameters, {args.dtype}")


if __name__ == "__main__":
    run(main)
