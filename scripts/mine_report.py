"""Collect scripts/mine_experiment.sh into docs/results/mine.json and the README table: the
funnel of `puzzles mine` (numbers only: the mined code is the repository's), and SmolLM2's
reward on the held-out (newest) mined tasks before and after GRPO on the training tasks, paired
per task with 95% bootstrap intervals: SWE-RL's similarity on tasks without tests, pass@1 on
tasks with tests, and how often answers were format failures.

    python scripts/mine_report.py [--mined outputs/mined] [--runs outputs/mine-experiment] [--out docs/results]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

import mlx_swe_rl  # noqa: F401  (OpenBLAS preload before MLX)
from mlx_swe_rl.puzzles.format import load_puzzles
from mlx_swe_rl.rl.stats import paired_change
from mlx_swe_rl.runfiles import write_json_atomic


def per_task(report: dict[str, Any], tested: set[str]) -> dict[str, dict[str, float]]:
    rows = report["puzzles"]
    return {
        "similarity (tasks without tests)": {r["id"]: r["mean_reward"] for r in rows if r["id"] not in tested},
        "pass@1 (tasks with tests)": {r["id"]: r["pass@1"] for r in rows if r["id"] in tested},
        "format failures": {r["id"]: sum(not c["format_ok"] for c in r["completions"]) / len(r["completions"])
                            for r in rows},
        "exact fixes": {r["id"]: r["pass@1"] for r in rows if r["id"] not in tested},
    }


@click.command()
@click.option("--mined", type=click.Path(path_type=Path), default=Path("outputs/mined"), show_default=True)
@click.option("--runs", type=click.Path(path_type=Path), default=Path("outputs/mine-experiment"), show_default=True)
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("docs/results"), show_default=True)
def main(mined: Path, runs: Path, out_dir: Path) -> None:
    summary = json.loads((mined / "mine.json").read_text())
    tested = {p.id for p in load_puzzles(mined) if p.tests}
    before = json.loads((runs / "eval-base-heldout.json").read_text())
    after_path = runs / "eval-mined-heldout.json"
    result: dict[str, Any] = {"repository": {k: v for k, v in summary["repository"].items() if k != "path"},
                              "funnel": summary["funnel"], "tasks": summary["tasks"], "timing": summary["timing"],
                              "before": {k: sum(v.values()) / len(v) for k, v in per_task(before, tested).items() if v}}
    history = runs / "mined" / "history.jsonl"
    if history.is_file():
        steps = [json.loads(line) for line in history.read_text().splitlines() if line.strip()]
        result["training"] = {"steps": len(steps), "reward_mean": [s["reward_mean"] for s in steps],
                              "completion_len": [s["completion_len"] for s in steps],
                              "step_s": sum(s["step_s"] for s in steps) / len(steps),
                              "peak_memory_gb": max(s["peak_memory_gb"] for s in steps)}
    if after_path.is_file():
        after = json.loads(after_path.read_text())
        b, a = per_task(before, tested), per_task(after, tested)
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
