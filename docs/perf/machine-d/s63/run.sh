#!/bin/sh
# The final targets on machine D, one at a time (docs/PERFORMANCE.md, 6zm; 6zn as `run.sh s64`,
# 6zo as `run.sh s65`):
# the files go to docs/perf/machine-d/STOP (s63 unless given), or to OUT (machine E's 6zp:
# OUT=docs/perf/machine-e/s66).
cd "$(dirname "$0")/../../../.." || exit 1
out=${OUT:-docs/perf/machine-d/${1:-s63}}
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
