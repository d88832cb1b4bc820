#!/bin/sh
# The step's GEMVs from C++ (gemv_ceiling.cpp: the AVX2 loops, four rows and one, each prefetch
# hint, two rounds) into OUT/gemv-ceiling.txt, headed by LABEL (the machine; PERFORMANCE 6zr,
# 6zw).   sh docs/perf/machine-d/s65/gemv_rounds.sh OUT LABEL
cd "$(dirname "$0")/../../../.." || exit 1
src=docs/perf/machine-d/s65/gemv_ceiling.cpp
g++ -O3 -fopenmp $src -o /tmp/gemv-nta
g++ -O3 -fopenmp -DHINT2=_MM_HINT_T0 $src -o /tmp/gemv-t0
{
  echo "# $2"
  echo "# g++ -O3 -fopenmp [-DHINT2=_MM_HINT_T0] $src"
  for round in 1 2; do
    /tmp/gemv-nta stream
    for k in f32x4 f32 bf16x4 bf16; do /tmp/gemv-nta $k; /tmp/gemv-t0 $k; done
  done
} > "$1/gemv-ceiling.txt" 2>&1
