#!/bin/sh
# Every target on machine E (Intel Xeon, family 6 model 207, AVX-512 + AMX; PERFORMANCE 6zp), one
# run at a time, the files in this folder: 4, 5 and 1, 3 as on machine D (s63/run.sh), then
# target 1 for every policy at 4k, the INT8 middle, and target 2 against transformers. OUT and
# CONTEXTS as machine B's 6zq ran it (zen4/s67/run.sh): its folder, and 4096 alone.
cd "$(dirname "$0")/../../../.." || exit 1
out=${OUT:-docs/perf/machine-e/s66}
OUT=$out sh docs/perf/machine-d/s63/run.sh
all=streaming,quantized,h2o,tova,a2sf,weightedkv,weightedkv-evict,cam,lagkv,knorm,keydiff
for ctx in ${CONTEXTS:-4096 1024}; do
  for dt in bfloat16 float32; do
    python scripts/interleaved_overhead.py $ctx $all $dt > $out/interleaved-$ctx-$dt-all.txt 2>&1
  done
done
python scripts/interleaved_overhead.py 4096 streaming,weightedkv,weightedkv+int8,h2o,h2o+int8 \
  bfloat16 > $out/interleaved-4096-bfloat16-int8.txt 2>&1
for dt in bfloat16 float32; do
  python bench.py --dtype $dt --contexts 4096 --cache full --new_tokens 8 --repeats 2 \
    --compile on --peer transformers --json \
    > $out/prefill-peer-$dt.json 2> $out/prefill-peer-$dt.log
done
# target 2's second half: every policy's first token at 4k in bfloat16 (AMX prompts)
python bench.py --dtype bfloat16 --contexts 4096 --cache full,$all --cache_size 256 \
  --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on \
  --compile_prefill --json > $out/ttft-4k-bfloat16.json 2> $out/ttft-4k-bfloat16.log
# Reruns after slow stretches (6zp), by hand: interleaved_overhead.py 4096 streaming,knorm,cam
# float32 (-again.txt) and streaming,weightedkv,h2o,keydiff float32 (-again2.txt); the bench.py
# line above with --cache full,quantized,h2o,cam,lagkv,knorm,keydiff (ttft-4k-bfloat16-again).
# The 1k rows of the loop above ran after the rest, then again at 1k: streaming,a2sf,weightedkv,cam
# bfloat16 and streaming,weightedkv-evict,lagkv,keydiff float32 (interleaved-1024-*-again.txt).
