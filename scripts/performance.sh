#!/usr/bin/env bash
# The measurements behind docs/PERFORMANCE.md, one JSON file each under docs/perf/.
# Run on an otherwise idle machine: decode is memory-bound, anything else running shares the bus.
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/perf
mkdir -p "$out" checkpoints
[ -d checkpoints/smollm2-int8 ] || python quantize.py --mode int8 --out checkpoints/smollm2-int8
[ -d checkpoints/smollm2-int4-g32 ] || python quantize.py --mode int4 --groupsize 32 --out checkpoints/smollm2-int4-g32
run() { local name=$1; shift; echo "== $name: python bench.py $*" >&2; python bench.py "$@" --json > "$out/$name.json"; }
# float32 full cache at three contexts, compiled and eager, against transformers
run float32 --contexts 256,1024,4096 --new_tokens 32 --compile both --peer transformers
# bfloat16, and weight-only int8 / int4 (groups of 32), full cache at 1k
run bfloat16 --dtype bfloat16 --contexts 1024 --new_tokens 32 --compile both --peer transformers
run int8 --checkpoint_path checkpoints/smollm2-int8 --contexts 1024 --new_tokens 32 --compile both
run int4 --checkpoint_path checkpoints/smollm2-int4-g32 --contexts 1024 --new_tokens 32 --compile both
run int8-bf16 --checkpoint_path checkpoints/smollm2-int8 --dtype bfloat16 --contexts 1024 --new_tokens 32 --compile on
run int4-bf16 --checkpoint_path checkpoints/smollm2-int4-g32 --dtype bfloat16 --contexts 1024 --new_tokens 32 --compile on
# compressing caches at a 4k context against full; every policy's bookkeeping at 1k
run policies-4k --contexts 4096 --cache full,streaming,weightedkv --cache_size 256 --new_tokens 32 --compile on
run policies-1k --contexts 1024 --cache streaming,h2o,tova,a2sf,cam,weightedkv,weightedkv-evict,lagkv,quantized --cache_size 256 --new_tokens 32 --compile on
