#!/usr/bin/env bash
# Multi-turn repair measured (README "Multi-turn repair"): SmolLM2-135M on the learning
# experiment's data (scripts/learn.sh makes it). Trains configs/multi_turn.yaml (2 answers per
# episode, reward on hidden tests) and single-turn GRPO on the same puzzles with as many sampled
# tokens (configs/learn.yaml, run until its tokens match: scripts/learn.sh's seed-0 run continued,
# LEARN=its directory), then evaluates the base model and both
# runs with 2-answer episodes (avg@4, public tests' feedback; the training set also with the
# generic-feedback ablation and the best-of-2 baseline). Resumable. Then:
# python scripts/multi_turn_report.py
# SETS="train" skips the held-out evaluations, MT_STEPS=N trains the multi-turn run for N steps
# (the reduced run README reports: SETS=train MT_STEPS=8).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-outputs/multi-turn}
mkdir -p "$out"
quiet=${QUIET:+--quiet}
[ -f outputs/learn-train40.json ] || { echo "run scripts/learn.sh first (its data step)"; exit 1; }
mt=(--turns 2 --public-tests 2 --reward-on hidden)

# evaluate NAME ADAPTER SET [EXTRA...]: avg@4 with 2-answer episodes into $out/eval-NAME-SET[-TAG].json
evaluate() {
  local name=$1 adapter=$2 set=$3 tag=${4:-}; shift 4 || shift $#
  local file=$out/eval-$name-$set${tag:+-$tag}.json
  [ -f "$file" ] && return 0
  local args=(--model smollm2-135m --max-tokens 192 --batch-size 64 --seed 0 -K 4 "${mt[@]}" --out "$file")
  case $set in
    train) args+=(--puzzles outputs/learn-train40.json) ;;
    heldout) args+=(--puzzles outputs/forged-easy-heldout60.json) ;;
  esac
  [ "$adapter" = none ] || args+=(--adapter "$adapter")
  [ "$name" = base ] || [ -n "$tag" ] || args+=(--baseline "$out/eval-base-$set.json")
  mlx-swe-rl eval "${args[@]}" "$@"
}

train() {  # RUN CONFIG KEY=VALUE...
  local run=$1 config=$2; shift 2
  local sets=(--set output_dir="$out" --set run_name="$run")
  for kv in "$@"; do sets+=(--set "$kv"); done
  local resume=
  [ -f "$out/$run/config.yaml" ] && resume=--resume
  mlx-swe-rl train --config "$config" "${sets[@]}" $resume $quiet
}

eval_sets=${SETS:-train heldout}
for set in $eval_sets; do evaluate base none "$set"; done
evaluate base none train generic --feedback generic
evaluate base none train best --best-of-n
train multi-turn configs/multi_turn.yaml ${MT_STEPS:+train.steps=$MT_STEPS}
# single-turn with the same sampled tokens: as many steps as it takes to match the multi-turn run's,
# continuing scripts/learn.sh's seed-0 run (the same config and seed) when it is there
[ -d "$out/single-turn" ] || [ ! -f "${LEARN:-outputs/learn}/onpolicy-s0/history.jsonl" ] || \
  cp -r "${LEARN:-outputs/learn}/onpolicy-s0" "$out/single-turn"
# sampled tokens of a run: 5 puzzles x G = 8 episodes per step
sampled() { python -c "from mlx_swe_rl.runfiles import read_history; print(sum(h['completion_len'] * 40 for h in read_history('$1')))"; }
tokens=$(sampled "$out/multi-turn")
steps=16
while :; do
  train single-turn configs/learn.yaml train.steps=$steps
  have=$(sampled "$out/single-turn")
  python -c "import sys; sys.exit(0 if $have >= $tokens else 1)" && break
  steps=$((steps + 2))
done
for run in multi-turn single-turn; do
  for set in $eval_sets; do evaluate "$run" "$out/$run" "$set"; done
done
evaluate multi-turn "$out/multi-turn" train generic --feedback generic
echo "done: python scripts/multi_turn_report.py"
