#!/usr/bin/env bash
# The measurements behind docs/PERFORMANCE.md's targets (compression that pays for itself), one
# JSON file each under docs/perf/<machine>/ (default: docs/perf/zen4). Run on an idle machine.
# The llama.cpp rows need llama-cpp-python (pip install llama-cpp-python==0.3.36; it compiles
# llama.cpp: 10 to 45 minutes on 2 cores); without it those two runs are skipped with a note.
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/perf/${1:-zen4}
mkdir -p "$out"
run() { local name=$1; shift; echo "== $name: python bench.py $*" >&2; python bench.py "$@" --json > "$out/$name.json"; }
ALL=streaming,h2o,tova,a2sf,weightedkv,weightedkv-evict,cam,lagkv,knorm,keydiff,quantized
# 1, 3: every policy's decode against streaming and full at 1k and 4k, budget 256 (chunked prompts)
run targets-f32 --contexts 1024,4096 --cache full,$ALL --cache_size 256 --new_tokens 24 --repeats 2 --compile on
# 2: time to first token at 4k with bulk prompt compression and 128-token chunks
run targets-bulk-4k --contexts 4096 --cache $ALL --cache_size 256 --prompt_compression bulk --prefill_chunk 128 --new_tokens 8 --repeats 2 --compile on
# 2, 3: quantized's first token and decode at 4k, chunk by chunk and read in one shot
run quantized-4k --contexts 4096 --cache full,quantized --cache_size 256 --new_tokens 8 --repeats 2 --compile on
run quantized-snapkv-4k --contexts 4096 --cache quantized --cache_size 256 --prompt_compression snapkv --new_tokens 8 --repeats 2 --compile on
# 2: full's time to first token at 4k against transformers in the same run
run targets-prefill-peer --contexts 4096 --cache full --new_tokens 8 --repeats 2 --compile on --peer transformers
# 1 again, interleaved: every policy against streaming, turn by turn (the VM drifts
# between separate runs by more than a policy costs), and with a compression interval of 8
for ctx in 1024 4096; do
  echo "== interleaved $ctx" >&2
  python scripts/interleaved_overhead.py $ctx \
    streaming:8,h2o,h2o:8,tova,a2sf,weightedkv,weightedkv:8,weightedkv-evict,cam,lagkv,knorm,keydiff \
    > "$out/interleaved-overhead-$ctx.txt"
done
# 1 in bfloat16, interleaved
for ctx in 1024 4096; do
  python scripts/interleaved_overhead.py $ctx h2o,tova,a2sf,weightedkv,weightedkv-evict,cam,lagkv,knorm,keydiff bfloat16 \
    > "$out/interleaved-$ctx-bf16.txt"
done
# 1 in bfloat16; 3: an INT8 middle against the same policy without
run targets-bf16 --dtype bfloat16 --contexts 1024,4096 --cache full,streaming,weightedkv --cache_size 256 --new_tokens 24 --repeats 2 --compile on
run targets-int8-middle --contexts 1024,4096 --cache h2o,weightedkv --kv_middle int8 --cache_size 256 --new_tokens 24 --repeats 2 --compile on
# 4, 5: full-cache decode against the measured bandwidth and against llama.cpp, same weights
if python -c "import llama_cpp" 2>/dev/null; then
  run peer-llamacpp-f32 --contexts 256,1024 --new_tokens 32 --compile on --peer llama.cpp
  run peer-llamacpp-bf16 --dtype bfloat16 --contexts 256,1024 --new_tokens 32 --compile on --peer llama.cpp
else
  echo "note: llama-cpp-python is not installed; the llama.cpp rows were not run" >&2
fi
