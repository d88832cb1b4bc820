#!/usr/bin/env bash
# Target 2 on machine C after INT8 prompt chunks read through a widened copy and fused SDPA
# (PERFORMANCE.md, section 6zh): `quantized` read chunk by chunk at a 4k prompt, against
# `full`, both dtypes, compiled prompts and eager ones. Resumable: a file that exists is kept.
# Run from the repository root, idle. SUFFIX names a rerun.
set -euo pipefail
out=docs/perf/xeon/s58
SUFFIX=${SUFFIX:-}
run() {  # NAME ARGS...: python bench.py ARGS --json > NAME.json
  local name=$1; shift
  [ -s "$out/$name.json" ] && { echo "== $name: kept" >&2; return; }
  echo "== $name: python bench.py $* --json ($(date +%T))" >&2
  python bench.py "$@" --json > "$out/$name.json.tmp" && mv "$out/$name.json.tmp" "$out/$name.json"
}
for d in bfloat16 float32; do
  run ttft-4k-$d-quantized$SUFFIX --dtype $d --contexts 4096 --cache full,quantized --cache_size 256 --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on --compile_prefill
  run ttft-4k-$d-quantized-eager-chunks$SUFFIX --dtype $d --contexts 4096 --cache quantized --cache_size 256 --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on
done
