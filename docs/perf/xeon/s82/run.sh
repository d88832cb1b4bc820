#!/bin/sh
# Issue 14's closing sweep on machine C (Intel Xeon, KVM family 6 model 167, AVX-512 + AMX;
# PERFORMANCE 8), one run at a time, the files in this folder: 6zx's sweep (xeon/s76/run.sh:
# machine E's at 4k and 1k, then `quantized`'s float32 first token at 4k), then the one-shot
# first tokens in bfloat16 (6zz's bench.py line, once).
cd "$(dirname "$0")/../../../.." || exit 1
out=docs/perf/xeon/s82
OUT=$out CONTEXTS="4096 1024" sh docs/perf/xeon/s76/run.sh
python bench.py --dtype bfloat16 --contexts 4096 --cache full,quantized,streaming,h2o,weightedkv,knorm \
  --cache_size 256 --prompt_compression snapkv --new_tokens 8 --repeats 3 --compile on \
  --compile_prefill --json > $out/oneshot-4k-bfloat16.json 2> $out/oneshot-4k-bfloat16.log
