"""Collect the multi-turn experiment (configs/experiments/multi-turn.yaml) into
docs/results/multi-turn.json and the results table, in the committed result's format.

Every comparison is paired over the same puzzles with a 95% bootstrap interval: each run after
training against the base model, multi-turn training against single-turn training at equal
sampled tokens, detailed feedback against the generic ablation, and two-answer episodes against
the best of two independent answers. Rates: the share of a puzzle's episodes solved (hidden
tests) by their first answer ("turn 1") and within both answers ("within 2").

    python scripts/multi_turn_report.py [--runs outputs/multi-turn] [--out docs/results]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

import mlx_swe_rl  # noqa: F401  (OpenBLAS preload before MLX)
from mlx_swe_rl.rl.stats import paired_change
from mlx_swe_rl.runfiles import read_history, write_json_atomic

# the committed result's names -> the experiment's (its runs and evaluation-only variants)
RUNS = {"base": "base", "multi-turn": "multi-turn-s0", "single-turn": "single-turn-s0"}
GENERIC = {"base": "generic", "multi-turn": "multi-turn-generic"}  # told only that the answer failed
SETS = ("train", "heldout")


def load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def rates(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per puzzle: the share of episodes solved at turn 1 and within all turns."""
    first = {r["id"]: sum(c["turns"][0]["solved"] for c in r["completions"]) / len(r["completions"])
             for r in report["puzzles"]}
    return {"turn 1": first, "within 2": {r["id"]: r["pass@1"] for r in report["puzzles"]}}


def best_of(report: dict[str, Any]) -> dict[str, float]:
    return {p["id"]: p["solved"] / p["samples"] for p in report["best_of_n"]["puzzles"]}


def training(run_dir: Path) -> dict[str, Any] | None:
    history = read_history(run_dir, missing_ok=True)
    if not history:
        return None
    n = 40  # 5 puzzles x G = 8 episodes per step
    return {"steps": len(history), "sampled_tokens": round(sum(h["completion_len"] * n for h in history)),
            "answers_per_episode": sum(h.get("turns", 1) for h in history) / len(history),
            "step_s": sum(h["step_s"] for h in history) / len(history),
            "step_s_per_step": [h["step_s"] for h in history],
            "peak_memory_gb": max(h["peak_memory_gb"] for h in history),
            "reward_mean": [h["reward_mean"] for h in history]}


def collect(runs: Path) -> dict[str, Any]:
    evals = {(run, s): load(runs / f"eval-{name}-{s}.json") for run, name in RUNS.items() for s in SETS}
    result: dict[str, Any] = {"levels": {}, "changes": {}, "training": {}}
    for (run, s), report in evals.items():
        if report is not None:
            r = rates(report)
            result["levels"].setdefault(run, {})[s] = {k: sum(v.values()) / len(v) for k, v in r.items()}
            result["levels"][run][s]["multi_turn"] = report["multi_turn"]

    def pair(name: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
        if before is not None and after is not None:
            rb, ra = rates(before), rates(after)
            result["changes"][name] = {k: paired_change(rb[k], ra[k]) for k in rb}

    for s in SETS:
        for run in ("multi-turn", "single-turn"):
            pair(f"{run} vs base, {s}", evals[("base", s)], evals[(run, s)])
        pair(f"multi-turn vs single-turn, {s}", evals[("single-turn", s)], evals[("multi-turn", s)])
    for run, name in GENERIC.items():
        generic = load(runs / f"eval-{name}-train.json")
        pair(f"{run}: detailed vs generic feedback, train", generic, evals[(run, "train")])
    best = load(runs / "eval-base-train-best.json")
    if best is not None and evals[("base", "train")] is not None:
        result["changes"]["base: 2-answer episodes vs best of 2 independent, train"] = {
            "within 2": paired_change(best_of(best), rates(evals[("base", "train")])["within 2"])}
        result["best_of_2_tokens"] = best["best_of_n"]["generated_tokens"]
        result["episodes_tokens"] = evals[("base", "train")]["timing"]["generated_tokens"]
    for run in ("multi-turn", "single-turn"):
        result["training"][run] = training(runs / RUNS[run])
    return result


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def markdown(result: dict[str, Any]) -> str:
    lines = ["| comparison | rate | before | after | change, points [95% CI] | up / down |", "|---|---|---|---|---|---|"]
    for name, rows in result["changes"].items():
        for rate, c in rows.items():
            lines.append(f"| {name} | {rate} | {pct(c['before'])} | {pct(c['after'])} | {100 * c['change']:+.1f} "
                         f"[{100 * c['ci95'][0]:+.1f}, {100 * c['ci95'][1]:+.1f}] | {c['improved']} / {c['worsened']} |")
    return "\n".join(lines)


@click.command()
@click.option("--runs", type=click.Path(path_type=Path), default=Path("outputs/multi-turn"), show_default=True)
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("docs/results"), show_default=True)
def main(runs: Path, out_dir: Path) -> None:
    result = collect(runs)
    write_json_atomic(out_dir / "multi-turn.json", result)
    click.echo(markdown(result))
    for run, t in result["training"].items():
        if t:
            click.echo(f"{run}: {t['steps']} steps, {t['sampled_tokens']} sampled tokens, "
                       f"{t['answers_per_episode']:.2f} answers per episode, {t['step_s']:.1f} s/step, "
                       f"peak {t['peak_memory_gb']:.2f} GB")
    for run, sets in result["levels"].items():
        for s, m in sets.items():
            mt = m["multi_turn"]
            click.echo(f"{run} {s}: fix rate {mt['fix_rate']}, break rate {mt['break_rate']}, identical "
                       f"resubmissions {mt['identical_resubmissions']}, dropped {mt['dropped']}")
    click.echo(f"wrote {out_dir / 'multi-turn.json'}")


if __name__ == "__main__":
    main()
