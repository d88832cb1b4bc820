#!/bin/sh
# Every target on machine A (AMD EPYC family 25 model 1, Zen 3, AVX2 only; PERFORMANCE 6zw), one
# run at a time, the files in this folder: the step's GEMVs from C++ (the AVX2 loops, both
# prefetch hints, two rounds), then machine E's runs at 4k (machine-e/s66/run.sh: targets 4 and
# 5, 1 and 3, target 1 for every policy, the INT8 middle, target 2), then `quantized`'s first
# token at 4k in float32.
cd "$(dirname "$0")/../../../.." || exit 1
out=docs/perf/zen3/s75
src=docs/perf/machine-d/s65/gemv_ceiling.cpp
g++ -O3 -fopenmp $src -o /tmp/gemv-nta
g++ -O3 -fopenmp -DHINT2=_MM_HINT_T0 $src -o /tmp/gemv-t0
{
  echo "# machine A (AMD EPYC family 25 model 1, Zen 3, AVX2 only; 2 vCPUs), 6zw"
  echo "# g++ -O3 -fopenmp [-DHINT2=_MM_HINT_T0] $src"
  for round in 1 2; do
    /tmp/gemv-nta stream
    for k in f32x4 f32 bf16x4 bf16; do /tmp/gemv-nta $k; /tmp/gemv-t0 $k; done
  done
} > $out/gemv-ceiling.txt 2>&1
OUT=$out CONTEXTS=4096 sh docs/perf/machine-e/s66/run.sh
python bench.py --dtype float32 --contexts 4096 --cache full,quantized --cache_size 256 \
  --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on \
  --compile_prefill --json > $out/ttft-4k-float32-quantized.json 2> $out/ttft-4k-float32-quantized.log
