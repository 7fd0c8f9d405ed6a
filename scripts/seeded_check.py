"""Does a run reproduce a committed seeded history, step for step?

The safety net of every change that should keep behaviour: a seeded run gives the same reward and
completion length at every step when rerun on the same machine, and the committed SmolLM2 runs
matched across a Xeon and an EPYC (one 1.5B run parted at step 22 across machines, not traced:
docs/experiments.md). This compares a
run directory's history.jsonl with the per-step curves a results file under docs/results/ keeps,
prints one line per step and a verdict, and exits 1 when any step differs.

    python scripts/seeded_check.py outputs/transfer-runs/breadth-s0 --results docs/results/transfer.json --run breadth-s0
    python scripts/seeded_check.py outputs/quickstart --results docs/results/quickstart.json \
        --run "stop_after_answer (the quick start, 2026-12-01)"
    python scripts/seeded_check.py outputs/learn-stop/onpolicy-s0 --results docs/results/learn-stop.json --run onpolicy-s0

Or against another run directory (a reference run of the code before a change, same config):

    python scripts/seeded_check.py /tmp/after/mt --against /tmp/before/mt
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlx_swe_rl.runfiles import RunFileError, read_history  # noqa: E402

KEYS = ("reward_mean", "completion_len")  # what the sampler, the scorer and the update all move
TOLERANCE = 1e-9  # the committed numbers went through JSON: exact up to float printing


def committed_curves(results: dict, run: str) -> dict[str, list[float]]:
    """The per-step curves of `run` in a results file: `runs[run].curves` (learn_report.py) or
    the run's own entry holding the curves (quickstart_report.py)."""
    entry = results.get("runs", {}).get(run) or results.get(run)
    if entry is None:
        raise SystemExit(f"no run {run!r} in the results file (runs: {sorted(results.get('runs', results))})")
    curves = entry.get("curves", entry)
    missing = [k for k in KEYS if not isinstance(curves.get(k), list)]
    if missing:
        raise SystemExit(f"run {run!r} keeps no per-step {', '.join(missing)}")
    return {k: curves[k] for k in KEYS}


def compare(history: list[dict], curves: dict[str, list[float]]) -> list[tuple[int, dict[str, tuple[float, float]]]]:
    """(step, {key: (committed, now)} for the keys that differ) for every committed step the run reached."""
    rows = []
    for i in range(min(len(history), len(curves[KEYS[0]]))):
        diffs = {k: (curves[k][i], history[i][k]) for k in KEYS
                 if not math.isclose(curves[k][i], history[i][k], rel_tol=0.0, abs_tol=TOLERANCE)}
        rows.append((history[i]["step"], diffs))
    return rows


def run_curves(history: list[dict]) -> dict[str, list[float]]:
    """The per-step curves of a run's own history (a reference run to compare with)."""
    return {k: [h[k] for h in history] for k in KEYS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--results", type=Path, help="a docs/results/*.json file")
    parser.add_argument("--run", help="the run's name in that file")
    parser.add_argument("--against", type=Path, help="instead: a reference run directory")
    args = parser.parse_args()
    if (args.against is None) == (args.results is None) or (args.results is not None) != (args.run is not None):
        parser.error("give --results FILE --run NAME, or --against RUN_DIR")
    try:
        history = read_history(args.run_dir)
        curves = (run_curves(read_history(args.against)) if args.against is not None
                  else committed_curves(json.loads(args.results.read_text()), args.run))
    except RunFileError as exc:
        raise SystemExit(str(exc)) from None
    rows = compare(history, curves)
    for step, diffs in rows:
        now = history[step - 1]
        line = "  ".join(f"{k} {now[k]:.6g}" for k in KEYS)
        print(f"step {step:3d}  {line}  " + ("equal" if not diffs else "DIFFERS: " + ", ".join(
            f"{k} committed {a:.6g}" for k, (a, _) in diffs.items())))
    differing = [step for step, diffs in rows if diffs]
    total = len(curves[KEYS[0]])
    print(f"{len(rows)} of {total} committed steps compared; "
          + (f"{len(differing)} differ (first: step {differing[0]})" if differing else "all equal"))
    sys.exit(1 if differing or len(rows) < total else 0)


if __name__ == "__main__":
    main()
