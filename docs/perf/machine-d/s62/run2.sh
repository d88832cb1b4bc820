#!/bin/sh
# s62's measurements on machine D after the first token (docs/PERFORMANCE.md, 6zl), one at a
# time: the argmin A/B, then target 5 against llama.cpp (llama-cpp-python 0.3.36 built here).
cd "$(dirname "$0")/../../../.." || exit 1
out=docs/perf/machine-d/s62
python scripts/decode_ab.py quantized 4096 bfloat16 argmin > $out/decode-ab-quantized-4k-bf16-argmin.txt 2>&1
for dt in float32 bfloat16; do
  python bench.py --dtype $dt --contexts 256,1024 --new_tokens 32 --compile on \
    --peer llama.cpp --json > $out/peer-llamacpp-$dt.json 2> $out/peer-llamacpp-$dt.log
done
