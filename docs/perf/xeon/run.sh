#!/usr/bin/env bash
# Issue 14's targets on machine C (Intel Xeon, AVX-512 with AMX), the bench.py rows of
# scripts/performance_targets.sh that the section names, one JSON file each in this folder.
# Resumable: a row whose file exists is skipped. Run from the repository root on an idle machine.
set -euo pipefail
out=docs/perf/xeon
ALL=streaming,h2o,tova,a2sf,weightedkv,weightedkv-evict,cam,lagkv,knorm,keydiff,quantized
run() {
  local name=$1; shift
  [ -s "$out/$name.json" ] && { echo "== $name: kept" >&2; return; }
  echo "== $name: python bench.py $* --json ($(date +%T))" >&2
  python bench.py "$@" --json > "$out/$name.json.tmp" && mv "$out/$name.json.tmp" "$out/$name.json"
}
for step in "${@:-all}"; do case $step in
  full|all)  # 4: full at 1k against the bandwidth probe
    run full-1k-f32 --contexts 1024 --cache full --new_tokens 32 --repeats 3 --compile on
    run full-1k-bf16 --dtype bfloat16 --contexts 1024 --cache full --new_tokens 32 --repeats 3 --compile on ;;&
  peer|all)  # 5: llama.cpp, same weights and threads
    run peer-llamacpp-f32 --contexts 256,1024 --new_tokens 32 --compile on --peer llama.cpp
    run peer-llamacpp-bf16 --dtype bfloat16 --contexts 256,1024 --new_tokens 32 --compile on --peer llama.cpp ;;&
  f32|all)  # 1, 3: every policy against streaming and full
    run targets-f32 --contexts 1024,4096 --cache full,$ALL --cache_size 256 --new_tokens 24 --repeats 2 --compile on ;;&
  bf16|all)
    run targets-bf16 --dtype bfloat16 --contexts 1024,4096 --cache full,$ALL --cache_size 256 --new_tokens 24 --repeats 2 --compile on ;;&
  int8|all)  # 3: an INT8 middle against the same policy without
    run targets-int8-middle --contexts 1024,4096 --cache h2o,weightedkv --kv_middle int8 --cache_size 256 --new_tokens 24 --repeats 2 --compile on ;;&
  prefill|all)  # 2: full's first token at 4k against transformers; every policy's with bulk
    run targets-prefill-peer --contexts 4096 --cache full --new_tokens 8 --repeats 2 --compile on --peer transformers
    run targets-bulk-4k --contexts 4096 --cache $ALL --cache_size 256 --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on ;;&
  *) ;;
esac; done
# After the words in int32 tensors (section 6x): target 3 again, each pair in one run or back to back
for step in "${@:-all}"; do case $step in
  int32|all)
    run quantized-4k-f32 --contexts 4096 --cache full,quantized --cache_size 256 --new_tokens 16 --repeats 2 --compile on
    run quantized-4k-bf16 --dtype bfloat16 --contexts 4096 --cache full,quantized --cache_size 256 --new_tokens 16 --repeats 2 --compile on
    run int8-middle-without --contexts 1024,4096 --cache h2o,weightedkv --cache_size 256 --new_tokens 24 --repeats 2 --compile on
    run int8-middle-with --contexts 1024,4096 --cache h2o,weightedkv --kv_middle int8 --cache_size 256 --new_tokens 24 --repeats 2 --compile on ;;
  *) ;;
esac; done
# Target 2 in bfloat16: bulk compression and compiled prompts (section 6x)
for step in "${@:-all}"; do case $step in
  ttft-bf16|all)
    run ttft-bf16-4k --dtype bfloat16 --contexts 4096 --cache full,streaming,h2o,weightedkv,keydiff --cache_size 256 --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on --compile_prefill ;;
  *) ;;
esac; done
# Section 6y: bfloat16 linears on oneDNN in compiled steps (AMX), and prompts' pieces compiled
for step in "${@:-all}"; do case $step in
  amx|all)
    run full-1k-bf16-amx --dtype bfloat16 --contexts 1024 --cache full --new_tokens 32 --repeats 3 --compile on
    run targets-bf16-amx --dtype bfloat16 --contexts 1024,4096 --cache full,$ALL --cache_size 256 --new_tokens 24 --repeats 2 --compile on ;;&
  pieces|all)
    run ttft-bf16-4k-pieces --dtype bfloat16 --contexts 4096 --cache full,streaming,h2o,weightedkv,keydiff --cache_size 256 --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on --compile_prefill
    run ttft-f32-4k-pieces --contexts 4096 --cache full,streaming,h2o,weightedkv,keydiff --cache_size 256 --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on --compile_prefill ;;&
  chunked|all)  # the default prompt path (chunks of 32, exact), compiled prompts
    run ttft-bf16-4k-chunked --dtype bfloat16 --contexts 4096 --cache full,streaming,h2o,weightedkv,keydiff,cam --cache_size 256 --new_tokens 8 --repeats 2 --compile on --compile_prefill ;;&
  runs|all)  # 6z: weightedkv's merge by runs, exact bfloat16 scores (before: the code of 6y)
    run ttft-bf16-4k-runs-after-1 --dtype bfloat16 --contexts 4096 --cache full,h2o,weightedkv --cache_size 256 --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 3 --compile on --compile_prefill
    run ttft-f32-4k-runs --contexts 4096 --cache full,h2o,weightedkv --cache_size 256 --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on --compile_prefill
    run ttft-bf16-4k-chunked-runs --dtype bfloat16 --contexts 4096 --cache full,h2o,weightedkv --cache_size 256 --new_tokens 8 --repeats 2 --compile on --compile_prefill ;;
  *) ;;
esac; done
