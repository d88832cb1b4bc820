"""First token per policy, and its ratio to `full`'s in the same run, from bench.py JSON files.

    python docs/perf/xeon/s80/ttft_table.py FILE.json...
"""
import json
import sys

for path in sys.argv[1:]:
    rows = json.load(open(path))["rows"]
    full = next(r["ttft_s"] for r in rows if r["policy"] == "full")
    cells = [f"{r['policy']} {r['ttft_s']:.3f} ({r['ttft_s'] / full:.2f}x)" for r in rows]
    print(path.rsplit("/", 1)[-1] + ": " + ", ".join(cells))
