#!/bin/sh
# Probe (PERFORMANCE 6zn): two builds of kernels/decode.cpp in turns, a process each. BASE: a copy
# of the tree at the earlier commit (git archive REV | tar -x -C BASE), built in its own
# TORCH_EXTENSIONS_DIR (BASE-ext); the other, this tree.
#   BASE=/tmp/base sh docs/perf/machine-d/s64/ab_hint.sh POLICY DTYPE CTX STEPS ROUNDS
# Each line is labelled by its build: T0 (BASE) and NTA (this tree) as in 6zn, or the labels in
# BEFORE and AFTER (PERFORMANCE 6zo: before, after).
BASE=${BASE:-/tmp/s64/base}
HERE=$(cd "$(dirname "$0")/../../../.." && pwd)
for i in $(seq 1 "$5"); do
  (cd "$BASE" && TORCH_EXTENSIONS_DIR="$BASE-ext" PYTHONPATH=. python \
    docs/perf/zen3/s46/single_session.py "$1" "$2" "$3" "$4" 2>/dev/null | grep ms/step |
    sed "s/^/${BEFORE:-T0} $1 /")
  (cd "$HERE" && PYTHONPATH=. python docs/perf/zen3/s46/single_session.py "$1" "$2" "$3" "$4" \
    2>/dev/null | grep ms/step | sed "s/^/${AFTER:-NTA} $1 /")
done
