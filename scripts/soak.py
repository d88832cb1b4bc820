"""Soak a long-running path and report whether its resident memory stays flat.

    python scripts/soak.py generate --tokens 20000 -- --cache weightedkv --compile
    python scripts/soak.py interactive --turns 200 -- --cache weightedkv --max_new_tokens 32
    python scripts/soak.py session --loops 200 -- --cache h2o
    python scripts/soak.py serve --requests 500 --streams 4 -- --cache weightedkv --compile

The flags after `--` are generate.py's (serve.py's for `serve`). Each path runs in one process
whose own resident memory (VmRSS: its compiler's worker processes are not counted) is sampled
as the work goes: by the tokens generated (`generate`, `interactive`, `session`) or the tokens
the server reports it generated (`serve`, sampled after each request). Prints one JSON object:
the samples, the RSS a quarter of the way through and at the end, their difference in percent,
and the least-squares slope of RSS over the last three quarters in KB per 1,000 tokens (the
first quarter is warm-up: the allocator settles). `--plot FILE` draws RSS against tokens.

  generate     one generation of --tokens tokens that never stops at EOS
  interactive  a chat of --turns turns in one session (the --interactive path, without a
               terminal); each turn generates up to --max_new_tokens
  session      --loops times: append a line, generate --max_new_tokens, save the session and
               load it back as a new session that goes on
  serve        serve.py started on a free loopback port, --streams clients sending --requests
               streaming completions in all: of every three, one reads to the end, one stops
               reading after a few chunks and closes (a cancelled stream), one hangs up before
               the answer starts. At the end every slot must be free.
"""
from __future__ import annotations

import http.client
import json
import socket
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.errors import UserError  # noqa: E402
from engine.cli import Parser, positive_int, run  # noqa: E402

LINES = ["Tell me about the history of the printing press.", "And what came after it?",
         "Write a short poem about rain.", "Name three rivers in Europe.",
         "Why is the sky blue?", "Summarize what we said so far."]


def rss_bytes(pid: str = "self") -> int:
    """The resident memory of one process (children excluded), from /proc."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise UserError("/proc has no VmRSS for the process: the soak needs Linux")


class Samples:
    """(tokens done, RSS bytes) pairs, one every `every` tokens."""

    def __init__(self, every: int, pid: str = "self"):
        self.every, self.pid, self.points, self.tokens = every, pid, [], 0
        self.extra: dict = {}  # what a path reports beside the samples

    def add(self, n: int = 1) -> None:
        before, self.tokens = self.tokens, self.tokens + n
        if before // self.every != self.tokens // self.every:
            self.take()

    def take(self) -> None:
        self.points.append((self.tokens, rss_bytes(self.pid)))


def summary(points: list) -> dict:
    """RSS a quarter of the way and at the end, and the slope over the last three quarters."""
    if len(points) < 4:
        raise UserError(f"only {len(points)} samples: run longer or sample more often (--every)")
    end_tokens = points[-1][0]
    quarter = min(points, key=lambda p: abs(p[0] - end_tokens / 4))
    tail = [p for p in points if p[0] >= quarter[0]]
    n = len(tail)
    mx = sum(t for t, _ in tail) / n
    my = sum(r for _, r in tail) / n
    var = sum((t - mx) ** 2 for t, _ in tail)
    slope = sum((t - mx) * (r - my) for t, r in tail) / var if var else 0.0
    mib = lambda b: round(b / 2**20, 1)  # noqa: E731
    return {"tokens": end_tokens, "rss_quarter_mib": mib(quarter[1]),
            "rss_end_mib": mib(points[-1][1]),
            "growth_pct": round(100 * (points[-1][1] - quarter[1]) / quarter[1], 2),
            "slope_kb_per_1k_tokens": round(slope * 1000 / 1024, 1)}


def generate_path(opts, rest: list, samples: Samples) -> None:
    import generate
    args = generate.build_parser().parse_args(rest)
    args.max_new_tokens, args.json = opts.tokens, True
    r = generate.start(args)
    samples.take()
    # no EOS ids: the generation runs its whole length
    r.gen.generate(r.prompt, opts.tokens, args.temperature, args.top_k,
                   callback=lambda _: samples.add())
    samples.take()  # while the path's state is alive


def interactive_path(opts, rest: list, samples: Samples) -> None:
    import generate
    from engine.runtime.chat import Chat
    args = generate.build_parser().parse_args(rest)
    args.interactive, args.json = True, True
    r = generate.start(args)
    chat = Chat(r.gen, r.tokenizer, args.system)
    samples.take()
    for i in range(opts.turns):
        chat.turn(LINES[i % len(LINES)], args.max_new_tokens, args.temperature, args.top_k,
                  callback=lambda _: samples.add())
    samples.take()


def session_path(opts, rest: list, samples: Samples) -> None:
    import generate
    from engine.runtime.generation import Session
    args = generate.build_parser().parse_args(rest)
    args.interactive, args.json = True, True
    r = generate.start(args)
    session, tok = r.gen, r.tokenizer
    kwargs = {"compile": args.compile, "compile_prefill": args.compile_prefill,
              "bake_weights": args.bake_weights}
    samples.take()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "soak.session"
        for i in range(opts.loops):
            line = tok.encode(" " + LINES[i % len(LINES)], bos=False)
            session.append(line)
            samples.add(len(line))
            g = session.generate(args.max_new_tokens, args.temperature, args.top_k)
            samples.add(g.new_tokens)
            session.save(path)
            session = Session.load(path, session.model, **kwargs)
        samples.take()


def serve_path(opts, rest: list, samples: Samples) -> None:
    from bench_serve import start_server
    proc, client = start_server(rest, opts.startup_timeout)
    samples.pid = str(proc.pid)
    url = f"http://{client.host}:{client.port}"
    model = json.loads(client.get("/v1/models")[1])["data"][0]["id"]
    lock = threading.Lock()
    ends = {"finished": 0, "cancelled": 0, "hung_up": 0, "failed": 0}

    def generated() -> int:
        text = client.get("/metrics")[1]
        return int(next(line.split()[1] for line in text.splitlines()
                        if line.startswith("regionkv_generated_tokens_total ")))

    def one(i: int) -> str:
        c = http.client.HTTPConnection(client.host, client.port, timeout=600)
        body = {"model": model, "prompt": LINES[i % len(LINES)], "max_tokens": opts.max_tokens,
                "temperature": 0.8, "stream": True}
        c.request("POST", "/v1/completions", json.dumps(body),
                  {"Content-Type": "application/json"})
        if i % 3 == 2:  # hang up before the answer: a reset, not a close
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            c.close()
            return "hung_up"
        r = c.getresponse()
        if r.status != 200:
            print(f"request {i}: HTTP {r.status} {r.read()[:200]!r}", file=sys.stderr)
            c.close()
            return "failed"
        chunks = 0
        for line in r:
            chunks += line.startswith(b"data: ")
            if i % 3 == 1 and chunks == 3:
                c.close()
                return "cancelled"
        c.close()
        return "finished"

    def worker(w: int) -> None:
        for i in range(w, opts.requests, opts.streams):
            end = one(i)
            with lock:
                ends[end] += 1
                samples.tokens = generated()
                samples.take()

    try:
        samples.take()
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(opts.streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        metrics = wait_idle(client)
    finally:
        proc.terminate()
        proc.wait(30)
    samples.extra = {"ends": ends, "active_slots_at_end": metrics, "url": url}


def wait_idle(client, seconds: float = 30.0) -> int:
    """The server's active slots once the last hang-up has been noticed (0 when recycled)."""
    import time
    deadline = time.time() + seconds
    while True:
        text = client.get("/metrics")[1]
        active = int(next(line.split()[1] for line in text.splitlines()
                          if line.startswith("regionkv_active_slots ")))
        if active == 0 or time.time() > deadline:
            return active
        time.sleep(0.2)


