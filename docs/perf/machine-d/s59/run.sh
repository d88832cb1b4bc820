#!/usr/bin/env bash
# Issue 14's targets on machine D (QEMU's generic "AMD EPYC": family 23 model 1, AVX2 only), in
# one sweep (PERFORMANCE.md, section 6zi): the bench.py rows and interleaved probes whose figures
# the section's table gives, one file each in this folder, in the order of what D adds (the
# AVX2 bfloat16 step first). Resumable: a file that exists is kept. Run from the root, idle.
set -euo pipefail
out=docs/perf/machine-d/s59
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
for d in bfloat16 float32; do  # 4: full at 1k against the bandwidth probe
  run full-1k-$d --dtype $d --contexts 1024 --cache full --new_tokens 32 --repeats 3 --compile on
done
for d in bfloat16 float32; do  # 1, 3: every policy against streaming and full, interleaved
  for c in 4096 1024; do
    probe interleaved-$c-$d scripts/interleaved_overhead.py $c full,$ALL $d
  done
done
# 5 (llama.cpp) is left out: llama-cpp-python compiles llama.cpp for ~45 minutes on 2 cores.
# 2: full's first token at 4k against transformers; every policy's, bulk, compiled prompts
run prefill-peer-float32 --contexts 4096 --cache full --new_tokens 8 --repeats 2 --compile on --peer transformers
for d in bfloat16 float32; do
  run ttft-4k-$d --dtype $d --contexts 4096 --cache full,$ALL --cache_size 256 --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on --compile_prefill
done
