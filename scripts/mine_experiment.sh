#!/usr/bin/env bash
# SWE-RL on a real history (README "Train on your own repository"): mine REPO (a local clone;
# measured on more-itertools: git clone https://github.com/more-itertools/more-itertools), check
# the tasks, evaluate SmolLM2-135M on the held-out (newest) tasks, train configs/mined.yaml on the
# training tasks and evaluate again, paired. Resumable. Mined code stays under outputs/ (never
# commit it: it is the repository's, under its licence). Then: python scripts/mine_report.py
# K (samples per held-out task, default 4) and STEPS (training steps, default configs/mined.yaml's)
# make a shorter run; REWARD (default configs/mined.yaml's, progress) names the reward of tasks
# without tests: the measured run is REWARD=similarity K=2 STEPS=6.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=${1:?usage: scripts/mine_experiment.sh REPO}
out=${OUT:-outputs/mine-experiment}
mkdir -p "$out"
quiet=${QUIET:+--quiet}
[ -d outputs/mined ] || mlx-swe-rl puzzles mine "$repo" --out outputs/mined
[ -f "$out/check.txt" ] || mlx-swe-rl puzzles check outputs/mined | tee "$out/check.txt"

# The held-out (newest) tasks, K samples each at 384 tokens (scripts/experiment.sh: evaluate, train).
set_args() { echo --puzzles outputs/mined --split heldout -K "${K:-4}" --max-tokens 384; }
config=configs/mined.yaml
. scripts/experiment.sh

evaluate base none heldout
train mined ${STEPS:+train.steps=$STEPS} ${REWARD:+"reward_without_tests={$REWARD: 1.0}"}
evaluate mined "$out/mined" heldout
echo "done: python scripts/mine_report.py"
