#!/usr/bin/env bash
# The issue "Generate only the answer", measured on results: the base model with and without the
# answer-end stop, greedy and avg@K, on the learning experiment's three sets (scripts/learn.sh's
# data), each pair compared per puzzle (--baseline); plus the acceptance check on the easy and
# medium tiers at 384 tokens. Resumable: finished evaluations are kept. Needs scripts/learn.sh's
# data (run learn.sh first; its base evaluations in $LEARN, default outputs/learn, are reused);
# results go to $OUT (default outputs/answer-end). Then: python scripts/answer_end_report.py
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-outputs/answer-end}
mkdir -p "$out"

# SET K MODE: one evaluation of the base model (K = 1: greedy); MODE full adds --full-completions.
evaluate() {
  local set=$1 k=$2 mode=$3
  local file=$out/eval-$set-k$k-$mode.json
  [ -f "$file" ] && return 0
  local args=(--model smollm2-135m --batch-size 64 --seed 0 --out "$file")
  case $set in
    train) args+=(--puzzles outputs/learn-train40.json --max-tokens 192) ;;
    heldout) args+=(--puzzles outputs/forged-easy-heldout60.json --max-tokens 192) ;;
    bundled) args+=(--max-tokens 192) ;;
    easy-medium) args+=(--tiers easy,medium --max-tokens 384) ;;
  esac
  [ "$k" = 1 ] || args+=(-K "$k")
  [ "$mode" = full ] && args+=(--full-completions)
  # learn.sh's base evaluations are these very commands with the stop: reuse them
  local learned=${LEARN:-outputs/learn}/eval-base-$set.json
  if [ "$mode" = stop ] && [ "$k" != 1 ] && [ -f "$learned" ]; then cp "$learned" "$file"; return 0; fi
  mlx-swe-rl eval "${args[@]}"
}

for mode in full stop; do evaluate easy-medium 1 $mode; done
for set in train heldout bundled; do
  for mode in full stop; do evaluate $set 1 $mode; done
done
for set in train heldout; do
  for mode in full stop; do evaluate $set 8 $mode; done
done
for mode in full stop; do evaluate bundled 4 $mode; done
echo "done: python scripts/answer_end_report.py"
