#!/bin/sh
# Every target on machine C (Intel Xeon, KVM family 6 model 167, AVX-512 + AMX; PERFORMANCE 6zx),
# one run at a time, the files in this folder: machine E's runs at 4k (machine-e/s66/run.sh:
# targets 4 and 5, 1 and 3, target 1 for every policy, the INT8 middle, target 2), then
# `quantized`'s first token at 4k in float32. OUT and CONTEXTS as machine E's script takes them
# (PERFORMANCE 8: OUT=docs/perf/xeon/s82 CONTEXTS="4096 1024", from xeon/s82/run.sh).
cd "$(dirname "$0")/../../../.." || exit 1
out=${OUT:-docs/perf/xeon/s76}
OUT=$out CONTEXTS=${CONTEXTS:-4096} sh docs/perf/machine-e/s66/run.sh
python bench.py --dtype float32 --contexts 4096 --cache full,quantized --cache_size 256 \
  --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on \
  --compile_prefill --json > $out/ttft-4k-float32-quantized.json 2> $out/ttft-4k-float32-quantized.log
