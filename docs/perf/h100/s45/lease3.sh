#!/usr/bin/env bash
# s45's lease: full decode at 4k on Llama-3-8B shapes (split-K vs SDPA), then the policy table's
# missing 1k rows on the default model's shapes (random weights).
set -u
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/lease3.log") 2>&1
D=${DEADLINE:-550}
date; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
lscpu | grep -E "Model name|^CPU\(s\)|CPU family|^Model:"
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
python scripts/random_checkpoint.py llama-3-8b checkpoints/l8b --dtype bfloat16 --device cuda --like .gpu/like
echo "== made at $SECONDS s"
timeout 170 python scripts/attention_probe.py --device cuda --model checkpoints/l8b --contexts 4096 --parts 2 --variants engine,sdpa
echo "== attention done at $SECONDS s"
rm -rf checkpoints/l8b
python scripts/random_checkpoint.py .gpu/like checkpoints/s135 --like .gpu/like --device cuda
MODEL=checkpoints/s135 POLICIES="keydiff,knorm weightedkv-evict,lagkv quantized" CONTEXTS=1024 ROW_LIMIT=200 \
  timeout $((D - SECONDS)) scripts/performance_cuda.sh "$OUT" policies
echo "== done at $SECONDS s"; date
ls -la "$OUT"
