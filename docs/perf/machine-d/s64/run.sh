#!/bin/sh
# s64's measurements on machine D at the final code, one at a time (docs/PERFORMANCE.md, 6zn).
cd "$(dirname "$0")/../../../.." || exit 1
out=docs/perf/machine-d/s64
# targets 4 and 5: full at 1k against the bandwidth probe, and against llama.cpp
for dt in bfloat16 float32; do
  python bench.py --dtype $dt --contexts 256,1024 --new_tokens 32 --compile on \
    --peer llama.cpp --json > $out/peer-llamacpp-$dt.json 2> $out/peer-llamacpp-$dt.log
done
# targets 1 and 3 at 4k
python scripts/interleaved_overhead.py 4096 full,streaming,weightedkv,quantized bfloat16 \
  > $out/interleaved-4096-bfloat16.txt 2>&1
python scripts/interleaved_overhead.py 4096 full,streaming,weightedkv,quantized float32 \
  > $out/interleaved-4096-float32.txt 2>&1
