"""Serve the OpenAI API: python serve.py [--cache POLICY --cache_size N] [--slots 4] [--port 8000].

Without --checkpoint_path it serves the embedded default model. Every stream runs in constant
memory under a compressing --cache; --slots streams decode together (continuous batching), up to
--queue more wait, and the rest get 429. Try it:

    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
      -d '{"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Hi"}]}'
"""
from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from core.errors import UserError
from engine.cli import (CHECKPOINT_HELP, DTYPES, Parser, add_bake_argument, add_cache_arguments,
                        add_compile_arguments, cache_factory_from_args, cache_slots,
                        check_bake_argument,
                        check_run_fits, list_caches, open_checkpoint, positive_int,
                        resolve_positions, round_up, run, seed_int, size_cache_from_mib)


def non_negative_int(text: str) -> int:
    return 0 if text.strip() == "0" else positive_int(text)


def build_parser() -> Parser:
    from engine.runtime.batcher import DEFAULT_PREFILL_TOKENS
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint_path", default=None, help=CHECKPOINT_HELP)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=positive_int, default=8000)
    p.add_argument("--model_name", default=None,
                   help="the model's id in the API (default: the checkpoint directory's name)")
    p.add_argument("--slots", type=positive_int, default=4,
                   help="streams decoded together (rows of the one decode batch)")
    p.add_argument("--queue", type=non_negative_int, default=16,
                   help="requests that may wait for a slot; beyond them the server answers 429")
    p.add_argument("--parked", type=non_negative_int, default=None,
                   help="finished conversations kept beyond the slots, so that their next turn "
                        "reads only what it adds (preallocated rows; default: --slots)")
    p.add_argument("--prefill_tokens", type=positive_int, default=DEFAULT_PREFILL_TOKENS,
                   help="the full cache reads a prompt in pieces of this many tokens")
    p.add_argument("--default_max_tokens", type=positive_int, default=256,
                   help="a chat request's max_tokens when it sets none")
    add_compile_arguments(p)
    add_bake_argument(p)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available)")
    p.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="default: bfloat16 on CUDA, float32 on CPU")
    add_cache_arguments(p)
    p.add_argument("--max_seq_length", type=positive_int, default=None,
                   help="positions a stream may reach (default: the model's context; a "
                        "compressing cache with rank positions needs only its own size)")
    p.add_argument("--seed", type=seed_int, default=None, help="seed of CaM's random draws")
    return p


def stream_length(args, context: int) -> int:
    """Positions a stream may reach: the model's context (full cache, original positions), or
    the cache's own slots when keys rotate by rank (unbounded streams)."""
    if args.cache != "full" and args.positions == "cache":
        if cache_slots(args) > context:
            raise UserError(f"--cache_size {args.cache_size} exceeds the model's context of "
                            f"{context}: rank positions must stay inside it")
        return args.max_seq_length or min(round_up(cache_slots(args)), context)
    length = args.max_seq_length or context
    if length > context:
        raise UserError(f"--max_seq_length {length} exceeds the model's context of {context} "
                        f"tokens; use at most {context}")
    return length


def check_port(host: str, port: int) -> None:
    """Refuse an address that cannot be bound before spending time loading the model."""
    import socket
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise UserError(f"cannot listen on {host}:{port} ({e.strerror or e}); pick another "
                        f"--port or --host") from None


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if args.list_caches:
        print(list_caches())
        return
    check_bake_argument(args)
    cache_factory_from_args(args, seed=args.seed or 0)  # bad cache flags fail before loading
    check_port(args.host, args.port)
    import uvicorn

    from engine.runtime.batcher import Batcher
    from engine.loading.checkpoint import load_model
    from engine.serving.server import create_app

    device, dtype, ckpt, cfg, tokenizer = open_checkpoint(args)
    context = cfg["model"]["max_position_embeddings"]
    size_cache_from_mib(args, cfg, dtype)
    # Streams have no known length: a compressing cache rotates keys by rank (unbounded).
    positions = resolve_positions(args, None, context)
    make_cache = cache_factory_from_args(args, seed=args.seed or 0)
    max_seq_length = stream_length(args, context)
    parked = args.slots if args.parked is None else args.parked
    # the rows, the parked rows and the scratch row (engine/runtime/batcher.py)
    check_run_fits(ckpt, cfg, dtype, device, args.slots + parked + 1, max_seq_length, make_cache)
    model = load_model(ckpt, device=device, dtype=dtype)
    batcher = Batcher(model, make_cache, args.slots, max_seq_length, args.queue, parked,
                      args.prefill_tokens, "inductor" if args.compile else None,
                      args.compile_prefill, args.bake_weights)
    name = args.model_name or Path(ckpt).name
    print(f"loaded {ckpt} ({device}, {str(dtype).removeprefix('torch.')}, cache {args.cache}, "
          f"positions {positions}, {args.slots} slots, {parked} parked, cache "
          f"{batcher.cache_bytes / 2**20:.1f} MiB)", file=sys.stderr)
    if args.compile or args.compile_prefill:
        print("compiling...", file=sys.stderr)
    print(f"warmed up in {batcher.warmup():.1f} s", file=sys.stderr)
    app = create_app(batcher, tokenizer, name, args.default_max_tokens)
    # The HTTP server runs in a thread; the decode loop keeps the main thread (faster there).
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port,
                                           log_level="warning", timeout_graceful_shutdown=2))
    http = threading.Thread(target=server.run, name="http", daemon=True)
    http.start()
    print(f"serving {name!r} on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: batcher.stop_soon())
    try:
        batcher.run()  # until SIGTERM or Ctrl-C
    finally:
        server.should_exit = True
        http.join(5)


if __name__ == "__main__":
    run(main)
