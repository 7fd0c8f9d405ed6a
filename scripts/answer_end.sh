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

# The puzzles of each set (scripts/experiment.sh: evaluate); every evaluation is the base model's.
set_args() {
  case $1 in
    train) echo --puzzles outputs/learn-train40.json ;;
    heldout) echo --puzzles outputs/forged-easy-heldout60.json ;;
    bundled) ;;
    easy-medium) echo --tiers easy,medium --max-tokens 384 ;;
  esac
}
. scripts/experiment.sh

# SET K MODE: the base model greedy (K = 1) or avg@K, with the answer-end stop (stop) or without
# (full), into $out/eval-base-SET-kK-MODE.json.
base() {
  local set=$1 k=$2 mode=$3
  # learn.sh's base evaluations are these very commands with the stop: reuse them
  local learned=${LEARN:-outputs/learn}/eval-base-$set.json
  if [ "$mode" = stop ] && [ "$k" != 1 ] && [ -f "$learned" ] && [ ! -f "$out/eval-base-$set-k$k-$mode.json" ]; then
    cp "$learned" "$out/eval-base-$set-k$k-$mode.json"
  fi
  tag=k$k-$mode with="$([ "$k" = 1 ] || echo "-K $k") $([ "$mode" = stop ] || echo --full-completions)" evaluate base none "$set"
}

for mode in full stop; do base easy-medium 1 $mode; done
for set in train heldout bundled; do
  for mode in full stop; do base $set 1 $mode; done
done
for set in train heldout; do
  for mode in full stop; do base $set 8 $mode; done
done
for mode in full stop; do base bundled 4 $mode; done
echo "done: python scripts/answer_end_report.py"
