"""Collect the mine experiment (configs/experiments/mine.yaml) into docs/results/mine.json and the
README table: the funnel of `puzzles mine` (numbers only: the mined code is the repository's), and SmolLM2's
reward on the held-out (newest) mined tasks before and after GRPO on the training tasks, paired
per task with 95% bootstrap intervals: SWE-RL's similarity on tasks without tests, pass@1 on
tasks with tests, how often answers were format failures, and every answer rescored with the
`progress` reward.

    python scripts/mine_report.py [--mined outputs/mined] [--runs outputs/mine-experiment] [--run similarity-s0]
        [--out docs/results]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

import mlx_swe_rl  # noqa: F401  (OpenBLAS preload before MLX)
from mlx_swe_rl.env.rewards import Completion, progress_reward
from mlx_swe_rl.puzzles.format import Puzzle, load_puzzles
from mlx_swe_rl.rl.stats import paired_change
from mlx_swe_rl.runfiles import read_history, write_json_atomic


def per_task(report: dict[str, Any], puzzles: dict[str, Puzzle]) -> dict[str, dict[str, float]]:
    """Each measure's value per held-out task. The evaluation's own rewards (`similarity` where a
    task has no tests), and every answer rescored with `progress`, which neither deleting the
    body nor an edit elsewhere can earn: how much of a similarity gain is a step toward the fix."""
    rows = report["puzzles"]
    untested = [r for r in rows if not puzzles[r["id"]].tests]

    progress = {r["id"]: [progress_reward(Completion(puzzles[r["id"]], c["code"], None)) for c in r["completions"]]
                for r in untested}

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    return {
        "similarity (tasks without tests)": {r["id"]: r["mean_reward"] for r in untested},
        "progress, rescored (tasks without tests)": {i: mean(v) for i, v in progress.items()},
        "progress of well-formed answers": {i: mean(kept) for i, v in progress.items() if (kept := [x for x in v if x >= 0])},
        "pass@1 (tasks with tests)": {r["id"]: r["pass@1"] for r in rows if puzzles[r["id"]].tests},
        "answers scoring -1 (no code, no parse, no entry point)": {
            r["id"]: mean([float(c["reward"] == -1.0) for c in r["completions"]]) for r in untested},
        "exact fixes": {r["id"]: r["pass@1"] for r in untested},
    }


@click.command()
@click.option("--mined", type=click.Path(path_type=Path), default=Path("outputs/mined"), show_default=True)
@click.option("--runs", type=click.Path(path_type=Path), default=Path("outputs/mine-experiment"), show_default=True)
@click.option("--run", "run", default="similarity-s0", show_default=True,
              help="The training run (the removed scripts/mine_experiment.sh named it `mined`).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("docs/results"), show_default=True)
def main(mined: Path, runs: Path, run: str, out_dir: Path) -> None:
    summary = json.loads((mined / "mine.json").read_text())
    puzzles = {p.id: p for p in load_puzzles(mined)}
    before = json.loads((runs / "eval-base-heldout.json").read_text())
    after_path = runs / f"eval-{run}-heldout.json"
    result: dict[str, Any] = {"repository": {k: v for k, v in summary["repository"].items() if k != "path"},
                              "funnel": summary["funnel"], "tasks": summary["tasks"], "timing": summary["timing"],
                              "before": {k: sum(v.values()) / len(v) for k, v in per_task(before, puzzles).items() if v}}
    steps = read_history(runs / run, missing_ok=True)
    if steps:
        result["training"] = {"steps": len(steps), "reward_mean": [s["reward_mean"] for s in steps],
                              "completion_len": [s["completion_len"] for s in steps],
                              "step_s": sum(s["step_s"] for s in steps) / len(steps),
                              "peak_memory_gb": max(s["peak_memory_gb"] for s in steps)}
    if after_path.is_file():
        after = json.loads(after_path.read_text())
        b, a = per_task(before, puzzles), per_task(after, puzzles)
        result["change"] = {k: paired_change(b[k], a[k]) for k in b if b[k]}
    write_json_atomic(out_dir / "mine.json", result)
    click.echo("| rule | dropped | left |\n|---|---|---|")
    left = summary["funnel"]["commits"]
    for rule, dropped in summary["funnel"].items():
        if rule not in ("commits", "kept"):
            left -= dropped
            click.echo(f"| {rule} | {dropped:,} | {left:,} |")
    for k, c in result.get("change", {}).items():
        click.echo(f"| {k} | {c['before']:.3f} | {c['after']:.3f} | {c['change']:+.3f} [{c['ci95'][0]:+.3f}, "
                   f"{c['ci95'][1]:+.3f}] | {c['improved']} / {c['worsened']} | {c['puzzles']} |")
    click.echo(f"wrote {out_dir / 'mine.json'}")


if __name__ == "__main__":
    main()
