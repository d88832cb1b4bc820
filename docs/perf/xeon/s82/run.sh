#!/bin/sh
# Issue 14's closing sweep on machine C (Intel Xeon, KVM family 6 model 167, AVX-512 + AMX;
# PERFORMANCE 8), one run at a time, the files in this folder: machine E's sweep (targets 4 and 5,
# 1 and 3, target 1 for every policy at 4k and 1k, the INT8 middle, target 2), then `quantized`'s
# first token at 4k in float32 and every one-shot first token in bfloat16.
cd "$(dirname "$0")/../../../.." || exit 1
out=docs/perf/xeon/s82
OUT=$out CONTEXTS="4096 1024" sh docs/perf/machine-e/s66/run.sh
python bench.py --dtype float32 --contexts 4096 --cache full,quantized --cache_size 256 \
  --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on \
  --compile_prefill --json > $out/ttft-4k-float32-quantized.json 2> $out/ttft-4k-float32-quantized.log
python bench.py --dtype bfloat16 --contexts 4096 --cache full,quantized,streaming,h2o,weightedkv,knorm \
  --cache_size 256 --prompt_compression snapkv --new_tokens 8 --repeats 3 --compile on \
  --compile_prefill --json > $out/oneshot-4k-bfloat16.json 2> $out/oneshot-4k-bfloat16.log
