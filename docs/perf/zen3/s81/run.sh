#!/bin/sh
# Machine A (AMD EPYC family 25 model 1, Zen 3, AVX2 only; PERFORMANCE 6zza), one run at a time,
# the files in this folder: the INT8 middle at 4k bfloat16 (twice; 6zy's `dequantize_few`, first
# on a real AVX2 machine), one-shot first tokens at this code and at 928942c's (a worktree at
# $BEFORE, before the graph wrote the window's queries) taking turns, then the INT8 middle twice
# more (-3, -4: the first two disagreed).
cd "$(dirname "$0")/../../../.." || exit 1
out=$PWD/docs/perf/zen3/s81
for i in 1 2; do
  python scripts/interleaved_overhead.py 4096 streaming,weightedkv,weightedkv+int8,h2o,h2o+int8 \
    bfloat16 > $out/interleaved-4096-bfloat16-int8-$i.txt 2>&1
done
turns=$PWD/docs/perf/xeon/s80/oneshot_turns.py
for i in 1 2; do
  PYTHONPATH=. python $turns bfloat16 4096 quantized,streaming,h2o,weightedkv > $out/turns-after-$i.txt 2>&1
  (cd ${BEFORE:-/tmp/wt-before} && PYTHONPATH=. python $turns bfloat16 4096 quantized,streaming,h2o,weightedkv \
    > $out/turns-before-$i.txt 2>&1)
done
for i in 3 4; do
  python scripts/interleaved_overhead.py 4096 streaming,weightedkv,weightedkv+int8,h2o,h2o+int8 \
    bfloat16 > $out/interleaved-4096-bfloat16-int8-$i.txt 2>&1
done
