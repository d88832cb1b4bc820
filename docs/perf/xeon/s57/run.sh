#!/usr/bin/env bash
# Target 2 on machine C after CaM's bulk pass by ranks (PERFORMANCE.md, section 6zg): every
# policy's first token at a 4k prompt, bulk, compiled prompts, both dtypes, as 6zf ran it.
# Resumable: a file that exists is kept. Run from the repository root, idle.
set -euo pipefail
out=docs/perf/xeon/s57
SUFFIX=${SUFFIX:-}  # -malloc: the rerun after the CLI kept big temporaries (6zg)
ALL=streaming,h2o,tova,a2sf,weightedkv,weightedkv-evict,cam,lagkv,knorm,keydiff,quantized
run() {  # NAME ARGS...: python bench.py ARGS --json > NAME.json
  local name=$1; shift
  [ -s "$out/$name.json" ] && { echo "== $name: kept" >&2; return; }
  echo "== $name: python bench.py $* --json ($(date +%T))" >&2
  python bench.py "$@" --json > "$out/$name.json.tmp" && mv "$out/$name.json.tmp" "$out/$name.json"
}
for d in bfloat16 float32; do
  run ttft-4k-$d$SUFFIX --dtype $d --contexts 4096 --cache full,$ALL --cache_size 256 --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on --compile_prefill
done
probe() {  # NAME SCRIPT ARGS...: python SCRIPT ARGS > NAME.txt
  local name=$1; shift
  [ -s "$out/$name.txt" ] && { echo "== $name: kept" >&2; return; }
  echo "== $name: python $* ($(date +%T))" >&2
  python "$@" > "$out/$name.txt.tmp" && mv "$out/$name.txt.tmp" "$out/$name.txt"
}
if [ -n "$SUFFIX" ]; then  # the rerun: full against transformers; decode, to see it unchanged
  run prefill-peer-float32$SUFFIX --contexts 4096 --cache full --new_tokens 8 --repeats 2 --compile on --peer transformers
  for d in bfloat16 float32; do
    probe interleaved-4096-$d$SUFFIX scripts/interleaved_overhead.py 4096 full,streaming,h2o,weightedkv,cam,quantized $d
  done
fi
