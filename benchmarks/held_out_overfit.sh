#!/usr/bin/env bash
# The held-out loss on a real corpus, by hand (about 20 minutes on a shared 2-core CPU; not a test): the 38 Austen
# chapters of sample_corpus/raw are split by prepare into 2 training chapters and 36 held-out ones
# (--dev_fraction=0.95), and a small model trains on the 2 for about 50 passes, so that it overfits them. Its
# held-out loss falls, then rises while its training loss goes on falling; the best checkpoint (model_dir/best/) is the one at the minimum, and curves draws both.
#
#   benchmarks/held_out_overfit.sh [OUT_DIR]   (PY=python, STEPS=2000, DEV_FRACTION=0.95, LR=4e-3 to change)
#
# Prints the held-out log lines, best.json and the PNG's path; the figures are in BENCHMARKS.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-/tmp/xlnet-held-out}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
STEPS=${STEPS:-2000}
DEV_FRACTION=${DEV_FRACTION:-0.95}
LR=${LR:-4e-3}
rm -rf "$OUT" && mkdir -p "$OUT"
cd "$OUT"
"$PY" -m xlnet_data.prepare --input_glob="$ROOT/sample_corpus/raw/*.jsonl.gz" --output_dir=corpus --language=en \
  --dev_fraction="$DEV_FRACTION" --num_workers=1
"$PY" -m xlnet_data.spm_train --input='corpus/*.txt' --model_prefix=spm/austen --vocab_size=1000
DATA=(--sp_path=spm/austen.model --save_dir=records --bsz_per_host=8 --num_core_per_host=1 --seq_len=128
      --reuse_len=64 --num_predict=21 --num_passes=1 --num_workers=1)
"$PY" -m xlnet_data.create --input_glob='corpus/*.txt' "${DATA[@]}"
"$PY" -m xlnet_data.create --input_glob='corpus/dev/*.txt' --split=dev "${DATA[@]}"
"$PY" -m xlnet_data.dump records --stats 2>/dev/null | head -3
"$PY" -m xlnet_data.train_gpu --record_info_dir=records --model_dir=model --n_layer=2 --d_model=128 --n_head=4 \
  --d_head=32 --d_inner=512 --ff_activation=gelu --untie_r --mem_len=64 --learning_rate="$LR" --warmup_steps=50 \
  --decay_method=cos --min_lr_ratio=0.1 --train_steps="$STEPS" --iterations=50 --eval_every=100 --eval_batches=20 \
  --save_steps=500 --max_save=2 2>&1 | grep -E "held-out loss|\| loss|^done" | sed 's/^I[0-9. :]*[0-9]* [a-z_]*.py:[0-9]*\] //'
cat model/best/best.json
"$PY" -m xlnet_data.curves --model_dir=model --output=curves.png --title="Austen chapters: a share of $DEV_FRACTION held out, the rest trained on"
echo "PNG: $OUT/curves.png"
