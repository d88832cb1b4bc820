#!/bin/sh
# Machine C (Intel Xeon, KVM family 6 model 167, AVX-512 + AMX; PERFORMANCE 6zy), one run at a
# time, the files in this folder: the INT8 middle at 4k again (twice; 6zx had weightedkv +6.5% in
# one run), then target 1 at 1k for every policy, which 6zx did not run.
cd "$(dirname "$0")/../../../.." || exit 1
out=docs/perf/xeon/s77
all=streaming,quantized,h2o,tova,a2sf,weightedkv,weightedkv-evict,cam,lagkv,knorm,keydiff
for i in 1 2; do
  python scripts/interleaved_overhead.py 4096 streaming,weightedkv,weightedkv+int8,h2o,h2o+int8 \
    bfloat16 > $out/interleaved-4096-bfloat16-int8-$i.txt 2>&1
done
for dt in bfloat16 float32; do
  python scripts/interleaved_overhead.py 1024 $all $dt > $out/interleaved-1024-$dt-all.txt 2>&1
done
