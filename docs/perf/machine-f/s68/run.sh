#!/bin/sh
# Every target on machine F (AMD EPYC family 23 model 49, Zen 2, AVX2 only; PERFORMANCE 6zr), one
# run at a time, the files in this folder: the step's GEMVs from C++ (the AVX2 loops, four rows
# and one, each prefetch hint, two rounds), then machine E's runs at 4k (machine-e/s66/run.sh:
# 4, 5 and 1, 3 as on D, target 1 for every policy, the INT8 middle, and target 2).
cd "$(dirname "$0")/../../../.." || exit 1
out=docs/perf/machine-f/s68
sh docs/perf/machine-d/s65/gemv_rounds.sh $out "machine F (AMD EPYC family 23 model 49, Zen 2, AVX2 only; 2 vCPUs), 6zr"
OUT=$out CONTEXTS=4096 sh docs/perf/machine-e/s66/run.sh
# This stop (6zr) stopped the run after the eleven at 4k in bfloat16 to look at target 5 in
# float32 (single-core.txt, gemv-split.txt, the perf files, paced-bands.diff and its A/B files),
# then ran machine-e/s66/run.sh's remaining lines by hand, unchanged: the float32 sweep, the INT8
# middle, target 2 against transformers and every policy's first token. After them:
# interleaved_overhead.py 4096 streaming,h2o,a2sf,weightedkv float32 and streaming,lagkv,
# weightedkv-evict bfloat16 (-again.txt), the perf_policy.sh lines at 1k, and s63/run.sh's
# peer lines once more (peer-llamacpp-*-final.json).
