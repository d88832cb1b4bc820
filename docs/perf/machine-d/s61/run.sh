#!/bin/sh
# s61's measurements on machine D, one at a time (docs/PERFORMANCE.md, 6zk).
cd "$(dirname "$0")/../../../.." || exit 1
out=docs/perf/machine-d/s61
for dt in bfloat16 float32; do
  python bench.py --dtype $dt --contexts 1024 --cache full --new_tokens 32 --repeats 3 \
    --compile on --json > $out/full-1k-$dt.json 2> $out/full-1k-$dt.log
done
python scripts/interleaved_overhead.py 4096 full,streaming,weightedkv,knorm,keydiff,quantized \
  bfloat16 > $out/interleaved-4096-bfloat16.txt 2>&1
# then, in float32: quantized's first token at 4k, and target 3 interleaved
python bench.py --dtype float32 --contexts 4096 --cache full,quantized --cache_size 256 \
  --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on \
  --compile_prefill --json > $out/ttft-4k-float32-quantized.json 2> $out/ttft-4k-float32-quantized.log
python scripts/interleaved_overhead.py 4096 full,streaming,quantized float32 \
  > $out/interleaved-4096-float32.txt 2>&1
