#!/usr/bin/env bash
# Issue "Learning that transfers", its data step: the whole forged training split (151 functions
# in 14 mutator families) and the bundled training puzzles, calibrated for SmolLM2-135M (G = 8,
# T = 0.8, 192 tokens, rounds of 2 that stop a puzzle once it is mixed, completions ending at the
# answer) in chunks of 100 puzzles, each kept when done, so an interrupted run resumes where it
# stopped. Writes outputs/transfer/mixed.json (every mixed puzzle) and prints how many functions
# and families it covers. About 1.5 hours on a 2-core CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
out=outputs/transfer
mkdir -p "$out"
[ -d outputs/forged ] || mlx-swe-rl puzzles forge --out outputs/forged --per-seed 5
[ -f "$out/train.json" ] || mlx-swe-rl puzzles sample outputs/forged -n 755 --split train --seed 0 --out "$out/train.json"
python - <<'PY'
import json
from pathlib import Path
from mlx_swe_rl.puzzles.trainset import load_train_set, write_train_set
out = Path("outputs/transfer")
puzzles = load_train_set(out / "train.json")
for k in range(0, len(puzzles), 100):
    chunk = out / f"chunk-{k // 100:02d}.json"
    if not chunk.exists():
        write_train_set(chunk, puzzles[k:k + 100], Path("outputs/forged"), {"chunk": k // 100})
PY
for chunk in "$out"/chunk-*.json; do
  report=${chunk%.json}-rollouts.json
  [ -f "$report" ] || mlx-swe-rl rollouts --model smollm2-135m --puzzles "$chunk" -G 8 --temperature 0.8 \
    --max-tokens 192 --batch-size 64 --rounds 2 --out "$report" > /dev/null
done
[ -f "$out/bundled-rollouts.json" ] || mlx-swe-rl rollouts --model smollm2-135m --split train -G 8 --temperature 0.8 \
  --max-tokens 192 --batch-size 64 --rounds 2 --out "$out/bundled-rollouts.json" > /dev/null
python - <<'PY'
import json
from collections import Counter
from pathlib import Path
from mlx_swe_rl.puzzles.format import load_puzzles
out = Path("outputs/transfer")
forged = {p.id: p for p in load_puzzles(Path("outputs/forged"))}
rows = [r for f in sorted(out.glob("chunk-*-rollouts.json")) for r in json.loads(f.read_text())["puzzles"]]
mixed = [forged[r["id"]] for r in rows if r["category"] == "mixed"]
functions = Counter(p.id.split("__")[0] for p in mixed)
families = Counter(p.family for p in mixed)
bundled = [r["id"] for r in json.loads((out / "bundled-rollouts.json").read_text())["puzzles"] if r["category"] == "mixed"]
summary = {"calibrated": len(rows), "mixed": len(mixed), "functions": len(functions), "families": dict(families),
           "per_function": dict(functions), "bundled_mixed": bundled,
           "categories": dict(Counter(r["category"] for r in rows))}
(out / "mixed-summary.json").write_text(json.dumps(summary, indent=1))
(out / "mixed.json").write_text(json.dumps({"puzzle_dir": str(Path("outputs/forged").resolve()),
                                            "puzzles": [p.id for p in mixed], "source": {"calibration": "chunks"}}))
print(f"{len(mixed)} of {len(rows)} forged training puzzles mixed, from {len(functions)} functions in "
      f"{len(families)} families; {len(bundled)} bundled training puzzles mixed")
PY
