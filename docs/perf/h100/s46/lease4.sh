#!/usr/bin/env bash
# s46's lease: the GPU policy table's missing rows on the default model's shapes (random
# weights): weightedkv-evict at 1k, the first 4k rows (full, streaming, weightedkv), then lagkv
# at 1k with whatever time is left. Each row in its own process under its own limit.
set -u
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/lease4.log") 2>&1
D=${DEADLINE:-530}
left() { echo $(( D - SECONDS < $1 ? D - SECONDS : $1 )); }
date; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
lscpu | grep -E "Model name|^CPU\(s\)|CPU family|^Model:"
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
python scripts/random_checkpoint.py .gpu/like checkpoints/s135 --like .gpu/like --device cuda
echo "== made at $SECONDS s"
row() {  # POLICIES CONTEXT LIMIT
  local l; l=$(left "$3"); [ "$l" -gt 30 ] || { echo "== skipped $1 $2 (no time)"; return; }
  MODEL=checkpoints/s135 POLICIES="$1" CONTEXTS=$2 BASELINE= ROW_LIMIT=$l scripts/performance_cuda.sh "$OUT" policies
  echo "== $1 at $2 ended at $SECONDS s (limit $l)"
}
row weightedkv-evict 1024 170
row full,weightedkv 4096 200
row lagkv 1024 400
echo "== done at $SECONDS s"; date
ls -la "$OUT"
