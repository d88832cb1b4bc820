#!/bin/sh
# Every target on machine A (AMD EPYC family 25 model 1, Zen 3, AVX2 only; PERFORMANCE 6zw), one
# run at a time, the files in this folder: the step's GEMVs from C++ (the AVX2 loops, both
# prefetch hints, two rounds), then machine E's runs at 4k (machine-e/s66/run.sh: targets 4 and
# 5, 1 and 3, target 1 for every policy, the INT8 middle, target 2), then `quantized`'s first
# token at 4k in float32.
cd "$(dirname "$0")/../../../.." || exit 1
out=docs/perf/zen3/s75
sh docs/perf/machine-d/s65/gemv_rounds.sh $out "machine A (AMD EPYC family 25 model 1, Zen 3, AVX2 only; 2 vCPUs), 6zw"
OUT=$out CONTEXTS=4096 sh docs/perf/machine-e/s66/run.sh
python bench.py --dtype float32 --contexts 4096 --cache full,quantized --cache_size 256 \
  --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on \
  --compile_prefill --json > $out/ttft-4k-float32-quantized.json 2> $out/ttft-4k-float32-quantized.log
# Then by hand (6zw): that line again (-again.json) and with --prefill_chunk 256 in both dtypes
# (-chunk256.json); docs/perf/machine-d/s61/prefill_profile.py full|quantized float32 and
# quantized bfloat16 at 4096 (prefill-profile-*.txt); docs/perf/zen3/s47/host_split.py
# weightedkv[+int8] bfloat16 4096 40 (host-split-*.txt); scripts/decode_ab.py weightedkv+int8
# 4096 bfloat16 pool; interleaved_overhead.py at 1024, all eleven, both dtypes.
