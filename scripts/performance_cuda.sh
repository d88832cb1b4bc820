#!/usr/bin/env bash
# The CUDA measurements behind docs/PERFORMANCE.md section 7, one JSON file each (bfloat16,
# batch 1, CUDA-graph decode). PART: default (the default model, against transformers), 8b
# (Llama-3-8B shapes, random weights: scripts/random_checkpoint.py) or all.
#     scripts/performance_cuda.sh [OUT_DIR [PART]]
# A failing row is logged and the next one runs: a GPU lease is short. LIKE=CKPT takes the
# random model's tokenizer from CKPT where the default model is not installed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/perf/cuda}
part=${2:-all}
mkdir -p "$out" checkpoints
run() {
  local name=$1; shift
  echo "== $name: python bench.py $*" >&2
  python bench.py "$@" --device cuda --dtype bfloat16 --json > "$out/$name.json" \
    || { echo "== $name FAILED" >&2; rm -f "$out/$name.json"; }
}
policies=streaming,h2o,tova,a2sf,cam,weightedkv,weightedkv-evict,lagkv,quantized
if [ "$part" = default ] || [ "$part" = all ]; then
  run cuda-default --contexts 256,1024,4096 --new_tokens 64 --compile both --peer transformers
  run cuda-default-policies-4k --contexts 4096 --cache full,streaming,weightedkv --cache_size 256 --new_tokens 64 --compile on
  run cuda-default-policies-1k --contexts 1024 --cache "$policies" --cache_size 256 --new_tokens 64 --compile on
fi
if [ "$part" = 8b ] || [ "$part" = all ]; then
  ckpt=checkpoints/llama-3-8b-random
  [ -d $ckpt ] || python scripts/random_checkpoint.py llama-3-8b $ckpt --dtype bfloat16 --device cuda ${LIKE:+--like "$LIKE"}
  run cuda-llama3-8b --checkpoint_path $ckpt --contexts 1024,4096 --new_tokens 64 --compile both --peer transformers
  run cuda-llama3-8b-policies-4k --checkpoint_path $ckpt --contexts 4096 --cache full,streaming,weightedkv --cache_size 256 --new_tokens 64 --compile on
fi
