"""Shared CLI plumbing: one-line errors, size validators, device/dtype resolution."""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

from core.entry import run  # noqa: F401  (every tool's entry point takes it from here)
from core.errors import UserError
from core.tensors import DTYPES

CHECKPOINT_HELP = ("engine checkpoint directory (convert_hf.py output) or an embedded model: "
                   "smollm2-135m (the default), qwen2.5-coder-0.5b (converted on first use)")


class Parser(argparse.ArgumentParser):
    """argparse that reports bad input on one line (no usage dump) and exits with status 2."""

    def error(self, message):
        self.exit(2, f"error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def seed_int(text: str) -> int:
    """A random seed: an integer torch.manual_seed takes (0 <= seed < 2**64)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"must be between 0 and 2**64 - 1, got {value}")
    return value


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def positive_float(text: str) -> float:
    value = finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = finite_float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def resolve_device(name: str | None) -> torch.device:
    if name is None:
        if not torch.cuda.is_available():
            return torch.device("cpu")
        # one GPU per rank under torchrun
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown --device {name!r}; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA GPU is available; use --device cpu")
    return device


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    # float32 on CPU (bf16 matmuls are slower there for small models), bf16 on GPUs.
    if name is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def open_checkpoint(args):
    """The device, dtype, checkpoint directory, its config and tokenizer that --device, --dtype
    and --checkpoint_path name (the embedded default model without one)."""
    from engine.loading.checkpoint import read_config
    from engine.loading.default_model import resolve_checkpoint
    from engine.loading.tokenizer import load_tokenizer
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    ckpt = resolve_checkpoint(args.checkpoint_path)
    cfg = read_config(ckpt)
    return device, dtype, ckpt, cfg, load_tokenizer(ckpt)


def add_compile_arguments(p) -> None:
    """--compile and --compile_prefill, as generate.py and serve.py take them."""
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step")
    p.add_argument("--compile_prefill", action="store_true",
                   help="also compile the prompt (a layer's step over a chunk, a chunk, or "
                        "power-of-two buckets for full): "
                        "a long prompt's first token sooner, for one more compile")


def add_bake_argument(p) -> None:
    """--bake_weights, as generate.py, serve.py and bench.py take it."""
    p.add_argument("--bake_weights", action="store_true",
                   help="compile the CPU decode step with the linear weights baked in as "
                        "constants (Inductor's own GEMM kernels instead of the engine's GEMV): "
                        "about as fast, about half a minute of compile; needs --compile")


def check_bake_argument(args) -> None:
    """--bake_weights needs --compile (generate.py, serve.py)."""
    if args.bake_weights and not args.compile:
        raise UserError("--bake_weights bakes the weights into the compiled decode step: give "
                        "--compile with it")


def add_cache_arguments(p) -> None:
    """The cache flags shared by generate.py, eval.py and bench.py."""
    from caches import BUDGET_PATTERNS, DEFAULT_CACHE_SIZE, LAYER_PATTERNS, PROMPT_COMPRESSION
    p.add_argument("--cache", type=cache_name, default="full",
                   help="KV cache policy (see --list_caches), or policies by layer with "
                        "--layer_pattern (e.g. weightedkv,full)")
    p.add_argument("--layer_pattern", choices=list(LAYER_PATTERNS), default=None,
                   help="assign the --cache policies to layers: repeat (alternate layer by "
                        "layer) or tile (contiguous blocks: first half, second half)")
    p.add_argument("--budget_pattern", choices=list(BUDGET_PATTERNS), default=None,
                   help="spread the budget over layers: uniform (default), pyramid (more in "
                        "lower layers, 1.5x down to 0.5x --cache_size) or funnel (the reverse); "
                        "the total over all layers stays layers x --cache_size")
    p.add_argument("--list_caches", action="store_true", help="list the cache policies and exit")
    p.add_argument("--cache_size", type=positive_int, default=DEFAULT_CACHE_SIZE,
                   help="retained tokens (sink + middle + window) of a compressing policy")
    p.add_argument("--cache_mib", type=positive_float, default=None,
                   help="size a compressing policy by memory instead: the largest regions whose "
                        "bytes (one stream, every layer) fit in this many MiB, keeping the "
                        "default split's proportions (or the given --sink/--window), the "
                        "middle taking what is left; overrides --cache_size")
    p.add_argument("--sink", type=int, default=None, help="sink tokens (default 4)")
    p.add_argument("--window", type=int, default=None,
                   help="window tokens (default cache_size // 2 - sink; streaming/cam: "
                        "cache_size - sink)")
    p.add_argument("--kv_middle", choices=["model", "int8"], default="model",
                   help="store the middle region in the model dtype or INT8")
    p.add_argument("--positions", choices=["auto", "original", "cache"], default="auto",
                   help="rotate keys at their original positions, or by rank in the cache "
                        "(StreamingLLM pos-shift, for streams beyond the model's context); "
                        "auto (default): original while the stream fits the model's context, "
                        "cache for a compressing cache whose stream would outgrow it (the run "
                        "says which)")
    p.add_argument("--prefill_chunk", type=positive_int, default=None,
                   help="prompt chunk size of compressing policies (default 32)")
    p.add_argument("--prompt_compression", choices=list(PROMPT_COMPRESSION), default=None,
                   help="how a compressing policy shrinks a prompt chunk: chunked (default: "
                        "token by token, in order), bulk (one pass per chunk: the lowest-"
                        "scored tokens go at once; a faster first token) or snapkv (a prompt "
                        "over the budget is read whole and compressed once, by the attention "
                        "of its last --observation_window tokens; quantized: read whole, then "
                        "stored in int8 past the window)")
    p.add_argument("--compression_interval", type=positive_int, default=None,
                   help="decode compresses in one bulk pass every N tokens instead of after "
                        "each (default 1; at most --prefill_chunk): the tokens waiting for a "
                        "pass stay in the staging slots and are attended until it")
    p.add_argument("--observation_window", type=positive_int, default=None,
                   help="snapkv: prompt tokens whose attention picks the survivors (default 32)")
    add_policy_options(p)


def add_speculation_arguments(p) -> None:
    """Speculative decoding's flags (generate.py, bench.py): one of three drafts, and k."""
    p.add_argument("--draft_checkpoint_path", default=None,
                   help="speculative decoding with a draft model of the same vocabulary: a "
                        "smaller checkpoint, or the target's own quantize.py output")
    p.add_argument("--draft", choices=["ngram"], default=None,
                   help="ngram: speculative decoding by prompt lookup (drafts copied from "
                        "earlier in the stream)")
    p.add_argument("--ngram", type=positive_int, default=3,
                   help="prompt lookup: the longest n-gram matched (default 3)")
    p.add_argument("--draft_cache", type=cache_name, default=None,
                   help="speculative decoding with the target's own weights over this small "
                        "cache policy (e.g. streaming); with --draft_checkpoint_path: the draft "
                        "model's cache (default full, or streaming for an unbounded stream)")
    p.add_argument("--draft_cache_size", type=positive_int, default=256,
                   help="retained tokens of a compressing --draft_cache (default 256)")
    p.add_argument("--speculate_k", type=positive_int, default=None,
                   help="tokens the draft guesses a step (default 4 when a draft is given)")


def speculating(args) -> bool:
    """Whether the flags ask for speculative decoding (UserError for a k without a draft)."""
    drafts = [args.draft_checkpoint_path, args.draft, args.draft_cache]
    if args.draft and (args.draft_checkpoint_path or args.draft_cache):
        raise UserError("--draft ngram needs no model: drop --draft_checkpoint_path and "
                        "--draft_cache, or drop --draft")
    if args.speculate_k is not None and not any(drafts):
        raise UserError("--speculate_k needs a draft: --draft_checkpoint_path PATH, --draft "
                        "ngram or --draft_cache POLICY")
    return any(drafts)


def schedule_for_speculation(args) -> None:
    """A compressing cache that speculation reads must compress on a schedule (never inside a
    verify step): without --compression_interval every chunk - k positions, the longest
    interval whose waiting tokens leave the staging slots room for a verify step."""
    from caches import DEFAULT_CHUNK
    if args.cache != "full" and getattr(args, "compression_interval", None) is None:
        k = args.speculate_k or 4
        args.compression_interval = max(2, (args.prefill_chunk or DEFAULT_CHUNK) - k)
        if not getattr(args, "json", False):
            print(f"note: speculative decoding: the cache compresses every "
                  f"{args.compression_interval} positions (--compression_interval); the output "
                  f"is that of the same run without speculation", file=sys.stderr)
    if args.cache != "full" and args.compression_interval == 1:
        raise UserError("speculative decoding needs --compression_interval above 1 (a verify "
                        "step never crosses a compression)")


def speculation_from_args(args, model, max_seq_length: int, unbounded: bool):
    """The Speculation the flags ask for, on the loaded target `model`."""
    from caches import make_cache_factory
    from engine.runtime.speculative import ModelDraft, NgramDraft, Speculation
    k = args.speculate_k or 4
    if args.draft == "ngram":
        return Speculation(NgramDraft(args.ngram), k)
    policy = args.draft_cache or ("streaming" if unbounded else "full")
    if policy == "full" and unbounded:
        raise UserError("an unbounded stream outgrows a full draft cache: give --draft_cache "
                        "streaming (or another compressing policy)")
    cache = make_cache_factory("full") if policy == "full" else make_cache_factory(
        policy, cache_size=args.draft_cache_size, positions="cache" if unbounded else "original")
    draft_model, label = model, f"the target over a {policy} cache"
    if args.draft_checkpoint_path:
        from engine.loading.checkpoint import load_model
        from engine.loading.default_model import resolve_checkpoint
        ckpt = resolve_checkpoint(args.draft_checkpoint_path)
        draft_model = load_model(ckpt, device=model.device, dtype=model.dtype)
        label = f"draft model {ckpt.name}"
    length = model.args.max_position_embeddings if unbounded else max_seq_length
    if unbounded and draft_model is not model:
        length = draft_model.args.max_position_embeddings
    return Speculation(ModelDraft(draft_model, cache, length, label), k)


def add_policy_options(p) -> None:
    """A flag for every option a policy declares (caches.base.Option), its help made from the
    declaration. Default None = not given, so a policy that has no such option can refuse it."""
    from caches import all_options
    for name, (o, policies) in all_options().items():
        default = "" if o.default is None else f"; default {o.default}"
        p.add_argument(f"--{name}", type=finite_float if o.type is float else int, default=None,
                       help=f"{', '.join(policies)}: {o.help}, {o.range()}{default}")


def policy_option_names() -> tuple:
    """The options some policy declares, which the tools pass on when given."""
    from caches import all_options
    return tuple(all_options())


def cache_name(text: str) -> str:
    """--cache: one policy, or several (comma- or slash-separated) for --layer_pattern."""
    from caches import POLICIES, layer_policies
    for name in layer_policies(text):
        if name not in POLICIES:
            raise argparse.ArgumentTypeError(f"unknown cache policy {name!r}; choose one of "
                                             f"{', '.join(POLICIES)}")
    return text


def is_layered(args) -> bool:
    """Caches that differ by layer (several policies, or a budget pattern)."""
    return "," in args.cache or "/" in args.cache or \
        getattr(args, "budget_pattern", None) not in (None, "uniform")
# Flags of the region cache, which `full` refuses.
REGION_FLAGS = ("sink", "window", "prefill_chunk", "prompt_compression", "observation_window",
                "compression_interval")


def round_up(n: int, multiple: int = 64) -> int:
    return -(-n // multiple) * multiple


def size_cache_from_mib(args, cfg: dict, dtype) -> None:
    """--cache_mib: the regions caches.fit_to_bytes chooses for this model and dtype become
    --cache_size/--sink/--window (said on stderr); nothing without --cache_mib."""
    from caches import DEFAULT_CHUNK, fit_to_bytes
    from engine.loading.checkpoint import model_args
    if getattr(args, "cache_mib", None) is None:
        return
    if is_layered(args):
        raise UserError("--cache_mib sizes one policy with a uniform budget; give --cache_size "
                        "with --layer_pattern/--budget_pattern")
    options = {o: getattr(args, o) for o in policy_option_names()
               if getattr(args, o, None) is not None}
    sink, window, middle = fit_to_bytes(
        args.cache, int(args.cache_mib * 2**20), model_args(cfg), dtype, sink=args.sink,
        window=args.window, kv_middle=args.kv_middle, chunk=args.prefill_chunk or DEFAULT_CHUNK,
        **options)
    print(f"note: --cache_mib {args.cache_mib:g}: {args.cache} holds {sink + window + middle} "
          f"tokens (sink {sink}, window {window}, middle {middle})", file=sys.stderr)
    args.cache_size, args.sink, args.window, args.cache_mib = sink + window + middle, sink, \
        window, None


def fit_cache_to_stream(args, prompt_tokens: int, stream_tokens: int) -> None:
    """Size a compressing cache to what a run of stream_tokens can hold, so the bytes reported
    are the bytes needed: each region (sink, window, middle) shrinks to what the stream (rounded
    up to 64) can put in it, which changes no result: a region that large never overflows. A
    prefill chunk longer than the prompt becomes 1 (the prompt went token by token either
    way)."""
    from caches import region_sizes
    if args.cache == "full" or is_layered(args):  # a layered plan keeps the sizes it was given
        return
    limit = round_up(stream_tokens)
    regions = list(region_sizes(args.cache, args.cache_size, args.sink, args.window))
    sink, window, middle = regions
    # A window of limit - sink tokens never overflows; at most limit - sink - window tokens
    # ever leave the window for the middle.
    sink = min(sink, limit)
    window = min(window, max(1, limit - sink))
    fitted = [sink, window, min(middle, max(1, limit - sink - window)) if middle else 0]
    if fitted != regions:
        print(f"note: --cache_size {args.cache_size} is more than this run of {stream_tokens} "
              f"tokens can use; the cache holds {sum(fitted)} (sink {fitted[0]}, window "
              f"{fitted[1]}, middle {fitted[2]})", file=sys.stderr)
        args.cache_size, args.sink, args.window = sum(fitted), fitted[0], fitted[1]
    if args.prefill_chunk is not None and args.prefill_chunk > prompt_tokens:
        print(f"note: --prefill_chunk {args.prefill_chunk} is longer than the prompt "
              f"({prompt_tokens} tokens), which goes token by token; 1 staging slot is enough",
              file=sys.stderr)
        args.prefill_chunk = 1


def check_run_fits(ckpt, cfg: dict, dtype, device, batch_size: int, max_seq_length: int,
                   make_cache) -> None:
    """Before loading anything: the weights (their file) and the caches must fit, with the
    margin of core/memory.py."""
    from pathlib import Path

    from caches import cache_nbytes
    from core.memory import check_fits
    from engine.loading.checkpoint import WEIGHTS_NAME, model_args
    weights = Path(ckpt) / WEIGHTS_NAME
    size = weights.stat().st_size if weights.is_file() else 0
    caches = cache_nbytes(model_args(cfg), batch_size, max_seq_length, dtype, make_cache)
    check_fits(size + caches, "the model and its KV cache", device,
               "lower --cache_size, --max_seq_length or --max_new_tokens")


def cache_slots(args) -> int:
    """Slots a compressing cache holds (budget + prefill staging + the spare middle slot): the
    RoPE table must cover them when keys rotate by their rank (--positions cache)."""
    from caches import DEFAULT_CHUNK
    return args.cache_size + (args.prefill_chunk or DEFAULT_CHUNK) + 1


def list_caches() -> str:
    """One line a policy: its name, what it does and its options' flags with their defaults."""
    from caches import POLICIES, describe

    def options(cls):
        flags = [f"--{o.name}" + ("" if o.default is None else f" {o.default}")
                 for o in cls.options]
        return f" (options: {', '.join(flags)})" if flags else ""
    return "\n".join(f"{name:<18}{describe(name)}{options(cls)}" for name, cls in POLICIES.items())


def resolve_positions(args, stream_tokens, context: int) -> str:
    """Settle --positions auto for a stream of stream_tokens (None: unknown, e.g. a chat):
    original positions while it fits the model's context, else rank positions (a compressing
    cache only; full keeps original positions and stops at the context)."""
    if args.positions == "auto":
        fits = stream_tokens is not None and stream_tokens <= context
        args.positions = "original" if fits or args.cache == "full" else "cache"
    return args.positions


def layer_report(make_cache, n_layers: int, quiet: bool = False) -> dict:
    """A layered plan's per-layer policies and budgets: said on stderr (unless quiet), and the
    fields --json rows carry ({} for one policy at one budget)."""
    from caches import LayeredFactory
    if not isinstance(make_cache, LayeredFactory):
        return {}
    if not quiet:
        print(f"note: {make_cache.describe(n_layers)}", file=sys.stderr)
    return {"layers": make_cache.budgets(n_layers), **{k: make_cache.spec[k] for k in (
        "layer_pattern", "budget_pattern")}}


def cache_factory_from_args(args, seed: int = 0):
    from caches import DEFAULT_CHUNK, make_cache_factory
    if args.positions == "auto":  # settled by resolve_positions once the stream is known;
        args = argparse.Namespace(**dict(vars(args), positions="original"))  # validate now
    options = {o: getattr(args, o) for o in policy_option_names()
               if getattr(args, o, None) is not None}
    region = {}
    if args.cache != "full":
        region = dict(cache_size=args.cache_size, sink=args.sink, window=args.window,
                      chunk=args.prefill_chunk or DEFAULT_CHUNK,
                      prompt_compression=args.prompt_compression or "chunked", seed=seed,
                      observation_window=getattr(args, "observation_window", None),
                      compression_interval=getattr(args, "compression_interval", None) or 1)
    elif any(getattr(args, a, None) is not None for a in REGION_FLAGS):
        raise UserError("--sink/--window/--prefill_chunk/--prompt_compression/"
                        "--observation_window/--compression_interval apply to compressing "
                        "policies, not full")
    layers = {k: v for k in ("budget_pattern", "layer_pattern")
              if (v := getattr(args, k, None)) is not None}
    return make_cache_factory(args.cache, kv_middle=args.kv_middle, positions=args.positions,
                              **region, **layers, **options)


def comma_list(kind, what):
    def parse(text: str) -> list:
        try:
            values = [kind(v) for v in text.split(",") if v.strip()]
        except (ValueError, argparse.ArgumentTypeError):
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of "
                                             f"{what}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"empty list {text!r}")
        return values
    return parse
