#!/bin/bash
# Probe (PERFORMANCE 6w): each thread's perf samples split into the generated kernels (*.main.so,
# and the vector math they call: Sleef),
# OpenMP's runtime (libgomp: a thread waiting at a barrier or for work) and the rest (the host:
# Python, Dynamo's guards, the compiled graph's wrapper, allocations, sampling).
#   perf record -e cpu-clock -F 2000 -p PID -o F -- sleep 8   (PID: single_session.py, after READY)
#   docs/perf/zen3/s47/thread_split.sh F
perf script -i "$1" -F tid,ip,sym,dso -G 2>/dev/null | awk '
  { k = ($NF ~ /gomp/) ? "gomp" : (($NF ~ /main\.so/ || $0 ~ /Sleef_/) ? "kernels" : "host"); n[$1, k]++; t[$1]++ }
  END { for (key in n) { split(key, a, SUBSEP);
        printf "thread %s %-8s %6d samples %5.1f%%\n", a[1], a[2], n[key], 100 * n[key] / t[a[1]] } }' | sort
