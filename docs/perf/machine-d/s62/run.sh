#!/bin/sh
# s62's measurements on machine D, one at a time (docs/PERFORMANCE.md, 6zl).
cd "$(dirname "$0")/../../../.." || exit 1
out=docs/perf/machine-d/s62
# target 2: quantized's first token at 4k
for dt in bfloat16 float32; do
  python bench.py --dtype $dt --contexts 4096 --cache full,quantized --cache_size 256 \
    --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on \
    --compile_prefill --json > $out/ttft-4k-$dt-quantized.json 2> $out/ttft-4k-$dt-quantized.log
done
# a free middle slot and the victim by mins, against argmax / argmin
python scripts/decode_ab.py quantized 4096 bfloat16 argmin \
  > $out/decode-ab-quantized-4k-bf16-argmin.txt 2>&1
sh $out/run3.sh  # target 5
# targets 1 and 3 at this code (after the suite)
python scripts/interleaved_overhead.py 4096 full,streaming,weightedkv,quantized bfloat16 \
  > $out/interleaved-4096-bfloat16.txt 2>&1
python scripts/interleaved_overhead.py 4096 \
  full,streaming,h2o,tova,a2sf,weightedkv,weightedkv-evict,cam,lagkv,knorm,keydiff bfloat16 \
  > $out/interleaved-4096-bfloat16-all.txt 2>&1
python scripts/decode_ab.py keydiff 4096 bfloat16 argmin \
  > $out/decode-ab-keydiff-4k-bf16-argmin.txt 2>&1
python scripts/interleaved_overhead.py 4096 streaming,keydiff,weightedkv bfloat16 \
  > $out/interleaved-4096-bfloat16-keydiff.txt 2>&1
python scripts/interleaved_overhead.py 4096 full,streaming,quantized float32 \
  > $out/interleaved-4096-float32.txt 2>&1
python scripts/interleaved_overhead.py 4096 streaming,weightedkv,weightedkv+int8,h2o,h2o+int8 \
  bfloat16 > $out/interleaved-4096-bfloat16-int8.txt 2>&1
python scripts/decode_ab.py weightedkv+int8 4096 bfloat16 allslots \
  > $out/decode-ab-weightedkv-int8-4k-bf16-allslots.txt 2>&1
