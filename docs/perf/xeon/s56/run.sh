#!/usr/bin/env bash
# Issue 14's targets on machine C at one code, in one sweep (PERFORMANCE.md, section 6zf): the
# bench.py rows and interleaved probes whose figures the section's table gives, one file each
# in this folder. Resumable: a file that exists is kept. Run from the repository root, idle.
set -euo pipefail
out=docs/perf/xeon/s56
ALL=streaming,h2o,tova,a2sf,weightedkv,weightedkv-evict,cam,lagkv,knorm,keydiff,quantized
run() {  # NAME ARGS...: python bench.py ARGS --json > NAME.json
  local name=$1; shift
  [ -s "$out/$name.json" ] && { echo "== $name: kept" >&2; return; }
  echo "== $name: python bench.py $* --json ($(date +%T))" >&2
  python bench.py "$@" --json > "$out/$name.json.tmp" && mv "$out/$name.json.tmp" "$out/$name.json"
}
probe() {  # NAME SCRIPT ARGS...: python SCRIPT ARGS > NAME.txt
  local name=$1; shift
  [ -s "$out/$name.txt" ] && { echo "== $name: kept" >&2; return; }
  echo "== $name: python $* ($(date +%T))" >&2
  python "$@" > "$out/$name.txt.tmp" && mv "$out/$name.txt.tmp" "$out/$name.txt"
}
for d in float32 bfloat16; do  # 4: full at 1k against the bandwidth probe
  run full-1k-$d --dtype $d --contexts 1024 --cache full --new_tokens 32 --repeats 3 --compile on
done
for d in float32 bfloat16; do  # 5: llama.cpp, the same weights and threads
  run peer-llamacpp-$d --dtype $d --contexts 256,1024 --new_tokens 32 --compile on --peer llama.cpp
done
# 2: full's first token at 4k against transformers; every policy's, bulk, compiled prompts
run prefill-peer-float32 --contexts 4096 --cache full --new_tokens 8 --repeats 2 --compile on --peer transformers
for d in float32 bfloat16; do
  run ttft-4k-$d --dtype $d --contexts 4096 --cache full,$ALL --cache_size 256 --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on --compile_prefill
done
for d in float32 bfloat16; do  # 1, 3: every policy against streaming and full, interleaved
  for c in 1024 4096; do
    probe interleaved-$c-$d scripts/interleaved_overhead.py $c full,$ALL $d
  done
done
# 2 again: CaM's bulk pass before (the commit before 67f102d) and after, back to back
run ttft-4k-bfloat16-cam-after --dtype bfloat16 --contexts 4096 --cache full,h2o,cam,weightedkv --cache_size 256 --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 3 --compile on --compile_prefill
# 2: quantized's route, the prompt read in one shot, against full's first token read as it is
for d in float32 bfloat16; do
  run full-4k-ttft-$d --dtype $d --contexts 4096 --cache full --new_tokens 8 --repeats 2 --compile on
  run quantized-snapkv-4k-$d --dtype $d --contexts 4096 --cache quantized --cache_size 256 --prompt_compression snapkv --new_tokens 8 --repeats 2 --compile on
done
