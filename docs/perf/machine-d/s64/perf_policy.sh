#!/bin/sh
# Probe (PERFORMANCE 6zn): perf's samples of one session's compiled decode step, 10 s after its
# warm-up (docs/perf/zen3/s46/single_session.py), by symbol (OUT.txt) and by thread and library
# (OUT-dso.txt).   sh docs/perf/machine-d/s64/perf_policy.sh POLICY[+int8] DTYPE CONTEXT OUT [STEPS]
# STEPS (100000 unless given) sizes the session: `full`'s cache holds them all, so give it a few
# hundred (PERFORMANCE 6zo), or its attention reads far past CONTEXT.
cd "$(dirname "$0")/../../../.." || exit 1
PYTHONPATH=. python docs/perf/zen3/s46/single_session.py "$1" "$2" "$3" "${5:-100000}" \
  > "$4.log" 2>&1 &
PID=$!
for i in $(seq 1 600); do grep -q READY "$4.log" 2>/dev/null && break; sleep 1; done
perf record -e cpu-clock -F 2000 -p "$PID" -o "$4.data" -- sleep 10 > /dev/null 2>&1
kill "$PID"
perf report -i "$4.data" --no-children -g none --sort dso,sym 2>/dev/null | grep -v "^#" |
  grep -v "^$" | head -40 > "$4.txt"
perf report -i "$4.data" --no-children -g none --sort pid,dso 2>/dev/null | grep -v "^#" |
  grep -v "^$" | head -20 > "$4-dso.txt"
