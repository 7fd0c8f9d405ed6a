"""Add a finished quick-start run to docs/results/quickstart.json under NAME: the paired avg@4
change from before training, the calibration, and the per-step curves from history.jsonl.

    python scripts/quickstart_report.py [--run outputs/quickstart] --name NAME
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

import mlx_swe_rl  # noqa: F401  (OpenBLAS preload before MLX)
from mlx_swe_rl.runfiles import read_history, write_json_atomic

CURVES = ("completion_len", "truncation_rate", "reward_mean", "step_s", "peak_memory_gb")


def run_entry(run: Path) -> dict[str, Any]:
    """The figures of one quick-start run directory, read from its own files."""
    for name in ("eval-after.json", "history.jsonl"):
        if not (run / name).is_file():
            raise click.ClickException(f"{run / name}: missing (is the run finished, with train.final_eval?)")
    after = json.loads((run / "eval-after.json").read_text())
    if "change_vs_before" not in after:
        raise click.ClickException(f"{run / 'eval-after.json'}: no change_vs_before (no eval-before.json?)")
    history = read_history(run)
    entry: dict[str, Any] = {"change_vs_before": after["change_vs_before"], "settings": after.get("settings", {}),
                             **{key: [h[key] for h in history] for key in CURVES}}
    calibration = run / "calibration.json"
    if calibration.is_file():
        entry["calibration"] = json.loads(calibration.read_text())["categories"]
    entry["train_minutes"] = sum(h["step_s"] for h in history) / 60
    return entry


@click.command()
@click.option("--run", type=click.Path(path_type=Path, exists=True, file_okay=False),
              default=Path("outputs/quickstart"), show_default=True)
@click.option("--name", required=True, help="key of this run in the results file")
@click.option("--out", type=click.Path(path_type=Path), default=Path("docs/results/quickstart.json"),
              show_default=True)
def main(run: Path, name: str, out: Path) -> None:
    results = json.loads(out.read_text()) if out.is_file() else {}
    results[name] = run_entry(run)
    write_json_atomic(out, results)
    change = results[name]["change_vs_before"]["all"]
    click.echo(f"{name}: avg@4 {100 * change['before']:.1f} -> {100 * change['after']:.1f}, "
               f"{100 * change['change']:+.1f} [{100 * change['ci95'][0]:+.1f}, {100 * change['ci95'][1]:+.1f}], "
               f"{change['improved']} up / {change['worsened']} down; wrote {out}")


if __name__ == "__main__":
    main()
