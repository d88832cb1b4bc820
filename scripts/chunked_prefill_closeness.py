"""How close is chunked prefill to token-by-token prefill for a compressing cache?

    python scripts/chunked_prefill_closeness.py [--cache weightedkv] [--cache_size 64] [--tokens 320]
        [--prompt_compression chunked,bulk]

Feeds the same real prompt (King James Bible excerpt from tests/data) through prefill chunks of
several sizes, each chunk compressed token by token (chunked) or in one pass (bulk), and
through the decode step one token at a time (chunk 1), then compares the next-token
distribution and 32 greedy tokens.
"""
import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from caches import make_cache_factory  # noqa: E402
from engine.loading.checkpoint import load_model  # noqa: E402
from engine.loading.default_model import default_checkpoint  # noqa: E402
from engine.runtime.generation import Generator  # noqa: E402
from engine.loading.tokenizer import load_tokenizer  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cache", default="weightedkv")
    p.add_argument("--cache_size", type=int, default=64)
    p.add_argument("--tokens", type=int, default=320)
    p.add_argument("--prompt_compression", default="chunked",
                   help="comma-separated: chunked, bulk")
    args = p.parse_args()
    ckpt = default_checkpoint()
    model, tok = load_model(ckpt), load_tokenizer(ckpt)
    ids = tok.encode((ROOT / "tests/data/kjv_genesis_1_2.txt").read_text())[: args.tokens]
    results = {}
    runs = [("token", 1)] + [(mode, chunk) for mode in args.prompt_compression.split(",")
                             for chunk in (8, 32, 64, 128)]
    for mode, chunk in runs:
        gen = Generator(model, 1024, make_cache=make_cache_factory(
            args.cache, cache_size=args.cache_size, chunk=chunk,
            prompt_compression="chunked" if mode == "token" else mode))
        with torch.inference_mode():
            gen.reset()
            gen.append(ids)  # the last token's logits after the chunked prompt
            logits = gen.logits[0]
        greedy = gen.generate(ids, 32).new_ids[0]
        results[mode, chunk] = (torch.log_softmax(logits, -1), greedy)
    ref_logp, ref_greedy = results["token", 1]
    print(f"{args.cache}, cache_size {args.cache_size}, prompt {len(ids)} tokens; "
          f"reference: token-by-token")
    print("| compression | chunk | KL(token-by-token ‖ chunked) next token | max |Δ log p| | "
          "greedy tokens equal (of 32) |")
    print("|---|---|---|---|---|")
    for (mode, chunk), (logp, greedy) in results.items():
        kl = torch.sum(ref_logp.exp() * (ref_logp - logp)).item()
        same = sum(a == b for a, b in zip(greedy, ref_greedy))
        prefix = next((i for i, (a, b) in enumerate(zip(greedy, ref_greedy)) if a != b), 32)
        print(f"| {mode} | {chunk} | {kl:.2e} | {(logp - ref_logp).abs().max().item():.3f} | "
              f"{same} (identical prefix {prefix}) |")


if __name__ == "__main__":
    main()
