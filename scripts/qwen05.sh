#!/usr/bin/env bash
# The issue "The mission's model, for real", end to end and resumable: Qwen2.5-Coder-0.5B's
# learning zone by calibration, its base avg@K, two seeds of configs/qwen05.yaml and their
# evaluations paired with the base model's. Rerun it after an interruption: finished pieces are
# kept, a stopped run resumes from its last checkpoint.
#   RUNS   which runs, in order (default: s0 s1)
#   OUT    where runs and evaluations go (default outputs/qwen05-runs)
#   K      samples per puzzle of the held-out and bundled evaluations (default 1: greedy)
#   FORGED how many of the transfer experiment's forged training puzzles join the candidates (default 12)
#   STEPS  training steps per run (default: configs/qwen05.yaml's)
# Then: python scripts/learn_report.py --experiment qwen05 --runs "$OUT"
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-outputs/qwen05-runs}
model=qwen2.5-coder-0.5b
mkdir -p "$out" outputs/qwen05
quiet=${QUIET:+--quiet}

[ -d outputs/forged ] || mlx-swe-rl puzzles forge --out outputs/forged --per-seed 5
[ -d outputs/forged-easy ] || mlx-swe-rl puzzles forge puzzles/easy --out outputs/forged-easy --per-seed 30 --heldout-frac 0
[ -f outputs/transfer/data.json ] || python scripts/transfer_data.py

# The candidates: the bundled medium/hard training puzzles beside the transfer experiment's
# forged training puzzles, in one directory (a folder per tier; their ids do not clash), calibrated once.
pool=outputs/qwen05/pool
if [ ! -d "$pool" ]; then
  mkdir -p "$pool.tmp"
  python - "$pool.tmp" "${FORGED:-12}" <<'PY'
import json, shutil, sys
from pathlib import Path
from mlx_swe_rl.puzzles.format import load_puzzles
out = Path(sys.argv[1])
for p in load_puzzles(tiers=["medium", "hard"], split="train"):
    (out / p.tier).mkdir(exist_ok=True)
    shutil.copy(p.path, out / p.tier / p.path.name)
forged = json.loads(Path("outputs/transfer/train.json").read_text())
wanted = set(forged["puzzles"][::4][:int(sys.argv[2])])  # one puzzle per function (the file lists 4 each)
for p in load_puzzles(Path(forged["puzzle_dir"])):
    if p.id in wanted:
        (out / p.tier).mkdir(exist_ok=True)
        shutil.copy(p.path, out / p.tier / p.path.name)
PY
  mv "$pool.tmp" "$pool"
fi
[ -f outputs/qwen05/train.json ] || mlx-swe-rl rollouts --model "$model" --puzzles "$pool" -G 8 --temperature 0.8 \
  --max-tokens 192 --batch-size 64 --rounds 4 --out outputs/qwen05/calibration.json --write-train-set outputs/qwen05/train.json

k=${K:-1}
set_args() {
  case $1 in
    train) echo --puzzles outputs/qwen05/train.json -K 4 ;;
    heldout) echo --puzzles outputs/transfer/heldout.json -K "$k" ;;
    bundled) echo -K "$k" ;;
  esac
}
config=configs/qwen05.yaml
. scripts/experiment.sh

evaluate base none heldout bundled
for name in ${RUNS:-s0 s1}; do
  case $name in
    s0) train "$name" seed=0 ${STEPS:+train.steps=$STEPS} ;;
    s1) train "$name" seed=1 ${STEPS:+train.steps=$STEPS} ;;
    *) echo "qwen05.sh: unknown run '$name'" >&2; exit 2 ;;
  esac
  evaluate "$name" "$out/$name" heldout bundled
done
echo "done: python scripts/learn_report.py --experiment qwen05 --runs $out"
