"""Collect the answer-end experiment (configs/experiments/answer-end.yaml) into
docs/results/answer-end.json and the README tables: the base model's evaluations with the
answer-end stop (eval-base-SET.json) and without it (eval-full-SET.json, the variant `full`),
paired per puzzle, with their token counts, truncation and time. A set is named SET-kK.

    python scripts/answer_end_report.py [--runs outputs/answer-end] [--out docs/results]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

import mlx_swe_rl  # noqa: F401  (OpenBLAS preload before MLX)
from mlx_swe_rl.rl.stats import compare_reports
from mlx_swe_rl.runfiles import write_json_atomic

SETS = {"easy-medium": "bundled easy + medium tiers (36), 384 tokens",
        "train": "the learn experiment's training puzzles (40)",
        "heldout": "the learn experiment's held-out puzzles (60)", "bundled": "all bundled puzzles (54)"}


def summary(report: dict[str, Any]) -> dict[str, Any]:
    completions = [c for r in report["puzzles"] for c in r["completions"]]
    return {"completions": len(completions),
            "tokens_per_completion": sum(c["num_tokens"] for c in completions) / len(completions),
            "truncated": sum(c["truncated"] for c in completions) / len(completions),
            "stopped": sum(c.get("finish") == "stop" for c in completions) / len(completions),
            "solved": sum(r["solved"] for r in report["puzzles"]),
            "puzzles_solved": sum(r["solved"] > 0 for r in report["puzzles"]),
            "generated_tokens": report["timing"]["generated_tokens"],
            "seconds": report["timing"]["seconds"], "sampling_seconds": report["timing"]["sampling_seconds"],
            "tokens_per_second": report["timing"]["tokens_per_second"]}


@click.command()
@click.option("--runs", type=click.Path(path_type=Path), default=Path("outputs/answer-end"), show_default=True)
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("docs/results"), show_default=True)
def main(runs: Path, out_dir: Path) -> None:
    result: dict[str, Any] = {}
    lines = ["| set | K | tokens per completion (full -> stop) | truncated | generated tokens | sampling s | "
             "avg@K full -> stop | change, points [95% CI] | up / down |", "|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(runs.glob("eval-full-*.json")):
        name = path.name[len("eval-full-"):-len(".json")]  # SET-kK
        stop_path = runs / f"eval-base-{name}.json"
        if not stop_path.is_file():
            continue
        full, stop = json.loads(path.read_text()), json.loads(stop_path.read_text())
        change = compare_reports(full, stop)["all"]
        entry = {"full": summary(full), "stop": summary(stop), "change": change}
        result[name] = entry
        f, s = entry["full"], entry["stop"]
        set_name, k = name.rsplit("-k", 1)
        lines.append(f"| {SETS.get(set_name, set_name)} | {k} | {f['tokens_per_completion']:.0f} -> "
                     f"{s['tokens_per_completion']:.0f} | {100 * f['truncated']:.0f}% -> {100 * s['truncated']:.0f}% | "
                     f"{f['generated_tokens']:,} -> {s['generated_tokens']:,} "
                     f"({s['generated_tokens'] / f['generated_tokens']:.2f}x) | {f['sampling_seconds']:.0f} -> "
                     f"{s['sampling_seconds']:.0f} | {100 * change['before']:.1f} -> {100 * change['after']:.1f} | "
                     f"{100 * change['change']:+.1f} [{100 * change['ci95'][0]:+.1f}, {100 * change['ci95'][1]:+.1f}] | "
                     f"{change['improved']} / {change['worsened']} |")
    write_json_atomic(out_dir / "answer-end.json", result)
    click.echo("\n".join(lines))
    click.echo(f"wrote {out_dir / 'answer-end.json'}")


if __name__ == "__main__":
    main()
