"""Generate text: python generate.py --prompt "..." [--cache POLICY] [--compile] [--json].

Without --checkpoint_path it runs the embedded default model (SmolLM2-135M-Instruct), converted
on first use. Text streams to stdout as it is generated; the summary goes to stderr. With --json,
stdout is one JSON object.
"""
from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import NamedTuple, Optional

import torch

from core.errors import UserError, as_flags
from engine.cli import (CHECKPOINT_HELP, DTYPES, Parser, add_bake_argument, add_cache_arguments,
                        add_compile_arguments, add_speculation_arguments,
                        cache_factory_from_args, cache_slots, check_bake_argument,
                        check_run_fits, fit_cache_to_stream, layer_report, list_caches,
                        non_negative_float, open_checkpoint, positive_int, resolve_positions,
                        round_up, run, schedule_for_speculation, seed_int,
                        size_cache_from_mib, speculating, speculation_from_args)


def build_parser() -> Parser:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint_path", default=None, help=CHECKPOINT_HELP)
    p.add_argument("--prompt", default="Hello, my name is")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--interactive", action="store_true",
                   help="multi-turn chat in the terminal, one session whose cache is never reset "
                        "(/exit or Ctrl-D ends, /reset starts over, /save FILE writes the session)")
    p.add_argument("--system", default=None, help="system message of --chat / --interactive")
    p.add_argument("--max_new_tokens", type=positive_int, default=200)
    p.add_argument("--temperature", type=non_negative_float, default=0.8, help="0 = greedy")
    p.add_argument("--top_k", type=positive_int, default=200)
    p.add_argument("--num_samples", type=positive_int, default=1)
    p.add_argument("--seed", type=seed_int, default=None)
    add_compile_arguments(p)
    add_bake_argument(p)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available)")
    p.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="default: bfloat16 on CUDA, float32 on CPU")
    add_cache_arguments(p)
    add_speculation_arguments(p)
    p.add_argument("--max_seq_length", type=positive_int, default=None,
                   help="cache length in tokens (default: prompt + max_new_tokens, rounded up)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="write a torch.profiler Chrome trace (JSON) of the generation to FILE")
    return p


def check_profile_path(path: str) -> Path:
    """Refuse a trace path that cannot be written before spending time generating."""
    out = Path(path).expanduser()
    if out.is_dir():
        raise UserError(f"--profile {path!r} is a directory; pass a file name such as "
                        f"{str(out / 'trace.json')!r}")
    if not out.parent.is_dir():
        raise UserError(f"--profile {path!r}: directory {str(out.parent)!r} does not exist")
    existed = out.exists()
    try:
        with open(out, "a"):
            pass
    except OSError as e:
        raise UserError(f"--profile {path!r} cannot be written: {e.strerror}") from None
    if not existed:
        out.unlink()
    return out


def profiled(gen, device: torch.device):
    """A profiler over the generation, with prefill and each decode step labelled in the trace.
    The labels wrap the Generator's own step functions (on the instance), so the engine's code
    is traced as it runs without it."""
    from torch.profiler import ProfilerActivity, profile, record_function

    def label(name, fn):
        def wrapped(*a, **k):
            with record_function(name):
                return fn(*a, **k)
        return wrapped

    gen.append = label("prefill", gen.append)
    gen.decode_fn = label("decode", gen.decode_fn)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    return profile(activities=activities)


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class TextStream:
    """Prints decoded text as tokens arrive (an incremental detokenizer: linear in the length of
    the output); holds back incomplete UTF-8 sequences."""

    def __init__(self, tokenizer, skip_ids, out=None):
        from engine.loading.tokenizer import StreamingDetokenizer
        self.detok, self.skip = StreamingDetokenizer(tokenizer), set(skip_ids)
        # sys.stdout as it is now: under torchrun, ranks after 0 have replaced it (engine/runtime/tp.py)
        self.out = out or sys.stdout

    def __call__(self, token_id: int) -> None:
        if token_id in self.skip:
            return
        text = self.detok.add(token_id)
        if text:
            self.out.write(text)
            self.out.flush()


def interactive(args, session, tokenizer) -> None:
    """The terminal chat: one Session for the whole conversation (engine/runtime/chat.py)."""
    from engine.runtime.chat import Chat
    chat = Chat(session, tokenizer, args.system)
    print("chat: /exit or Ctrl-D ends, /reset starts over, /save FILE writes the session",
          file=sys.stderr)
    while True:
        seen = max(session.positions)
        try:
            line = input(f"[{seen} tokens, cache {session.cache_bytes / 2**20:.1f} MiB] > ")
        except EOFError:
            print()
            return
        command, _, rest = line.strip().partition(" ")
        try:
            if command == "/exit":
                return
            if command == "/reset":
                chat.reset()
                print("(new conversation)")
                continue
            if command == "/save":
                if not rest.strip():
                    raise UserError("/save needs a file name: /save FILE")
                session.save(rest.strip())
                print(f"(saved {rest.strip()})")
                continue
            chat.turn(line, args.max_new_tokens, args.temperature, args.top_k,
                      callback=TextStream(tokenizer, tokenizer.eos_ids))
            print()
        except UserError as e:  # a bad turn ends the turn, not the chat
            print(f"error: {as_flags(str(e))}", file=sys.stderr)


class Run(NamedTuple):
    """What `start` made of the flags: the loaded model's generator (a Session for
    --interactive), its tokenizer and prompt, and what the JSON report says of them."""
    gen: object
    tokenizer: object
    prompt: list
    positions: str
    layers: dict
    device: torch.device
    dtype: torch.dtype
    max_seq_length: int
    compile_s: Optional[float]
    tp: object


def start(args) -> Run:
    """Load the checkpoint and build (and, with --compile, warm up) the generator the flags
    ask for; every size is checked before anything is loaded."""
    check_bake_argument(args)
    speculate = speculating(args)
    if speculate:
        schedule_for_speculation(args)
        if args.draft_checkpoint_path:  # a wrong path fails before anything loads
            from engine.loading.default_model import resolve_checkpoint
            resolve_checkpoint(args.draft_checkpoint_path)
    cache_factory_from_args(args, seed=args.seed or 0)  # bad cache flags fail before loading
    from engine.loading.checkpoint import load_model, model_args
    from engine.runtime.generation import Generator, Session
    from engine.runtime.tp import shared_seed
    from engine.runtime.tp import start as start_tp

    device, dtype, ckpt, cfg, tokenizer = open_checkpoint(args)
    tp = start_tp(device)  # under torchrun: this rank's share of the model (engine/runtime/tp.py)
    if tp and args.interactive:
        raise UserError("--interactive reads the terminal in one process; run it without torchrun")
    context = cfg["model"]["max_position_embeddings"]
    size_cache_from_mib(args, cfg, dtype)

    text = args.prompt
    if args.chat:
        system = [{"role": "system", "content": args.system}] if args.system else []
        text = tokenizer.apply_chat_template(system + [{"role": "user", "content": args.prompt}])
    # A chat template writes its own BOS when the model wants one.
    prompt = tokenizer.encode(text, bos=False if args.chat else None)
    if not prompt and not args.interactive:
        raise UserError("the prompt is empty after tokenization; pass a non-empty --prompt")

    # A chat's length is unknown: auto gives a compressing cache rank positions (unbounded).
    positions = resolve_positions(
        args, None if args.interactive else len(prompt) + args.max_new_tokens, context)
    if not args.interactive:
        fit_cache_to_stream(args, len(prompt), len(prompt) + args.max_new_tokens)
    make_cache = cache_factory_from_args(args, seed=args.seed or 0)
    max_seq_length = args.max_seq_length
    if args.interactive and not (args.cache != "full" and positions == "cache"):
        max_seq_length = max_seq_length or context
        if max_seq_length > context:
            raise UserError(f"--max_seq_length {max_seq_length} exceeds the model's context of "
                            f"{context} tokens; use at most {context}")
    elif args.cache != "full" and positions == "cache":
        # Keys rotate by their rank in the cache: positions never outgrow it, so the stream is
        # unbounded and the RoPE table only has to cover the cache, inside the model's context.
        staging = cache_slots(args) - args.cache_size
        if cache_slots(args) > context:
            raise UserError(f"--cache_size {args.cache_size} (+ {staging} staging slots) exceeds "
                            f"the model's context of {context}: rank positions must stay inside "
                            f"it; use --cache_size {context - staging} or less")
        max_seq_length = max_seq_length or min(round_up(cache_slots(args)), context)
    else:
        if max_seq_length is None:
            max_seq_length = min(round_up(len(prompt) + args.max_new_tokens), context)
        elif max_seq_length > context:
            raise UserError(f"--max_seq_length {max_seq_length} exceeds the model's context of "
                            f"{context} tokens; use at most {context}, or --positions cache with "
                            f"a compressing --cache for longer streams")
        if len(prompt) >= max_seq_length:
            raise UserError(f"the prompt is {len(prompt)} tokens but --max_seq_length is "
                            f"{max_seq_length}; raise --max_seq_length above {len(prompt)} (the "
                            f"model allows {context}) or shorten the prompt")
        if len(prompt) + args.max_new_tokens > max_seq_length:
            print(f"note: positions stop at {max_seq_length}: generating at most "
                  f"{max_seq_length - len(prompt)} new tokens", file=sys.stderr)

    check_run_fits(ckpt, cfg, dtype, device, 1, max_seq_length, make_cache)
    layers = layer_report(make_cache, model_args(cfg).n_layer, quiet=args.json)
    seed = shared_seed(tp, args.seed)  # ranks sample alike
    if seed is not None:
        torch.manual_seed(seed)
    t = time.perf_counter()
    model = load_model(ckpt, device=device, dtype=dtype, tp=tp)
    speculation = None
    if speculate:
        if tp:
            raise UserError("speculative decoding runs in one process; run it without torchrun")
        unbounded = args.cache != "full" and positions == "cache"
        speculation = speculation_from_args(args, model, max_seq_length, unbounded)
    kind = Session if args.interactive else Generator
    gen = kind(model, max_seq_length=max_seq_length, make_cache=make_cache,
               compile=args.compile, compile_prefill=args.compile_prefill,
               bake_weights=args.bake_weights, speculation=speculation)
    load_s = time.perf_counter() - t
    if not args.json:
        print(f"loaded {ckpt} in {load_s:.1f} s ({device}, {str(dtype).removeprefix('torch.')}, "
              f"cache {args.cache}, positions {positions}"
              f"{f', {tp.world} ranks' if tp else ''})", file=sys.stderr)
    compile_s = None
    if args.compile:
        if not args.json:
            print("compiling the decode step" + (" with the weights baked in (about half a minute)"
                  if args.bake_weights else "") + "...", file=sys.stderr)
        compile_s = gen.warmup(args.temperature, args.top_k)
        if not args.json:
            print(f"compiled in {compile_s:.1f} s", file=sys.stderr)
    return Run(gen, tokenizer, prompt, positions, layers, device, dtype, max_seq_length,
               compile_s, tp)


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if args.list_caches:
        print(list_caches())
        return
    profile_path = check_profile_path(args.profile) if args.profile else None
    if args.interactive and (args.json or args.num_samples > 1 or args.profile):
        raise UserError("--interactive is a terminal chat; it takes no --json, --num_samples "
                        "or --profile")
    r = start(args)
    gen, tokenizer, prompt, device = r.gen, r.tokenizer, r.prompt, r.device
    if args.interactive:
        interactive(args, gen, tokenizer)
        return

    prof = profiled(gen, device) if profile_path else None
    if prof:
        prof.start()
    samples = []
    for i in range(args.num_samples):
        stream = None
        if not args.json:
            if args.num_samples > 1:
                print(f"--- sample {i + 1}", file=sys.stderr)
            sys.stdout.write(args.prompt if not args.chat else "")
            stream = TextStream(tokenizer, tokenizer.eos_ids)
        g = gen.generate(prompt, args.max_new_tokens, args.temperature, args.top_k,
                         eos_ids=tokenizer.eos_ids, callback=stream)
        new_ids = g.new_ids[0]
        shown = [t for t in new_ids if t not in set(tokenizer.eos_ids)]
        samples.append({"text": tokenizer.decode(shown), "token_ids": g.token_ids[0],
                        "new_tokens": g.new_tokens, "tokens_per_s": g.tokens_per_s,
                        "prefill_s": g.prefill_s})
        stats = getattr(gen, "spec_stats", None)
        if stats is not None:
            samples[-1]["speculation"] = {"draft": gen.speculation.draft.describe(),
                                          "k": gen.speculation.k, "steps": stats.steps,
                                          "acceptance": round(stats.acceptance, 4),
                                          "mean_accepted": round(stats.mean_accepted, 3)}
        if not args.json:
            print()
            print(f"{g.new_tokens} tokens, prefill {g.prefill_s:.2f} s, decode "
                  f"{g.tokens_per_s:.1f} tokens/s" + (" (stopped at EOS)" if g.stopped_at_eos else ""),
                  file=sys.stderr)
            if stats is not None:
                print(f"speculation ({gen.speculation.draft.describe()}, k "
                      f"{gen.speculation.k}): {stats.acceptance:.0%} of guesses accepted, "
                      f"{stats.mean_accepted:.2f} tokens a step", file=sys.stderr)
    if prof:
        prof.stop()
        prof.export_chrome_trace(str(profile_path))
        print(f"wrote profiler trace {profile_path} (chrome://tracing or ui.perfetto.dev)",
              file=sys.stderr)
        sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=sort, row_limit=15), file=sys.stderr)

    memory = {"cache_bytes": gen.cache_bytes, "peak_memory_bytes": peak_memory_bytes(device)}
    if args.json:
        result = dict(samples[0], **memory, cache=args.cache, **r.layers, positions=r.positions,
                      ranks=r.tp.world if r.tp else 1,
                      device=str(device), compile_s=r.compile_s,
                      dtype=str(r.dtype).removeprefix("torch."), max_seq_length=r.max_seq_length)
        if args.num_samples > 1:
            result["samples"] = samples
        print(json.dumps(result))
    else:
        print(f"cache {memory['cache_bytes'] / 2**20:.1f} MiB, peak memory "
              f"{memory['peak_memory_bytes'] / 2**20:.0f} MiB", file=sys.stderr)


if __name__ == "__main__":
    run(main)
