"""Issue 14's closing witness: each ppl cell of docs/perf/xeon/s82/ppl/results.jsonl (the grid at
budget 256, rerun at the closing code) against the same cell of docs/results/results.jsonl.

    python docs/perf/xeon/s82/ppl_compare.py
"""
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]


def cells(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        k = r.get("key", {})
        if k.get("kind") == "ppl":
            out[(r["label"], r["cache_size"], r["corpus"])] = r
    return out


old = cells(ROOT / "docs/results/results.jsonl")
new = cells(Path(__file__).parent / "ppl/results.jsonl")
print(f"{'policy':<24}{'size':>6} {'corpus':<6}{'RESULTS':>10}{'now':>10}{'change':>10}")
worst = 0.0
for key, r in new.items():
    o = old.get(key)
    if o is None:
        print(f"{key[0]:<24}{str(key[1]):>6} {key[2]:<6}{'-':>10}{r['ppl']:>10.4f}")
        continue
    d = r["ppl"] / o["ppl"] - 1
    worst = max(worst, abs(d))
    print(f"{key[0]:<24}{str(key[1]):>6} {key[2]:<6}{o['ppl']:>10.4f}{r['ppl']:>10.4f}{d:>+10.4%}")
print(f"largest change: {worst:.4%}")
