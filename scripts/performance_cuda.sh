#!/usr/bin/env bash
# The CUDA measurements behind docs/PERFORMANCE.md's GPU tables, one JSON file each (bfloat16,
# CUDA-graph decode). PART: default (the default model, against transformers),
# policies (one file per policy at 1k and 4k, or the slice that POLICIES and CONTEXTS name;
# prompts compress in bulk, since token by token takes 30,000 uncaptured calls for a 1k prompt
# on CUDA), 8b (Llama-3-8B shapes, random weights: scripts/random_checkpoint.py), attention
# (scripts/attention_probe.py on the 8B's shapes, its part 2 on that random checkpoint), pays
# (where compression must pay: long contexts, batches and equal memory, below) or all.
#     scripts/performance_cuda.sh [OUT_DIR [PART]]
# A GPU lease is short: every row runs in its own process under ROW_LIMIT seconds (default
# 600), a failing row is logged and the next one runs, and a row whose file exists is kept, so
# a second call resumes where the first stopped. MODEL=CKPT measures CKPT instead of
# the default model: on a GPU machine without it, a random checkpoint of its shapes
# (`scripts/random_checkpoint.py CONFIG_DIR CKPT --like CONFIG_DIR`, where CONFIG_DIR holds its
# config.json and tokenizer.json). LIKE=CKPT takes the random 8B model's tokenizer
# from CKPT. PROMPTS=compiled reads the policies' prompts in the default exact order instead of
# in bulk, each chunk a compiled graph with its token steps after it (--compile_prefill).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/perf/cuda}
part=${2:-all}
limit=${ROW_LIMIT:-600}
model=(); [ -n "${MODEL:-}" ] && model=(--checkpoint_path "$MODEL")
mkdir -p "$out" checkpoints
run() {
  local name=$1; shift
  [ -s "$out/$name.json" ] && { echo "== $name: kept" >&2; return; }
  echo "== $name: python bench.py $*" >&2
  timeout "$limit" python bench.py "$@" --device cuda --dtype bfloat16 --json > "$out/$name.json" \
    || { echo "== $name FAILED ($?)" >&2; rm -f "$out/$name.json"; }
}
ckpt=checkpoints/llama-3-8b-random
random_8b() {  # Llama-3-8B's shapes with random weights, made once
  [ -d $ckpt ] || python scripts/random_checkpoint.py llama-3-8b $ckpt --dtype bfloat16 --device cuda ${LIKE:+--like "$LIKE"}
}
if [ "$part" = default ] || [ "$part" = all ]; then
  run cuda-default "${model[@]}" --contexts 256,1024,4096 --new_tokens 64 --compile both --peer transformers
fi
if [ "$part" = policies ] || [ "$part" = all ]; then
  # On an H100 a row compiles for about a minute from cold, and bench.py adds a
  # streaming row to every policy's process as its baseline. full and streaming go first, so
  # the later processes find streaming's kernels in Inductor's on-disk caches. A lease fits a
  # slice of the table: POLICIES and CONTEXTS choose it (policies joined by commas share one
  # process and one streaming row, e.g. POLICIES="h2o,tova,a2sf cam"). BASELINE= (empty) skips
  # the first row, for a second call on a machine whose caches are warm.
  policies=${POLICIES:-weightedkv h2o tova a2sf cam weightedkv-evict lagkv knorm keydiff quantized}
  prompts=(--prompt_compression bulk); [ "${PROMPTS:-bulk}" = compiled ] && prompts=(--compile_prefill)
  for ctx in ${CONTEXTS:-1024 4096}; do
    for p in ${BASELINE-full,streaming} $policies; do
      # bench.py refuses prompt options for `full` alone (POLICIES=full)
      opts=("${prompts[@]}"); [ "$p" = full ] && opts=()
      run "cuda-policy-${p//,/-}-$ctx" "${model[@]}" --contexts $ctx --cache $p --cache_size 256 \
        --new_tokens 64 --repeats 2 --compile on "${opts[@]}"
    done
  done
