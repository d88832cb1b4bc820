"""Benchmark the server under concurrent streams: python bench_serve.py [serve.py flags] [--json].

Starts serve.py with the flags it does not know itself (or measures a running server with
--url), then for each --concurrency C runs C clients, each sending --requests streaming
completions one after another, and reports: throughput (completion tokens/s over all streams),
time to first token (TTFT), time per output token after the first (TPOT, per request) and the
gap between streamed chunks (ITL), as p50/p99.

    python bench_serve.py --cache weightedkv --cache_size 512 --slots 4 --compile
    python bench_serve.py --url http://127.0.0.1:8000 --concurrency 1,4 --json
    python bench_serve.py --cache weightedkv --compile --compile_prefill --text_file data/corpora/wiki.txt
"""
from __future__ import annotations

import http.client
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

from engine.cli import Parser, comma_list, positive_int, run
from core.errors import UserError

ROOT = Path(__file__).resolve().parent
PROMPTS = ["The history of the printing press", "A guide to growing tomatoes:",
           "Once upon a time, in a village by the sea,", "The three laws of motion are",
           "Dear friend, I am writing to tell you", "The recipe calls for flour, sugar and",
           "In the beginning of the twentieth century", "Here is a short poem about rain:"]


def build_parser() -> Parser:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="a running server (default: start serve.py)")
    p.add_argument("--concurrency", type=comma_list(positive_int, "positive integers"),
                   default=[1, 2, 4], help="comma-separated concurrent streams")
    p.add_argument("--requests", type=positive_int, default=4,
                   help="requests each client sends, one after another")
    p.add_argument("--max_tokens", type=positive_int, default=64)
    p.add_argument("--text_file", default=None,
                   help="long prompts: request i reads the i-th --prompt_chars characters of this "
                        "text (no two share a prefix; default: eight short prompts)")
    p.add_argument("--prompt_chars", type=positive_int, default=4000)
    p.add_argument("--startup_timeout", type=positive_int, default=600,
                   help="seconds to wait for the server (compiling included)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def percentile(values: list, q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


class Client:
    def __init__(self, url: str):
        u = urlparse(url)
        self.host, self.port = u.hostname, u.port or 80

    def get(self, path: str):
        c = http.client.HTTPConnection(self.host, self.port, timeout=10)
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode()

    def stream(self, body: dict) -> dict:
        """One streaming completion: timings of every content chunk and the usage."""
        c = http.client.HTTPConnection(self.host, self.port, timeout=600)
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return {"status": r.status}
        arrivals, usage = [], None
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if obj.get("usage"):
                usage = obj["usage"]
            if obj.get("choices") and obj["choices"][0]["text"]:
                arrivals.append(time.perf_counter() - t0)
        c.close()
        return {"status": 200, "arrivals": arrivals,
                "tokens": usage["completion_tokens"] if usage else len(arrivals)}


def text_prompts(path: str, chars: int) -> list:
    """Consecutive pieces of `chars` characters of a text file."""
    if not Path(path).is_file():
        raise UserError(f"--text_file {path!r} does not exist; give a text file")
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    if len(text) < chars:
        raise UserError(f"--text_file {path!r} has {len(text)} characters, fewer than "
                        f"--prompt_chars {chars}; give a longer text or fewer characters")
    return [text[i:i + chars] for i in range(0, len(text) - chars + 1, chars)]


def measure(client: Client, model: str, concurrency: int, requests: int, max_tokens: int,
            prompts: list = PROMPTS) -> dict:
    results, lock = [], threading.Lock()

    def worker(w):
        for i in range(requests):
            prompt = prompts[(w * requests + i) % len(prompts)]
            out = client.stream({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                 "temperature": 0, "stream": True,
                                 "stream_options": {"include_usage": True}})
            with lock:
                results.append(out)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in results if r["status"] == 200 and r["arrivals"]]
    ttft = [r["arrivals"][0] for r in ok]
    tpot = [(r["arrivals"][-1] - r["arrivals"][0]) / (r["tokens"] - 1) for r in ok
            if r["tokens"] > 1]
    itl = [b - a for r in ok for a, b in zip(r["arrivals"], r["arrivals"][1:])]
    tokens = sum(r["tokens"] for r in ok)
    ms = lambda v: round(v * 1000, 1)  # noqa: E731
    return {"concurrency": concurrency, "requests": len(results), "failed": len(results) - len(ok),
            "completion_tokens": tokens, "wall_s": round(wall, 2),
            "throughput_tok_s": round(tokens / wall, 2),
            "ttft_ms_p50": ms(percentile(ttft, 50)), "ttft_ms_p99": ms(percentile(ttft, 99)),
            "tpot_ms_p50": ms(percentile(tpot, 50)), "tpot_ms_p99": ms(percentile(tpot, 99)),
            "itl_ms_p50": ms(percentile(itl, 50)), "itl_ms_p99": ms(percentile(itl, 99))}


def start_server(serve_args: list, timeout: int):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(ROOT / "serve.py"), "--port", str(port),
                             *serve_args], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    client = Client(f"http://127.0.0.1:{port}")
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise UserError(f"serve.py exited: {proc.stderr.read().strip().splitlines()[-1]}")
        try:
            if client.get("/health")[0] == 200:
                return proc, client
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise UserError(f"serve.py did not answer within {timeout} s; raise --startup_timeout")


def main(argv=None) -> None:
    args, serve_args = build_parser().parse_known_args(argv)
    prompts = text_prompts(args.text_file, args.prompt_chars) if args.text_file else PROMPTS
    from bench import machine_info
    proc = None
    if args.url:
        client = Client(args.url)
    else:
        proc, client = start_server(serve_args, args.startup_timeout)
    try:
        status, body = client.get("/v1/models")
        if status != 200:
            raise UserError(f"{args.url or 'serve.py'} answered {status} to GET /v1/models")
        model = json.loads(body)["data"][0]["id"]
        health = json.loads(client.get("/health")[1])
        measure(client, model, 1, 1, 4, prompts)  # warm up the server's first-request paths
        rows = [measure(client, model, c, args.requests, args.max_tokens, prompts)
                for c in args.concurrency]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    import torch
    info = dict(machine_info(torch.device("cpu")), model=model, slots=health["slots"],
                serve_args=serve_args, max_tokens=args.max_tokens, requests=args.requests,
                text_file=args.text_file, prompt_chars=args.prompt_chars if args.text_file else None)
    if args.json:
        print(json.dumps({"machine": info, "results": rows}))
        return
    print(f"{model}, {health['slots']} slots, serve.py {' '.join(serve_args)}; "
          f"{info.get('cpu', '?')}", file=sys.stderr)
    head = ("streams", "tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "ITL p50",
            "ITL p99", "failed")
    print("  ".join(f"{h:>9}" for h in head))
    for r in rows:
        print("  ".join(f"{v:>9}" for v in (
            r["concurrency"], r["throughput_tok_s"], r["ttft_ms_p50"], r["ttft_ms_p99"],
            r["tpot_ms_p50"], r["tpot_ms_p99"], r["itl_ms_p50"], r["itl_ms_p99"], r["failed"])))
    print("(ms; TPOT: time per output token after the first, per request; ITL: gap between "
          "streamed chunks)", file=sys.stderr)
    if statistics.mean(r["failed"] for r in rows):
        print("note: some requests failed (429: raise serve.py --queue)", file=sys.stderr)


if __name__ == "__main__":
    run(main)
