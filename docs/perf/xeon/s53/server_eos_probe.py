"""Probe (PERFORMANCE 6zc): how often a sampled completion of "Tell a long story" ends on its
own within 6 tokens on the default model's server (the hang-up test streamed it, and a stream
that ends itself is not counted "cancelled"):

    python docs/perf/xeon/s53/server_eos_probe.py N
"""
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests"))
from test_server import CACHE, MODEL, Server  # noqa: E402

server = Server(*CACHE, "--slots", "4", "--queue", "4")
try:
    client, got = server.client(), Counter()
    for _ in range(int(sys.argv[1])):
        r = client.completions.create(model=MODEL, prompt="Tell a long story", max_tokens=6)
        got[(r.choices[0].finish_reason, r.usage.completion_tokens)] += 1
    print(got)  # (finish_reason, completion tokens): count
finally:
    server.close()
