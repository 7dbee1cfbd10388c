#!/bin/bash
# Issue 31's checks on a GPU, prepared for a machine that has one (none was at hand when it was written):
#   1. the memory plan against TensorFlow's allocator peak (get_memory_info) at the bench_memory shapes,
#      float32 and bfloat16;
#   2. the largest micro-batch that fits at XLNet-Base seq 512 (rows per replica 2, 4, 8, ... until one fails)
#      and what the plan says of each;
#   3. the step's MFU at XLNet-Base with bfloat16 and XLA.
# Each step has its own time limit (at most 200 + 10 x 60 + 2 x 120 s; on an H100-class GPU about 8 minutes
# expected, not measured: no GPU was at hand).
# It needs TensorFlow with its CUDA 12 libraries on that machine. The H200 lent on 2026-12-04 had none: its image
# holds PyTorch, JAX and CUDA 13 only (no libcudart.so.12), and TensorFlow alone (its CPU wheel is 261 MiB, 1.3 GB
# installed) is far past what a call can carry there (64 MiB), so these checks did not run.
#   bash benchmarks/gpu_check.sh [output folder, default gpu_check_out]
set -u
cd "$(dirname "$0")/.."
OUT=${1:-gpu_check_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD TF_CPP_MIN_LOG_LEVEL=2
PY=${PYTHON:-python}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  git log -1 --format='commit %h %s'
} | tee "$OUT/gpu.txt"

echo "== 1. plan vs allocator peak" | tee -a "$OUT/gpu.txt"
timeout 200 $PY benchmarks/bench_memory.py --shapes=small,long,medium,base --bfloat16=off,on --steps=3 \
  --json="$OUT/memory.json" 2>&1 | tee -a "$OUT/gpu.txt"

echo "== 2. largest micro-batch at XLNet-Base seq 512" | tee -a "$OUT/gpu.txt"
for dtype in "" "--bfloat16"; do
  for rows in 4 8 16 32 64; do  # doubling until one does not fit (each case at most 60 s)
    if timeout 60 $PY benchmarks/bench_train.py gpu --bsz_per_replica=$rows $dtype --jit_compile=on --steps=2 \
        --warmup=1 --strategy=one_device > "$OUT/rows_${rows}${dtype}.txt" 2>&1; then
      echo "rows $rows ${dtype:-float32}: fits: $(tail -1 "$OUT/rows_${rows}${dtype}.txt")" | tee -a "$OUT/gpu.txt"
    else
      echo "rows $rows ${dtype:-float32}: does not fit (or timed out): $(grep -m1 -o 'ResourceExhausted[^.]*' \
        "$OUT/rows_${rows}${dtype}.txt")" | tee -a "$OUT/gpu.txt"
      break
    fi
  done
done
$PY - <<'PY' 2>&1 | tee -a "$OUT/gpu.txt"
import dataclasses
import tensorflow as tf
from tensorflow.python.client import device_lib
from xlnet_data.pretrain import config as C, costs
limit = next(d.memory_limit for d in device_lib.list_local_devices() if d.device_type == "GPU")
model = C.XLNetConfig(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072, ff_activation="gelu", untie_r=True)
for bfloat16 in (False, True):
    shape = costs.StepShape(seq_len=512, reuse_len=256, mem_len=384, bsz_per_replica=2, num_predict=85, bi_data=True,
                            bfloat16=bfloat16)
    fits = [rows for rows in range(2, 257, 2)
            if costs.memory_plan(model, dataclasses.replace(shape, bsz_per_replica=rows)).total <= limit]
    print(f"plan: at most {max(fits, default=0)} rows per replica fit {costs.gb(limit)} ({'bfloat16' if bfloat16 else 'float32'})")
PY

echo "== 3. MFU at XLNet-Base, bfloat16 + XLA" | tee -a "$OUT/gpu.txt"
timeout 120 $PY benchmarks/bench_train.py gpu --bfloat16 --jit_compile=on --bsz_per_replica=8 --steps=10 \
  --strategy=one_device 2>&1 | tail -2 | tee -a "$OUT/gpu.txt"
timeout 120 $PY benchmarks/bench_train.py gpu --jit_compile=on --bsz_per_replica=8 --steps=10 \
  --strategy=one_device 2>&1 | tail -2 | tee -a "$OUT/gpu.txt"
