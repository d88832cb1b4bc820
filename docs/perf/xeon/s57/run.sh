#!/usr/bin/env bash
# Target 2 on machine C after CaM's bulk pass by ranks (PERFORMANCE.md, section 6zg): every
# policy's first token at a 4k prompt, bulk, compiled prompts, both dtypes, as 6zf ran it.
# Resumable: a file that exists is kept. Run from the repository root, idle.
set -euo pipefail
out=docs/perf/xeon/s57
ALL=streaming,h2o,tova,a2sf,weightedkv,weightedkv-evict,cam,lagkv,knorm,keydiff,quantized
run() {  # NAME ARGS...: python bench.py ARGS --json > NAME.json
  local name=$1; shift
  [ -s "$out/$name.json" ] && { echo "== $name: kept" >&2; return; }
  echo "== $name: python bench.py $* --json ($(date +%T))" >&2
  python bench.py "$@" --json > "$out/$name.json.tmp" && mv "$out/$name.json.tmp" "$out/$name.json"
}
for d in bfloat16 float32; do
  run ttft-4k-$d --dtype $d --contexts 4096 --cache full,$ALL --cache_size 256 --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on --compile_prefill
done