PATHS = {"generate": generate_path, "interactive": interactive_path, "session": session_path,
         "serve": serve_path}


def build_parser() -> Parser:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("path", choices=sorted(PATHS))
    p.add_argument("--tokens", type=positive_int, default=20000, help="generate: tokens")
    p.add_argument("--turns", type=positive_int, default=200, help="interactive: turns")
    p.add_argument("--loops", type=positive_int, default=200, help="session: save/load loops")
    p.add_argument("--requests", type=positive_int, default=500, help="serve: requests in all")
    p.add_argument("--streams", type=positive_int, default=4, help="serve: concurrent clients")
    p.add_argument("--max_tokens", type=positive_int, default=64, help="serve: tokens a request")
    p.add_argument("--startup_timeout", type=positive_int, default=600)
    p.add_argument("--every", type=positive_int, default=None,
                   help="sample every N tokens (default: 1/100 of generate's tokens, else 100)")
    p.add_argument("--plot", default=None, metavar="FILE", help="draw RSS against tokens (PNG)")
    return p


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    opts = build_parser().parse_args(argv[:cut])
    rest = argv[cut + 1:]
    every = opts.every or (max(1, opts.tokens // 100) if opts.path == "generate" else 100)
    samples = Samples(every)
    PATHS[opts.path](opts, rest, samples)
    result = {"path": opts.path, "args": rest, **summary(samples.points), **samples.extra,
              "samples": [[t, round(r / 2**20, 1)] for t, r in samples.points]}
    print(json.dumps(result), flush=True)  # before the plot: a long run's figures come first
    if opts.plot:
        plot(samples.points, opts.plot, f"{opts.path} {' '.join(rest)}")


def plot(points: list, path: str, title: str) -> None:
    from engine.evaluation.plots import plt, save
    fig, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
    ax.plot([t for t, _ in points], [r / 2**20 for _, r in points], lw=1.2)
    ax.set_xlabel("tokens")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    save(fig, path)


if __name__ == "__main__":
    run(main)
