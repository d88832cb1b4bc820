#!/bin/sh
# Machine C (Intel Xeon, KVM family 6 model 167, AVX-512 + AMX; PERFORMANCE 6zz), one run at a
# time: one-shot prompts (--prompt_compression snapkv) through the compiled prompt graph,
# against the code before (a worktree of e3ac0b4 at $BEFORE), taking turns; files in this
# folder, or OUT (6zza: OUT=docs/perf/xeon/s80 BEFORE=<a worktree of 928942c>). (oneshot-v1-*:
# a first form that took the graph only where nothing was chosen.)
cd "$(dirname "$0")/../../../.." || exit 1
out=$PWD/${OUT:-docs/perf/xeon/s78}
cmd="bench.py --dtype bfloat16 --contexts 4096 --cache full,quantized,streaming,h2o,weightedkv,knorm \
  --cache_size 256 --prompt_compression snapkv --new_tokens 8 --repeats 3 --compile on \
  --compile_prefill --json"
for i in 1 2; do
  python $cmd > $out/oneshot-after-$i.json 2> $out/oneshot-after-$i.log
  (cd ${BEFORE:-/tmp/wt-before} && python $cmd > $out/oneshot-before-$i.json 2> $out/oneshot-before-$i.log)
done
