"""Evaluate a model and cache policy: python eval.py ppl --text_file FILE [--cache POLICY].

ppl: streaming perplexity (each token scored from the previous step's logits, before it enters
the cache), on the embedded default model unless --checkpoint_path is given.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

from engine.cli import (DTYPES, Parser, add_cache_arguments, cache_factory_from_args, cache_slots,
                        list_caches, positive_int, resolve_device, resolve_dtype, run)
from engine.errors import UserError


def build_parser() -> Parser:
    p = Parser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    ppl = sub.add_parser("ppl", help="streaming perplexity of a text file")
    ppl.error = p.error  # one-line errors for the subcommand too
    ppl.add_argument("--checkpoint_path", default=None)
    ppl.add_argument("--text_file", default=None, help="UTF-8 text to score")
    ppl.add_argument("--max_tokens", type=positive_int, default=None,
                     help="score the first N tokens of the file (N - 1 predictions)")
    add_cache_arguments(ppl)
    ppl.add_argument("--seed", type=int, default=0, help="seeds CaM's random merges")
    ppl.add_argument("--dtype", choices=list(DTYPES), default=None)
    ppl.add_argument("--device", default=None)
    ppl.add_argument("--compile", action="store_true")
    ppl.add_argument("--json", action="store_true")
    ppl.add_argument("--curve", default=None, help="write the running log-ppl per position (JSON)")
    return p


def read_text(path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"--text_file {path!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read --text_file {path!r}: {e}") from None
    if not text.strip():
        raise UserError(f"--text_file {path!r} is empty")
    return text


def ppl_main(args) -> None:
    from tqdm import tqdm

    from engine.checkpoint import load_model
    from engine.default_model import default_checkpoint
    from engine.evaluation import score_step, streaming_perplexity
    from engine.tokenizer import load_tokenizer

    if args.list_caches:
        print(list_caches())
        return
    if args.text_file is None:
        raise UserError("pass --text_file FILE (e.g. a corpus from scripts/prepare_corpora.py)")
    make_cache = cache_factory_from_args(args, seed=args.seed)
    text = read_text(args.text_file)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    ckpt = args.checkpoint_path or default_checkpoint()
    tokenizer = load_tokenizer(ckpt)
    ids = tokenizer.encode(text)
    if args.max_tokens is not None:
        if len(ids) < args.max_tokens:
            raise UserError(f"{args.text_file} has only {len(ids)} tokens, fewer than "
                            f"--max_tokens {args.max_tokens}; lower --max_tokens or use a longer text")
        ids = ids[: args.max_tokens]
    model = load_model(ckpt, device=device, dtype=dtype)
    context = model.args.max_position_embeddings
    if len(ids) > context and (args.cache == "full" or args.positions == "original"):
        raise UserError(f"{len(ids)} tokens exceed the model's context of {context}; pass "
                        f"--max_tokens {context} or less, or --positions cache with a "
                        f"compressing --cache")
    with torch.device(device):
        model.setup_caches(1, max(len(ids), cache_slots(args)), make_cache)
    step = torch.compile(score_step, fullgraph=True) if args.compile else score_step

    bar = tqdm(total=len(ids) - 1, unit="tok", disable=args.json or not sys.stderr.isatty())

    def progress(n, nlls):
        if n % 64 == 0 or n == len(ids) - 1:
            bar.update(n - bar.n)
            bar.set_postfix(ppl=f"{math.exp(nlls.mean().item()):.2f}")

    result = streaming_perplexity(model, ids, step, progress)
    bar.close()
    cache_bytes = sum(c.nbytes for c in model.caches())
    out = {"nll": result.nll, "ppl": result.ppl, "tokens": result.tokens,
           "cache": args.cache, "cache_size": args.cache_size if args.cache != "full" else None,
           "kv_middle": args.kv_middle, "positions": args.positions,
           "cache_bytes": cache_bytes, "tokens_per_s": result.tokens_per_s,
           "dtype": str(dtype).removeprefix("torch."), "text_file": args.text_file}
    if args.curve:
        Path(args.curve).write_text(json.dumps({"position": list(range(1, len(ids))),
                                                "log_ppl": result.curve}))
    if args.json:
        print(json.dumps(out))
    else:
        print(f"ppl {result.ppl:.3f} (nll {result.nll:.4f}) over {result.tokens} tokens, cache "
              f"{args.cache} {cache_bytes / 2**20:.1f} MiB, {result.tokens_per_s:.1f} tokens/s")


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "ppl":
        ppl_main(args)


if __name__ == "__main__":
    run(main)
