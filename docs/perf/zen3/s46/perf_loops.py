"""Probe (PERFORMANCE 6v): `perf annotate` output of an Inductor kernel, summed by loop.

    perf record -e cpu-clock -F 2000 -p PID -o perf.data -- sleep 40
    perf annotate -i perf.data --stdio -s kernel._omp_fn.0 --dsos HASH.main.so > ann.txt
    python docs/perf/zen3/s46/perf_loops.py ann.txt [SCALE [ROWS]]

Each instruction's share goes to the innermost loop (a backward jump's range) that holds it;
a loop is printed with its share (times SCALE, e.g. the .so's share of all samples) and a
signature: its compare constants (trip counts: 576 and 1536 are the model's GEMVs) and the
telling instructions (shifts: INT8 words; vdivss: the softmax's division).
"""
import re
import sys

rows = []
for line in open(sys.argv[1]):
    m = re.match(r"\s+([0-9.]+)\s*:\s+([0-9a-f]+):\s+(.*)", line)
    if m:
        rows.append((int(m.group(2), 16), float(m.group(1)), m.group(3).strip()))
rows.sort()
loops = [(int(j.group(1), 16), a) for a, _, ins in rows
         if (j := re.match(r"j\w+\s+([0-9a-f]+)", ins)) and int(j.group(1), 16) < a]


def innermost(a):
    inside = [(t, e) for t, e in loops if t <= a <= e]
    return min(inside, key=lambda l: l[1] - l[0]) if inside else None


share, sig = {}, {}
for a, p, ins in rows:
    loop = innermost(a)
    share[loop] = share.get(loop, 0) + p
    s = sig.setdefault(loop, set())
    s.update(k for k in ("vpsllvd", "vpsravd", "vdivss", "vmulss", "vcvtdq2ps", "vpmovsxbd")
             if k in ins)
    if c := re.search(r"cmp\s+\$0x([0-9a-f]+)", ins):
        s.add(f"cmp{int(c.group(1), 16)}")
scale = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
for loop, p in sorted(share.items(), key=lambda kv: -kv[1])[:int(sys.argv[3]) if len(sys.argv) > 3 else 25]:
    where = "%x-%x" % loop if loop else "none"
    print(f"{p * scale:7.2f}  {where:>12}  {sorted(sig[loop])}")
