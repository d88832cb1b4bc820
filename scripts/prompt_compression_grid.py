"""Perplexity after a long prompt, by how the prompt was compressed (RESULTS, "One-shot prompt
compression"): the first --prompt_tokens of each corpus are read as one prompt (chunked, bulk or
snapkv), the rest is scored token by token. Appends one JSON row per run to --out and skips runs
already there (resumable).

    python scripts/prompt_compression_grid.py --policies weightedkv,h2o --modes chunked,snapkv
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policies", default="weightedkv,h2o,tova,knorm,lagkv")
    p.add_argument("--modes", default="chunked,snapkv")
    p.add_argument("--corpora", default="wiki,kjv")
    p.add_argument("--cache_size", type=int, default=256)
    p.add_argument("--max_tokens", type=int, default=4000)
    p.add_argument("--prompt_tokens", type=int, default=2048)
    p.add_argument("--out", default=str(ROOT / "docs/results/prompt_compression.jsonl"))
    args = p.parse_args()
    out = Path(args.out)
    done = set()
    if out.exists():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            done.add((r["cache"], r["prompt_compression"], r["corpus"], r["cache_size"],
                      r["max_tokens"], r["prompt_tokens"]))
    runs = [("full", None, c) for c in args.corpora.split(",")]
    runs += [(pol, mode, c) for pol in args.policies.split(",") for mode in args.modes.split(",")
             for c in args.corpora.split(",")]
    for policy, mode, corpus in runs:
        size = None if policy == "full" else args.cache_size
        key = (policy, mode, corpus, size, args.max_tokens, args.prompt_tokens)
        if key in done:
            continue
        cmd = [sys.executable, str(ROOT / "eval.py"), "ppl", "--corpus", corpus, "--max_tokens",
               str(args.max_tokens), "--prompt_tokens", str(args.prompt_tokens), "--cache",
               policy, "--compile", "--json"]
        if policy != "full":
            cmd += ["--cache_size", str(size), "--prompt_compression", mode]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if res.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed: {res.stderr.strip()}")
        row = json.loads(res.stdout.strip().splitlines()[-1])
        row.update(cache_size=size, max_tokens=args.max_tokens)
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{policy} {mode} {corpus}: ppl {row['ppl']:.3f}", flush=True)


if __name__ == "__main__":
    main()
