#!/bin/sh
# Machine C (Intel Xeon, KVM family 6 model 167, AVX-512 + AMX; PERFORMANCE 6zza), one run at a
# time: 6zz's bench.py rows, one-shot prompts whose observation window's queries the compiled
# prompt graph writes (no second read), against the code before (a worktree of 928942c at
# $BEFORE), taking turns; files in this folder. The profiles: docs/perf/xeon/s78/oneshot_profile.py
# POLICY bfloat16 4096 8 (probe-*.txt).
cd "$(dirname "$0")/../../../.." || exit 1
OUT=docs/perf/xeon/s80 BEFORE=${BEFORE:-/tmp/wt-before} sh docs/perf/xeon/s78/run.sh
