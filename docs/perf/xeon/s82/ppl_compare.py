"""Issue 14's closing witness: each ppl cell of docs/perf/xeon/s82/ppl/results.jsonl (the grid at
budget 256, rerun at the closing code) against the cell of docs/results/results.jsonl with the
same sweep key (engine.sweep.key_id: checkpoint, dtype, tokens read, policy, options, size).

    python docs/perf/xeon/s82/ppl_compare.py
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
from engine.sweep import key_id  # noqa: E402


def cells(path):
    """{key_id: row} of a results file's ppl cells (read only: no repair of a torn last line)."""
    rows = (json.loads(line) for line in open(path) if line.strip())
    return {key_id(r["key"]): r for r in rows if r.get("key", {}).get("kind") == "ppl"}


old = cells(ROOT / "docs/results/results.jsonl")
new = cells(Path(__file__).parent / "ppl/results.jsonl")
print(f"{'policy':<24}{'size':>6} {'corpus':<6}{'RESULTS':>10}{'now':>10}{'change':>10}")
worst = 0.0
for k, r in new.items():
    o = old.get(k)
    d = None if o is None else r["ppl"] / o["ppl"] - 1
    worst = worst if d is None else max(worst, abs(d))
    print(f"{r['label']:<24}{str(r['cache_size']):>6} {r['corpus']:<6}"
          f"{o['ppl'] if o else float('nan'):>10.4f}{r['ppl']:>10.4f}"
          f"{'-' if d is None else format(d, '+.4%'):>10}")
print(f"largest change: {worst:.4%}")
