#!/usr/bin/env bash
# The issue "Learning that transfers", end to end and resumable: the data (scripts/transfer_data.py,
# from the committed calibrations), the base model's avg@K on four sets, each configuration's run
# of configs/transfer.yaml and its evaluations paired with the base model's. Rerun it after an
# interruption: finished pieces are kept, a stopped run resumes from its last checkpoint.
#   RUNS   which configurations, in order (default: all of those below)
#   NARROW the learn experiment's adapter to evaluate beside them (default outputs/learn-stop/onpolicy-s0, if present)
#   OUT    where runs and evaluations go (default outputs/transfer-runs)
#   SETS   the evaluation sets (default: train valid heldout bundled)
# Configurations are compared on the training reward and the validation functions (never on the
# held-out ones); held-out and bundled evaluations come after a run's validation.
# Then: python scripts/learn_report.py --experiment transfer --runs "$OUT"
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-outputs/transfer-runs}
mkdir -p "$out"
quiet=${QUIET:+--quiet}

[ -d outputs/forged ] || mlx-swe-rl puzzles forge --out outputs/forged --per-seed 5
[ -d outputs/forged-easy ] || mlx-swe-rl puzzles forge puzzles/easy --out outputs/forged-easy --per-seed 30 --heldout-frac 0
[ -f outputs/transfer/data.json ] || python scripts/transfer_data.py

# The puzzles and K of each evaluation set (scripts/experiment.sh: evaluate, train).
set_args() {
  case $1 in
    train|valid) echo --puzzles "outputs/transfer/$1.json" -K 8 ;;
    heldout) echo --puzzles outputs/transfer/heldout.json -K 4 ;;
    bundled) echo -K 4 ;;
  esac
}
config=configs/transfer.yaml
. scripts/experiment.sh

# run NAME KEY=VALUE...: a run of configs/transfer.yaml under $out/NAME (resumed if started), then its evaluations.
run() {
  train "$@"
  evaluate "$1" "$out/$1" $sets
}

sets=${SETS:-train valid heldout bundled}
evaluate base none $sets
for name in ${RUNS:-breadth-s0 kl-s0 long-s0 breadth-s1}; do
  case $name in
    breadth-s0) run "$name" seed=0 ;;                                    # the settings of the learn experiment, more functions
    kl-s0) run "$name" seed=0 grpo.beta=0.04 ;;                          # a KL term to the base model
    long-s0) run "$name" seed=0 train.steps=48 ;;                        # twice the visits per puzzle
    breadth-s1) run "$name" seed=1 ;;                                    # the second seed
    learnable-s0|learnable-s1)                                           # the issue "No wasted groups": the most learnable puzzles by online pass rate
      run "$name" seed="${name##*-s}" train.order=learnable ;;
    dynamic-s0|dynamic-s1)                                               # ... and all-equal groups replaced (DAPO's dynamic sampling);
      run "$name" seed="${name##*-s}" train.order=learnable train.dynamic_sampling.enabled=true train.steps=12 ;;  # 12 steps: about the tokens of 24
    *) echo "transfer.sh: unknown configuration '$name'" >&2; exit 2 ;;
  esac
done
narrow=${NARROW:-outputs/learn-stop/onpolicy-s0}
[ ! -f "$narrow/adapters.safetensors" ] || evaluate narrow "$narrow" ${sets/train/}
echo "done: python scripts/learn_report.py --experiment transfer --runs $out"
