"""Evaluate a model and cache policies: streaming perplexity, passkey retrieval, sweeps.

    python eval.py ppl --corpus wiki --max_tokens 4000 --cache weightedkv --cache_size 256
    python eval.py passkey --corpus wiki --lengths 512,1024 --cache full,weightedkv --cache_size 128
    python eval.py attention-loss --corpus wiki --cache streaming,h2o,weightedkv --cache_size 256
    python eval.py sweep --config configs/results.toml [--render-only]

ppl: every token is scored from the previous step's logits, before it enters the cache; on the
embedded default model unless --checkpoint_path is given.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from core.errors import UserError
from engine.cli import (CHECKPOINT_HELP, DTYPES, Parser, add_cache_arguments,
                        cache_factory_from_args, cache_slots,
                        check_run_fits, comma_list, fit_cache_to_stream, layer_report, list_caches,
                        positive_int, resolve_device, resolve_dtype, resolve_positions, run,
                        seed_int, size_cache_from_mib)
from engine.loading.files import check_writable, write_atomic


def depth(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"depth {text} is not in [0, 1]")
    return value


def add_text_arguments(p, what: str) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text_file", default=None, help=f"UTF-8 text {what}")
    src.add_argument("--corpus", default=None,
                     help="a corpus prepared by scripts/prepare_corpora.py: kjv, wiki")
    p.add_argument("--corpus_dir", default=None, help="where corpora live (data/corpora)")


def add_model_arguments(p) -> None:
    p.add_argument("--checkpoint_path", default=None, help=CHECKPOINT_HELP)
    p.add_argument("--dtype", choices=list(DTYPES), default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--json", action="store_true")


def add_grid_arguments(p, lengths: list, seed_help: str, batch_default: str) -> None:
    """What passkey and ruler grids share: the haystack, lengths, policies x budgets, batching,
    the model, and a resumable JSONL with its plot."""
    add_text_arguments(p, "for the haystack")
    p.add_argument("--lengths", type=comma_list(positive_int, "token counts"), default=lengths,
                   help=f"prompt lengths in tokens, e.g. {','.join(map(str, lengths[:2]))}")
    p.add_argument("--seed", type=seed_int, default=0, help=seed_help)
    p.add_argument("--cache", default="full",
                   help="comma-separated policies (NAME or NAME+int8), e.g. full,weightedkv")
    p.add_argument("--cache_size", type=comma_list(positive_int, "sizes"), default=[256],
                   help="comma-separated budgets of the compressing policies")
    p.add_argument("--batch_size", type=positive_int, default=None,
                   help=f"at most this many prompts per batch (default: {batch_default})")
    add_model_arguments(p)
    p.add_argument("--out", default=None, help="append each cell to this JSONL (resumable)")
    p.add_argument("--plot", default=None,
                   help="heat map PNG (default: --out with .png, when --out is given)")


def build_parser() -> Parser:
    p = Parser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    ppl = sub.add_parser("ppl", help="streaming perplexity of a text")
    add_text_arguments(ppl, "to score")
    ppl.add_argument("--max_tokens", type=positive_int, default=None,
                     help="score the first N tokens of the text (N - 1 predictions)")
    ppl.add_argument("--prompt_tokens", type=int, default=0,
                     help="read the first P tokens as one prompt, as generation reads it "
                          "(--prompt_compression applies), and score only the tokens after it")
    add_cache_arguments(ppl)
    ppl.add_argument("--seed", type=seed_int, default=0, help="seeds CaM's random merges")
    add_model_arguments(ppl)
    ppl.add_argument("--curve", default=None, help="write the running log-ppl per position (JSON)")

    pk = sub.add_parser("passkey", help="passkey retrieval over lengths, depths and policies")
    add_grid_arguments(pk, [512, 1024, 2048], "seeds the keys and haystack offsets",
                       "trials x depths")
    pk.add_argument("--depths", type=comma_list(depth, "depths in [0, 1]"),
                    default=[0.1, 0.5, 0.9], help="key depths as fractions of the haystack")
    pk.add_argument("--trials", type=positive_int, default=5, help="random keys per depth")
    pk.add_argument("--new_tokens", type=positive_int, default=8)

    from engine.evaluation.ruler import TASKS
    rl = sub.add_parser("ruler", help="RULER-style synthetic tasks over lengths and policies")
    add_grid_arguments(rl, [1024, 2048, 4096], "seeds the needles, words and haystack offsets",
                       "--trials")
    rl.add_argument("--tasks", default=",".join(TASKS),
                    help=f"comma-separated tasks (default: all): {', '.join(TASKS)}")
    rl.add_argument("--trials", type=positive_int, default=4, help="prompts per task and length")
    rl.add_argument("--new_tokens", type=positive_int, default=None,
                    help="greedy tokens per answer (default: each task's own)")

    al = sub.add_parser("attention-loss", help="the attention mass each policy's choices take "
                                               "away, measured on the full model")
    add_text_arguments(al, "to stream")
    al.add_argument("--max_tokens", type=positive_int, default=1024,
                    help="stream the first N tokens of the text")
    al.add_argument("--cache", default="streaming",
                    help="comma-separated policies (NAME or NAME+int8), e.g. streaming,h2o")
    al.add_argument("--cache_size", type=positive_int, default=256,
                    help="the budget of every listed policy")
    al.add_argument("--seed", type=seed_int, default=0, help="seeds CaM's random merges")
    add_model_arguments(al)
    al.add_argument("--ppl_from", default=None,
                    help="a sweep's results.jsonl: each policy's ppl at this budget, corpus and "
                         "length, for the loss-vs-ppl panel of --plot")
    al.add_argument("--plot", default=None, help="PNG: loss by layer, and loss against ppl")
    al.add_argument("--out", default=None, help="append the rows to this JSONL")

    sw = sub.add_parser("sweep", help="a resumable grid from a config file, rendered as "
                                      "Markdown and PNG plots")
    sw.add_argument("--config", required=True, help="TOML or JSON (see configs/results.toml)")
    sw.add_argument("--out", default=None, help="output directory (overrides out_dir)")
    sw.add_argument("--render-only", dest="render_only", action="store_true",
                    help="re-render the report and plots from the JSONL, run nothing")
    for s in (ppl, pk, rl, al, sw):
        s.error = p.error  # one-line errors for the subcommands too
    return p


def load_text(args) -> tuple[str, str]:
    """(text, its name) from --text_file or --corpus."""
    from engine.evaluation.perplexity import corpus_path, read_text
    if args.corpus is not None:
        path = corpus_path(args.corpus, args.corpus_dir)
        return read_text(path, f"corpus {args.corpus}"), args.corpus
    if args.text_file is None:
        raise UserError("pass --corpus NAME (kjv, wiki; see scripts/prepare_corpora.py) or "
                        "--text_file FILE")
    return read_text(args.text_file), args.text_file


def ppl_main(args) -> None:
    from tqdm import tqdm

    from engine.loading.checkpoint import load_model, model_args, read_config
    from engine.loading.default_model import resolve_checkpoint
    from caches import build_caches
    from engine.evaluation.perplexity import (compile_step, encode_prefix, score_step, streaming_perplexity,
                                   warmup)
    from engine.loading.tokenizer import load_tokenizer
    from engine.runtime.tp import start as start_tp

    if args.list_caches:
        print(list_caches())
        return
    make_cache = cache_factory_from_args(args, seed=args.seed)
    if args.curve:
        check_writable(args.curve, "--curve")
    text, source = load_text(args)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    tp = start_tp(device)  # under torchrun: this rank's share of the model (engine/runtime/tp.py)
    ckpt = resolve_checkpoint(args.checkpoint_path)
    tokenizer = load_tokenizer(ckpt)
    ids = encode_prefix(tokenizer, text, args.max_tokens)
    if args.max_tokens is not None and len(ids) < args.max_tokens:
        raise UserError(f"{source} has only {len(ids)} tokens, fewer than --max_tokens "
                        f"{args.max_tokens}; lower --max_tokens or use a longer text")
    if len(ids) < 2:
        raise UserError(f"{source} has {len(ids)} token(s); perplexity needs at least 2")
    cfg = read_config(ckpt)
    context = model_args(cfg).max_position_embeddings
    size_cache_from_mib(args, cfg, dtype)
    resolve_positions(args, len(ids), context)
    if not 0 <= args.prompt_tokens < len(ids):
        raise UserError(f"--prompt_tokens {args.prompt_tokens} must be between 0 and "
                        f"{len(ids) - 1} (the text has {len(ids)} tokens)")
    fit_cache_to_stream(args, max(args.prompt_tokens, 1), len(ids))
    make_cache = cache_factory_from_args(args, seed=args.seed)
    if len(ids) > context and (args.cache == "full" or args.positions == "original"):
        raise UserError(f"{len(ids)} tokens exceed the model's context of {context}; pass "
                        f"--max_tokens {context} or less, or --positions cache with a "
                        f"compressing --cache")
    max_seq_length = max(len(ids), cache_slots(args))
    check_run_fits(ckpt, cfg, dtype, device, 1, max_seq_length, make_cache)
    layers = layer_report(make_cache, model_args(cfg).n_layer, quiet=args.json)
    model = load_model(ckpt, device=device, dtype=dtype, tp=tp)
    caches = build_caches(model, 1, max_seq_length, make_cache)
    step, compile_s = score_step, 0.0
    if args.compile:
        step = compile_step(score_step, model, caches)
        compile_s = warmup(model, caches, step, 1)

    scored = len(ids) - max(args.prompt_tokens, 1)
    bar = tqdm(total=scored, unit="tok", disable=args.json or not sys.stderr.isatty())

    def progress(n, nlls):
        if n % 64 == 0 or n == scored:
            bar.update(n - bar.n)
            bar.set_postfix(ppl=f"{math.exp(nlls.mean().item()):.2f}")

    result = streaming_perplexity(model, caches, ids, step, progress,
                                  prompt=args.prompt_tokens)
    bar.close()
    cache_bytes = sum(c.nbytes for c in caches)
    out = {"nll": result.nll, "ppl": result.ppl, "tokens": result.tokens,
           "cache": args.cache, "cache_size": args.cache_size if args.cache != "full" else None,
           **layers,
           "kv_middle": args.kv_middle, "positions": args.positions,
           "cache_bytes": cache_bytes, "tokens_per_s": result.tokens_per_s,
           "compile_s": compile_s, "dtype": str(dtype).removeprefix("torch."),
           "corpus": args.corpus, "text_file": args.text_file, "ranks": tp.world if tp else 1,
           "prompt_tokens": args.prompt_tokens,
           "prompt_compression": args.prompt_compression or (
               None if args.cache == "full" else "chunked"),
           "compression_interval": None if args.cache == "full" else
           (args.compression_interval or 1)}
    if args.curve:
        write_atomic(Path(args.curve), json.dumps({"position": list(range(
            max(args.prompt_tokens, 1), len(ids))),
                                                   "log_ppl": result.curve}))
    if args.json:
        print(json.dumps(out))
    else:
        print(f"ppl {result.ppl:.3f} (nll {result.nll:.4f}) over {result.tokens} tokens, cache "
              f"{args.cache} {cache_bytes / 2**20:.1f} MiB, {result.tokens_per_s:.1f} tokens/s")


def attention_loss_main(args) -> None:
    from tqdm import tqdm

    from engine.evaluation import plots
    from engine.evaluation.attention_loss import attention_loss
    from engine.evaluation.perplexity import encode_prefix
    from engine.evaluation.sweep import ResultStore, Setup, cli_policies

    if args.compile:
        raise UserError("attention-loss runs eager (its probes read every probability); drop "
                        "--compile")
    specs = cli_policies(args.cache, [args.cache_size], args.seed)
    for path, flag in ((args.plot, "--plot"), (args.out, "--out")):
        if path:
            check_writable(path, flag)
    env = Setup(args)
    streams = {}  # --corpus wiki,kjv: one batch row each
    for corpus in (args.corpus.split(",") if args.corpus else [None]):
        text, source = load_text(argparse.Namespace(**dict(vars(args), corpus=corpus)))
        ids = encode_prefix(env.tokenizer, text, args.max_tokens)
        if len(ids) < args.max_tokens:
            raise UserError(f"{source} has only {len(ids)} tokens, fewer than --max_tokens "
                            f"{args.max_tokens}; lower --max_tokens or use a longer text")
        streams[source] = ids
    if args.max_tokens > env.context:
        raise UserError(f"--max_tokens {args.max_tokens} exceeds the model's context of "
                        f"{env.context}; lower it")
    factories = {s.label: s.factory(None if s.is_full else args.cache_size, args.seed)
                 for s in specs}
    bar = tqdm(total=args.max_tokens, unit="tok", disable=args.json or not sys.stderr.isatty())
    results, seconds = attention_loss(env.model, list(streams.values()), factories,
                                      progress=lambda n: bar.update(n - bar.n))
    bar.close()
    rows = [{"kind": "attention_loss", "label": r.label, "cache_size": args.cache_size,
             "corpus": corpus, "max_tokens": args.max_tokens, "loss": r.loss,
             "per_layer": r.per_layer, "seconds": seconds,
             "dtype": str(env.dtype).removeprefix("torch.")}
            for corpus, per in zip(streams, results) for r in per]
    ppl = {}
    if args.ppl_from:
        for row in ResultStore(args.ppl_from).rows():
            if row.get("key", {}).get("kind") == "ppl" and row["corpus"] in streams and \
                    row["key"].get("max_tokens") == args.max_tokens and \
                    row["cache_size"] in (None, args.cache_size):
                ppl[(row["label"], row["corpus"])] = row["ppl"]
        for row in rows:
            row["ppl"] = ppl.get((row["label"], row["corpus"]))
    if args.out:
        store = ResultStore(args.out)
        for row in rows:
            store.append(row)
    if args.plot:
        prior = [r for r in (ResultStore(args.out).rows() if args.out else rows)
                 if r.get("kind") == "attention_loss" and r["cache_size"] == args.cache_size]
        for r in prior:
            if r.get("ppl") is not None:
                ppl.setdefault((r["label"], r["corpus"]), r["ppl"])
        plots.attention_loss(prior, ppl, args.plot)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    print(f"attention loss over {args.max_tokens} tokens of {', '.join(streams)}, budget "
          f"{args.cache_size} ({seconds:.0f} s): the full attention mass on tokens a policy no "
          f"longer holds, by layer")
    print("| policy | text | loss | " + " | ".join(f"L{i}" for i in range(
        len(rows[0]["per_layer"]))) + (" | ppl |" if ppl else " |"))
    print("|---|---|---|" + "---|" * len(rows[0]["per_layer"]) + ("---|" if ppl else ""))
    for row in rows:
        cells = [row["label"], row["corpus"], f"{row['loss']:.4f}",
                 *(f"{x:.3f}" for x in row["per_layer"])]
        if ppl:
            cells.append(f"{row['ppl']:.3f}" if row.get("ppl") else "-")
        print("| " + " | ".join(cells) + " |")


def passkey_main(args) -> None:
    from engine.evaluation import plots
    from engine.evaluation.sweep import (PasskeyConfig, ResultStore, Setup, check_passkey_prompts,
                              cli_policies, expand_full, passkey_accuracy, passkey_table,
                              run_passkey_grid)

    specs = cli_policies(args.cache, args.cache_size, args.seed)
    pk = PasskeyConfig(lengths=args.lengths, depths=args.depths, trials=args.trials,
                       seed=args.seed, corpus=args.corpus, text_file=args.text_file,
                       policies=specs, cache_sizes=args.cache_size, new_tokens=args.new_tokens,
                       batch_size=args.batch_size or 0)
    store = ResultStore(args.out).check_writable() if args.out else None
    plot = args.plot or (str(Path(args.out).with_suffix(".png")) if args.out else None)
    if plot:
        check_writable(plot, "--plot")
    text, _ = load_text(args)
    env = Setup(args)
    check_passkey_prompts(env.tokenizer, pk, text, env.context)
    fresh = []
    run_passkey_grid(env, pk, store, env.base_key(args.compile, args.seed), haystack_text=text,
                     compile=args.compile, on_cell=fresh.append)
    rows = store.rows() if store is not None else fresh
    labels = [s.label for s in specs]
    acc = expand_full(passkey_accuracy(rows, labels, [None] + args.cache_size, args.lengths,
                                       args.depths), args.cache_size)
    if plot:
        plots.passkey_heatmaps(acc, labels, args.cache_size, args.lengths, args.depths, plot)
    if args.json:
        for row in rows:
            if row.get("key", {}).get("kind") == "passkey" and row.get("label") in labels:
                print(json.dumps({k: row[k] for k in ("label", "cache_size", "length",
                                                      "accuracy", "by_depth", "cache_bytes")}))
    else:
        print("\n".join(passkey_table(acc, labels, args.cache_size, args.lengths, args.depths)))


def ruler_main(args) -> None:
    from engine.evaluation import plots
    from engine.evaluation.ruler import parse_tasks
    from engine.evaluation.sweep import (ResultStore, RulerConfig, Setup, check_ruler_prompts,
                              cli_policies, expand_full, in_grid, ruler_scores,
                              ruler_table, run_ruler_grid)

    specs = cli_policies(args.cache, args.cache_size, args.seed)
    rc = RulerConfig(lengths=args.lengths, tasks=parse_tasks(args.tasks.split(","), "--tasks"),
                     trials=args.trials, seed=args.seed, corpus=args.corpus,
                     text_file=args.text_file, policies=specs, cache_sizes=args.cache_size,
                     new_tokens=args.new_tokens, batch_size=args.batch_size or 0)
    store = ResultStore(args.out).check_writable() if args.out else None
    plot = args.plot or (str(Path(args.out).with_suffix(".png")) if args.out else None)
    if plot:
        check_writable(plot, "--plot")
    text = load_text(args)[0] if rc.needs_haystack else None
    env = Setup(args)
    check_ruler_prompts(env.tokenizer, rc, text, env.context)
    fresh = []
    run_ruler_grid(env, rc, store, env.base_key(args.compile, args.seed), text,
                   compile=args.compile, on_cell=fresh.append)
    rows = store.rows() if store is not None else fresh
    labels = [s.label for s in specs]
    scores = {t: expand_full(acc, args.cache_size) for t, acc in ruler_scores(
        rows, labels, [None] + args.cache_size, rc.tasks, args.lengths).items()}
    if plot:
        plots.ruler_heatmaps(scores, rc.tasks, labels, args.cache_size, args.lengths, plot)
    if args.json:
        for row in rows:
            if in_grid(row, "ruler", labels, [None] + args.cache_size, args.lengths) \
                    and row.get("task") in rc.tasks:
                print(json.dumps({k: row[k] for k in ("label", "cache_size", "task", "length",
                                                      "score", "cache_bytes")}))
    else:
        for task in rc.tasks:
            print(f"{task}\n" + "\n".join(ruler_table(scores.get(task, {}), labels,
                                                      args.cache_size, args.lengths)) + "\n")


def sweep_main(args) -> None:
    from engine.evaluation.sweep import load_config, render, run_sweep
    cfg = load_config(args.config, out_dir=args.out)
    if args.render_only:
        if not (cfg.out_dir / "results.jsonl").exists():
            raise UserError(f"no results to render: {cfg.out_dir / 'results.jsonl'} does not "
                            f"exist (run the sweep first)")
        render(cfg)
        return
    summary = run_sweep(cfg)
    print(json.dumps({k: summary[k] for k in ("cells_run", "cells_skipped", "scored_tokens",
                                              "passkey_cells", "wall_s", "tokens_per_s",
                                              "passkey_tokens_per_s")}))


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    {"ppl": ppl_main, "passkey": passkey_main, "ruler": ruler_main,
     "attention-loss": attention_loss_main, "sweep": sweep_main}[args.command](args)


if __name__ == "__main__":
    run(main)
