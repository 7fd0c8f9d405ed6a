"""Greedy solve rates of the built-in models side by side, from `mlx-swe-rl eval` reports:
per bundled tier, on the transfer experiment's forged held-out functions, with tokens/s and the
MLX peak of each evaluation. Writes docs/results/models.json.

    python scripts/models_report.py outputs/models-eval/*.json outputs/qwen05-runs/eval-base-*.json \
        --out docs/results/models.json
"""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command()
@click.argument("reports", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True)
def main(reports: tuple[Path, ...], out: Path) -> None:
    rows = []
    for path in reports:
        report = json.loads(path.read_text())
        if report["settings"]["samples"] != 1 or report["settings"]["temperature"] != 0:
            continue  # greedy reports only
        totals = {f"{t['tier']}/{t['split']}": {"solved": t["any_solved"], "puzzles": t["puzzles"]}
                  for t in report["totals"] if "tier" in t}
        rows.append({"model": report["meta"]["model"], "report": path.name, "solved": totals, "tokens_per_s": round(report["timing"]["tokens_per_second"], 1),
                     "peak_memory_gb": round(report["timing"]["peak_memory_gb"], 2),
                     "seconds": round(report["timing"]["seconds"], 1)})
        line = ", ".join(f"{k} {v['solved']}/{v['puzzles']}" for k, v in totals.items() if k.endswith("/all"))
        click.echo(f"{rows[-1]['model']:<20} {path.name:<36} {line}; {rows[-1]['tokens_per_s']} tok/s, "
                   f"{rows[-1]['peak_memory_gb']} GB")
    out.write_text(json.dumps({"about": "greedy (temperature 0), 192 new tokens, answers end at their fence; "
                               "float32 on this machine's 2 cores, which other runs shared for most of these evaluations (tokens/s "
                               "are not benchmarks)", "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
