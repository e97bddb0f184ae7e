#!/bin/bash
# The GPU checks of one short lease, as one command: the quality table of a budget that fits it (`base-lease`), and
# optionally the speed tables, each under a deadline; what it measured lands in $OUT (default: runs/gpu-lease).
#
# Here, first (spaCy and `datasets` are not needed there):
#     python scripts/bench_quality.py prepare --budget base-lease
#     python scripts/bench_speed.py --save-inputs gpu-data/speed-inputs.pt --backbones marian t5 --sizes base big
# There (carrying runs/bench-quality/base-lease/prepared, and gpu-data for the speed step):
#     SPEED_FOR=0 TRAIN_UNTIL=480 bash scripts/gpu_lease.sh
# Back here: unpack $OUT/quality.tgz in the checkout and run `python scripts/bench_quality.py report --budget base-lease`
# (with `--max-steps N` when the deadline cut the runs: env.txt names the step N they were scored at).
#
# Runs still training at TRAIN_UNTIL seconds are stopped and every row whose seeds all kept a checkpoint is scored at
# the last step all of them reached (`--at-common-step`); a row that failed is left out and named in env.txt.
set -u
OUT=${OUT:-runs/gpu-lease}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
BUDGET=${BUDGET:-base-lease} TRAIN_UNTIL=${TRAIN_UNTIL:-480} SPEED_FOR=${SPEED_FOR:-0}
SEEDS=${SEEDS:-1 2 3} ROWS=${ROWS:-transformer phrase_memory phrase_representation hybrid rhe} PY=${PY:-python3}
JOBS=${JOBS:-15}
START=$SECONDS
RUNS=runs/bench-quality/$BUDGET
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  $PY -c "import torch, transformers, sacrebleu; print(torch.__version__, transformers.__version__, sacrebleu.__version__, torch.cuda.is_available())"
  # the train step's promise: no spaCy, no datasets
  $PY -c "import sys; sys.modules['spacy'] = sys.modules['datasets'] = None; import mgsa_hf.benchmarking.quality"
} > "$OUT/env.txt" 2>&1
if [ "$SPEED_FOR" -gt 0 ]; then
  timeout "$SPEED_FOR" $PY scripts/bench_speed.py --inputs gpu-data/speed-inputs.pt --device cuda --dtype bf16 \
    --backbones marian t5 --sizes base big --kernel-check --output "$OUT/speed-cuda.json" > "$OUT/speed.log" 2>&1
  echo "speed: exit $? at $((SECONDS - START)) s" >> "$OUT/env.txt"
fi
# shellcheck disable=SC2086  # ROWS and SEEDS are lists
timeout $((TRAIN_UNTIL - (SECONDS - START))) $PY scripts/bench_quality.py train --budget "$BUDGET" --rows $ROWS \
  --seeds $SEEDS --jobs "$JOBS" > "$OUT/train.log" 2>&1
status=$?
echo "train: exit $status at $((SECONDS - START)) s" >> "$OUT/env.txt"
if [ $status -ne 0 ]; then
  pkill -f 'mgsa_hf.benchmarking.quality run-one'
  sleep 5
  scored=""
  for row in $ROWS; do
    complete=yes
    for seed in $SEEDS; do
      ls "$RUNS/$row/seed-$seed/checkpoints/"step-*.safetensors > /dev/null 2>&1 || complete=no
    done
    if [ $complete = yes ]; then scored="$scored $row"; else echo "left out: $row (a seed without a checkpoint)" >> "$OUT/env.txt"; fi
  done
  # finished runs are scored again at the common step: every row at equal steps
  for row in $scored; do
    rm -rf "benchmarks/quality-$BUDGET.runs/$row" "$RUNS/$row"/seed-*/result.json
  done
  if [ -n "$scored" ]; then
    # shellcheck disable=SC2086
    $PY scripts/bench_quality.py train --budget "$BUDGET" --rows $scored --seeds $SEEDS --jobs "$JOBS" \
      --at-common-step >> "$OUT/train.log" 2>&1
    echo "scored at the common step: exit $? at $((SECONDS - START)) s" >> "$OUT/env.txt"
    grep 'every run finishes at step' "$OUT/train.log" >> "$OUT/env.txt"
  else
    echo "nothing to score: no row has a checkpoint for every seed" >> "$OUT/env.txt"
  fi
fi
tar czf "$OUT/quality.tgz" --ignore-failed-read "benchmarks/quality-$BUDGET.runs" "$RUNS"/*/seed-*/log.jsonl \
  "$RUNS"/*/seed-*/stdout.log 2>> "$OUT/env.txt"
echo "end at $((SECONDS - START)) s" >> "$OUT/env.txt"
