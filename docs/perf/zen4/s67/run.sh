#!/bin/sh
# Every target on machine B (AMD EPYC family 25 model 17, Zen 4, AVX-512 without AMX; PERFORMANCE
# 6zq), one run at a time, the files in this folder: the GEMV's prefetch from C++ (both hints,
# two rounds) and in the step, then machine E's runs at 4k (machine-e/s66/run.sh: 4, 5 and 1, 3
# as on D, target 1 for every policy, the INT8 middle, and target 2).
cd "$(dirname "$0")/../../../.." || exit 1
out=docs/perf/zen4/s67
src=docs/perf/machine-d/s65/gemv_ceiling.cpp
g++ -O3 -fopenmp $src -o /tmp/gemv-t0-nta
g++ -O3 -fopenmp -DHINT2=_MM_HINT_T0 $src -o /tmp/gemv-t0-t0
g++ -O3 -fopenmp -DHINT=_MM_HINT_NTA $src -o /tmp/gemv-nta-nta
{
  echo "# machine B (AMD EPYC family 25 model 17, Zen 4, AVX-512 without AMX; 2 vCPUs), 6zq"
  echo "# g++ -O3 -fopenmp [-DHINT=_MM_HINT_NTA | -DHINT2=_MM_HINT_T0] $src"
  for round in 1 2; do
    /tmp/gemv-t0-nta stream
    for k in f32x4 f32 bf16; do /tmp/gemv-t0-nta $k; /tmp/gemv-t0-t0 $k; done
    for k in b512x4 b512; do /tmp/gemv-t0-nta $k; /tmp/gemv-nta-nta $k; done
  done
} > $out/gemv-ceiling.txt 2>&1
# the step with each hint: 750f5c9 prefetched NTA on every CPU, this code T0 on AVX-512 ones
rm -rf /tmp/s67/base && mkdir -p /tmp/s67/base && git archive 750f5c9 | tar -x -C /tmp/s67/base
BASE=/tmp/s67/base BEFORE=nta AFTER=t0 sh docs/perf/machine-d/s64/ab_hint.sh full float32 1024 \
  150 3 > $out/ab-full-1k-f32.txt 2>&1
OUT=$out CONTEXTS=4096 sh docs/perf/machine-e/s66/run.sh
# This stop (6zq) stopped the run after s63/run.sh's 4k rows and changed the AVX-512 BF16 GEMV;
# after it, by hand: s63's bfloat16 lines again (the *-one* files, then -one-again),
# the eleven at 4k in bfloat16 (-all.txt) and streaming,cam,lagkv,knorm,keydiff again (-again.txt),
# s66/run.sh's INT8 and prefill-peer lines, and the bfloat16 one with --compile_prefill
# (prefill-peer-bfloat16-compiled.json), then the float32 sweep. The first-token line was not run.
