#!/usr/bin/env bash
# Multi-turn repair measured (README "Multi-turn repair"): SmolLM2-135M on the learning
# experiment's data (`mlx-swe-rl experiment configs/experiments/learn-stop.yaml` makes it). Trains
# configs/multi_turn.yaml (2 answers per episode, reward on hidden tests) and single-turn GRPO on
# the same puzzles with as many sampled tokens (configs/learn.yaml, run until its tokens match: the
# learn experiment's on-policy seed-0 run continued, LEARN=its output directory, default
# outputs/learn-stop), then evaluates the base model and both
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
[ -f outputs/learn-train40.json ] || { echo "run mlx-swe-rl experiment configs/experiments/learn-stop.yaml first (its data steps)"; exit 1; }

# The puzzles of each evaluation set, avg@4 with 2-answer episodes (scripts/experiment.sh: evaluate, train).
set_args() {
  case $1 in
    train) echo --puzzles outputs/learn-train40.json -K 4 --turns 2 --public-tests 2 --reward-on hidden ;;
    heldout) echo --puzzles outputs/forged-easy-heldout60.json -K 4 --turns 2 --public-tests 2 --reward-on hidden ;;
  esac
}
config=configs/multi_turn.yaml
. scripts/experiment.sh

eval_sets=${SETS:-train heldout}
evaluate base none $eval_sets
tag=generic with="--feedback generic" evaluate base none train
tag=best with=--best-of-n evaluate base none train
train multi-turn ${MT_STEPS:+train.steps=$MT_STEPS}
# single-turn with the same sampled tokens: as many steps as it takes to match the multi-turn run's,
# continuing the learn experiment's seed-0 run (the same config and seed) when it is there
[ -d "$out/single-turn" ] || [ ! -f "${LEARN:-outputs/learn-stop}/onpolicy-s0/history.jsonl" ] || \
  cp -r "${LEARN:-outputs/learn-stop}/onpolicy-s0" "$out/single-turn"
# sampled tokens of a run: 5 puzzles x G = 8 episodes per step
sampled() { python -c "from mlx_swe_rl.runfiles import read_history; print(sum(h['completion_len'] * 40 for h in read_history('$1')))"; }
tokens=$(sampled "$out/multi-turn")
steps=16
while :; do
  config=configs/learn.yaml train single-turn train.steps=$steps
  have=$(sampled "$out/single-turn")
  python -c "import sys; sys.exit(0 if $have >= $tokens else 1)" && break
  steps=$((steps + 2))
done
for run in multi-turn single-turn; do evaluate "$run" "$out/$run" $eval_sets; done
tag=generic with="--feedback generic" evaluate multi-turn "$out/multi-turn" train
echo "done: python scripts/multi_turn_report.py"
