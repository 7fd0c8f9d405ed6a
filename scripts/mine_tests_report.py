"""The FAIL_TO_PASS results: the miner's funnel (every rule, then every reason a repository-test
candidate was dropped and the modules its tests missed), the FAIL_TO_PASS tasks per split, the
timings, and each model's pass rate on the FAIL_TO_PASS tasks of each split from `mlx-swe-rl eval`
reports (a model may have one report per split). Writes docs/results/mine-tests.json; nothing in
it is typed by hand.

    python scripts/mine_tests_report.py --mined outputs/mined-f2p \
        --eval smollm2-135m=outputs/eval/f2p-heldout-smollm2-135m.json \
        --eval smollm2-135m=outputs/eval/f2p-train-smollm2-135m.json ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlx_swe_rl.env.rewards import answer_kind_shares  # noqa: E402
from mlx_swe_rl.puzzles.format import Puzzle, load_puzzles  # noqa: E402
from mlx_swe_rl.puzzles.repotests import repo_tests  # noqa: E402
from mlx_swe_rl.rl.stats import bootstrap_ci  # noqa: E402


def task_counts(mined: Path) -> dict:
    """FAIL_TO_PASS tasks and their functions per split, and the sizes of their test sets."""
    tasks = [p for p in load_puzzles(mined) if repo_tests(p) is not None]
    out = {}
    for split in ("train", "heldout"):
        chosen = [p for p in tasks if p.split == split]
        out[split] = {"tasks": len(chosen),
                      "functions": len({(p.source["path"], p.source["qualname"]) for p in chosen}),
                      "fail_to_pass_tests": sum(len(repo_tests(p).fail_to_pass) for p in chosen),
                      "pass_to_pass_tests": sum(len(repo_tests(p).pass_to_pass) for p in chosen)}
    return out


def pass_rate(report: dict, ids: set[str], puzzles: dict[str, Puzzle]) -> dict | None:
    """Mean pass@1 (avg@K) with its 95% bootstrap interval over the tasks of `ids` an eval report
    holds (None when it holds none); a task is "mixed" when some of its K answers pass and some fail.
    `answer_kinds`: what the answers did (solved, no answer, the buggy code given back, ...)."""
    rows = [r for r in report["puzzles"] if r["id"] in ids]
    if not rows:
        return None
    mean, low, high = bootstrap_ci([r["pass@1"] for r in rows])
    return {"tasks": len(rows), "samples": rows[0]["samples"], "pass@1": mean, "ci95": [low, high],
            "tasks_solved_once": sum(r["solved"] > 0 for r in rows), "answers_solved": sum(r["solved"] for r in rows),
            "answers": sum(r["samples"] for r in rows),
            "tasks_mixed": sum(0 < r["solved"] < r["samples"] for r in rows),
            "per_task": {r["id"]: r["solved"] for r in rows},
            "answer_kinds": answer_kind_shares(rows, puzzles), "settings": report["settings"],
            "seconds": round(report["timing"]["seconds"], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mined", type=Path, required=True, help="the directory `puzzles mine` wrote")
    parser.add_argument("--eval", action="append", default=[], metavar="MODEL=PATH",
                        help="an `mlx-swe-rl eval` report on FAIL_TO_PASS tasks (repeat: one per model and split)")
    parser.add_argument("--note", default="", help="how the timings were measured (the machine, what else ran)")
    parser.add_argument("--out", type=Path, default=Path("docs/results/mine-tests.json"))
    args = parser.parse_args()
    summary = json.loads((args.mined / "mine.json").read_text())
    if not summary.get("repo_tests"):
        raise SystemExit(f"{args.mined}: mined without repository tests")
    tasks = [p for p in load_puzzles(args.mined) if repo_tests(p) is not None]
    splits = {split: {p.id for p in tasks if p.split == split} for split in ("train", "heldout")}
    data = {
        "repository": {k: summary["repository"][k] for k in ("name", "head", "licence")},
        "settings": summary["settings"],
        "funnel": summary["funnel"],
        "repo_tests": summary["repo_tests"],
        "fail_to_pass_tasks": task_counts(args.mined),
        "timing": {"mine_seconds": summary["timing"]["seconds"],
                   "repo_tests_seconds": summary["repo_tests"]["seconds"],
                   "seconds_per_pytest_run": summary["repo_tests"]["seconds_per_run"],
                   "note": args.note},
        "base_pass_rates": {},
    }
    for item in args.eval:
        model, _, path = item.partition("=")
        report = json.loads(Path(path).read_text())
        rates = {split: rate for split, ids in splits.items()
                 if (rate := pass_rate(report, ids, {p.id: p for p in tasks})) is not None}
        if not rates:
            raise SystemExit(f"{path}: holds none of the FAIL_TO_PASS tasks of {args.mined}")
        data["base_pass_rates"].setdefault(model, {}).update(rates)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps({k: data[k] for k in ("repo_tests", "fail_to_pass_tasks", "timing", "base_pass_rates")}, indent=1))


if __name__ == "__main__":
    main()