fi
if [ "$part" = attention ]; then  # decode attention four ways, then the 8B's step
  random_8b
  contexts=${CONTEXTS:-1024 4096}
  timeout "$limit" python scripts/attention_probe.py --device cuda --model $ckpt --contexts "${contexts// /,}" \
    | tee "$out/attention.txt"
fi
if [ "$part" = 8b ] || [ "$part" = all ]; then
  random_8b
  run cuda-llama3-8b --checkpoint_path $ckpt --contexts 1024,4096 --new_tokens 64 --compile both --peer transformers
  run cuda-llama3-8b-policies-4k --checkpoint_path $ckpt --contexts 4096 --cache full,streaming,weightedkv --cache_size 256 --new_tokens 64 --compile on
fi
if [ "$part" = pays ]; then
  # Llama-3.1-8B's shapes (128k positions) at 32k and 16k, batch 8 and 1, budgets 2048 and
  # 1024, then equal memory, then the default model's shapes, then the server: in the order of
  # the targets, so that a 15-minute lease measures the first rows and the next call the rest.
  # A batch's rows share one prompt, read once (--read_once); the 8B's prompts are read whole
  # and compressed once (snapkv: one pass, where chunks of 32 make a 32k prompt a thousand
  # passes); streaming joins every process as the baseline; kernels_per_step is in every row.
  long=checkpoints/llama-3.1-8b-random
  [ -d $long ] || python scripts/random_checkpoint.py llama-3.1-8b $long --dtype bfloat16 --device cuda ${LIKE:+--like "$LIKE"}
  l8=(--checkpoint_path $long --new_tokens 32 --repeats 2 --compile on --prompt_compression snapkv)
  run pays-8b-32k-b8-2048 "${l8[@]}" --contexts 32768 --batch_size 8 --read_once --cache full,weightedkv --cache_size 2048
  # 48 GiB of cache beside 16 GiB of weights on an 80 GB card: full holds 12 streams at 32k
  run pays-8b-32k-mem48 "${l8[@]}" --contexts 32768 --memory_gib 48 --cache full,weightedkv --kv_middle int8 --cache_size 2048
  for group in quantized,h2o,lagkv cam,keydiff,weightedkv-evict tova,a2sf,knorm; do
    run "pays-8b-32k-b8-2048-${group//,/-}" "${l8[@]}" --contexts 32768 --batch_size 8 --read_once --cache $group --cache_size 2048
  done
  run pays-8b-32k-b1-2048 "${l8[@]}" --contexts 32768 --cache full,weightedkv --cache_size 2048
  for ctx in 16384 4096; do
    run pays-8b-$((ctx / 1024))k-1024 "${l8[@]}" --contexts $ctx --batch_size 1,8 --read_once --cache full,weightedkv --cache_size 1024
  done
  run pays-8b-16k-mem48 "${l8[@]}" --contexts 16384 --memory_gib 48 --cache full,weightedkv,quantized --kv_middle int8 --cache_size 2048
  # The default model's shapes: bound by kernel launches, not bytes
  run pays-default-4k "${model[@]}" --contexts 4096 --batch_size 1,8 --read_once --new_tokens 64 --repeats 2 --compile on --prompt_compression bulk --cache full,weightedkv,lagkv,quantized,h2o,cam,keydiff --cache_size 256
  run pays-default-4k-mem4 "${model[@]}" --contexts 4096 --memory_gib 4 --new_tokens 64 --repeats 2 --compile on --prompt_compression bulk --cache full,weightedkv --kv_middle int8 --cache_size 256
  # The server's batch, one CUDA graph over its slots
  for c in 1 8 32; do
    [ -s "$out/pays-serve-$c.json" ] && continue
    timeout "$limit" python bench_serve.py "${model[@]}" --device cuda --cache weightedkv --cache_size 256 --slots $c --compile --concurrency $c --requests 4 --max_tokens 64 --json > "$out/pays-serve-$c.json" \
      || { echo "== pays-serve-$c FAILED ($?)" >&2; rm -f "$out/pays-serve-$c.json"; }
  done
fi
