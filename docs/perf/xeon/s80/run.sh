#!/bin/sh
# Machine C (Intel Xeon, KVM family 6 model 167, AVX-512 + AMX; PERFORMANCE 6zza), one run at a
# time: one-shot prompts whose observation window's queries the compiled prompt graph writes
# (no second read), against the code before (a worktree of 928942c at $BEFORE), taking turns;
# files in this folder.
cd "$(dirname "$0")/../../../.." || exit 1
out=$PWD/docs/perf/xeon/s80
cmd="bench.py --dtype bfloat16 --contexts 4096 --cache full,quantized,streaming,h2o,weightedkv,knorm \
  --cache_size 256 --prompt_compression snapkv --new_tokens 8 --repeats 3 --compile on \
  --compile_prefill --json"
for i in 1 2; do
  python $cmd > $out/oneshot-after-$i.json 2> $out/oneshot-after-$i.log
  (cd ${BEFORE:-/tmp/wt-before} && python $cmd > $out/oneshot-before-$i.json 2> $out/oneshot-before-$i.log)
done
