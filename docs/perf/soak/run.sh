#!/bin/sh
# The soak table in docs/PERFORMANCE.md: sh docs/perf/soak/run.sh [OUT]. Resumes: a result
# that exists is kept.
cd "$(dirname "$0")/../../.."
OUT=${1:-docs/perf/soak}
P="The history of the kingdom began long ago, when the first settlers came over the mountains."
soak() {  # name, soak flags..., -- generate/serve flags...
  name=$1; shift
  [ -s "$OUT/$name.json" ] && return
  python scripts/soak.py --plot "$OUT/$name.png" "$@" > "$OUT/$name.tmp" && mv "$OUT/$name.tmp" "$OUT/$name.json"
}
for i in 1 2 3; do
  soak weightedkv-9k-$i generate --tokens 9000 -- --cache weightedkv --cache_size 256 \
    --temperature 0.7 --seed 1 --compile --prompt "$P"
done
soak serve-weightedkv serve --requests 500 --streams 4 --max_tokens 32 -- --cache weightedkv \
  --cache_size 256 --compile
soak interactive-200 interactive --turns 200 -- --cache weightedkv --cache_size 256 \
  --max_new_tokens 16 --temperature 0.7 --seed 1 --compile
soak weightedkv-int8-20k generate --tokens 20000 -- --cache weightedkv --kv_middle int8 \
  --cache_size 256 --temperature 0.7 --seed 1 --compile --prompt "$P"
for c in streaming h2o tova a2sf weightedkv-evict cam lagkv knorm keydiff quantized weightedkv; do
  soak $c-20k generate --tokens 20000 -- --cache $c --cache_size 256 --temperature 0.7 \
    --seed 1 --compile --prompt "$P"
done
