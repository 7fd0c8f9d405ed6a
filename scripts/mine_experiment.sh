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

evaluate() {  # NAME ADAPTER
  local file=$out/eval-$1-heldout.json
  [ -f "$file" ] && return 0
  local args=(--model smollm2-135m --puzzles outputs/mined --split heldout -K "${K:-4}" --max-tokens 384 --batch-size 64
              --seed 0 --out "$file")
  [ "$2" = none ] || args+=(--adapter "$2" --baseline "$out/eval-base-heldout.json")
  mlx-swe-rl eval "${args[@]}"
}

evaluate base none
resume=
[ -f "$out/mined/config.yaml" ] && resume=--resume
sets=()
[ -z "${STEPS:-}" ] || sets=(--set train.steps="$STEPS")
[ -z "${REWARD:-}" ] || sets+=(--set "reward_without_tests={$REWARD: 1.0}")
mlx-swe-rl train --config configs/mined.yaml --set output_dir="$out" "${sets[@]}" $resume $quiet
evaluate mined "$out/mined"
echo "done: python scripts/mine_report.py"
