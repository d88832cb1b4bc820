#!/bin/sh
# s62: target 5 against llama.cpp on machine D (llama-cpp-python 0.3.36 built here, native).
cd "$(dirname "$0")/../../../.." || exit 1
out=docs/perf/machine-d/s62
for dt in float32 bfloat16; do
  python bench.py --dtype $dt --contexts 256,1024 --new_tokens 32 --compile on \
    --peer llama.cpp --json > $out/peer-llamacpp-$dt.json 2> $out/peer-llamacpp-$dt.log
done
