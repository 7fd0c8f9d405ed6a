"""Collect a learning experiment into docs/results/NAME.json, a figure and the Markdown table
README "Results" shows, from the output directory of its experiment file: issue 14's
(configs/experiments/learn-stop.yaml, `--experiment learn`) or the issue "Learning that transfers"
(configs/experiments/transfer.yaml, `--experiment transfer`), or Qwen2.5-Coder-0.5B's GRPO runs
(configs/experiments/qwen05.yaml, `--experiment qwen05`).

Every change is paired over the same puzzles: after training minus the base model (each run), and
between two runs where the experiment names such a pair (on-policy minus frozen sampler, same seed
and steps), with 95% bootstrap CIs over puzzles; per tier or mutator family where it says so.

    python scripts/learn_report.py [--experiment learn] [--runs outputs/learn-stop] [--out docs/results] [--name learn]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

import mlx_swe_rl  # noqa: F401  (OpenBLAS preload before MLX; matplotlib is imported below)
from mlx_swe_rl.env.rewards import ANSWER_KINDS, answer_kind_shares
from mlx_swe_rl.puzzles.format import load_puzzles
from mlx_swe_rl.puzzles.trainset import load_train_set
from mlx_swe_rl.reports.figures import smooth
from mlx_swe_rl.runfiles import read_history
from mlx_swe_rl.rl.stats import compare_reports, paired_change
from mlx_swe_rl.runfiles import write_json_atomic

@dataclass(frozen=True)
class Experiment:
    """What one experiment file leaves: its runs, its evaluation sets (and the puzzle-set files
    behind them), the run pairs compared with each other, and the sets broken down by a field."""

    script: str  # the experiment file (`mlx-swe-rl experiment FILE` runs it)
    runs_dir: Path  # its output_dir: where its runs and evaluations are
    runs: tuple[str, ...]
    sets: dict[str, str]
    set_files: dict[str, Path]
    pairs: tuple[tuple[str, str], ...] = ()  # (before, after)
    breakdown: dict[str, str] = field(default_factory=dict)  # set -> puzzle field (tier, family)


EXPERIMENTS = {
    "learn": Experiment(
        script="configs/experiments/learn-stop.yaml",
        runs_dir=Path("outputs/learn-stop"),
        runs=("onpolicy-s0", "onpolicy-s1", "frozen-s0", "drgrpo-s0"),  # drgrpo-s0: a variant, stopped early
        sets={"train": "training puzzles (40 forged, mixed at calibration)",
              "heldout": "held-out functions (60 forged)",
              "bundled": "bundled hand-written puzzles (54)"},
        set_files={"train": Path("outputs/learn-train40.json"), "heldout": Path("outputs/forged-easy-heldout60.json")},
        pairs=(("frozen-s0", "onpolicy-s0"),)),
    "transfer": Experiment(
        script="configs/experiments/transfer.yaml",
        runs_dir=Path("outputs/transfer-runs"),
        runs=("narrow", "breadth-s0", "kl-s0", "long-s0", "breadth-s1"),  # narrow: the learn experiment's adapter
        sets={"train": "training puzzles (49 forged, 22 functions)",
              "valid": "validation functions (20 forged, 5 training-split functions not trained on)",
              "heldout": "held-out functions (136 forged, 2 of each of 68)",
              "bundled": "bundled hand-written puzzles (54)"},
        set_files={s: Path(f"outputs/transfer/{s}.json") for s in ("train", "valid", "heldout")},
        breakdown={"heldout": "family", "bundled": "tier"}),
    "qwen05": Experiment(
        script="configs/experiments/qwen05.yaml",
        runs_dir=Path("outputs/qwen05-runs"),
        runs=("grpo-s0", "grpo-s1"),  # scripts/qwen05.sh named them s0, s1 (docs/results/qwen05.json)
        sets={"heldout": "the transfer experiment's held-out functions (136 forged, 2 of each of 68)",
              "bundled": "bundled hand-written puzzles (54)"},
        set_files={"heldout": Path("outputs/transfer/heldout.json")},
        breakdown={"heldout": "family", "bundled": "tier"}),
}
CURVES = ("reward_mean", "entropy", "completion_len", "truncation_rate", "zero_var_frac", "step_s")


def load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def samples(report: dict[str, Any]) -> int:
    return report["settings"]["samples"]


def overall(report: dict[str, Any]) -> list[float]:
    """[avg@K, CI low, CI high] over every puzzle of an evaluation."""
    row = next(t for t in report["totals"] if t["tier"] == "all" and t["split"] == "all")
    return [row["pass@1"], *row["ci95"]]


def breakdown(before: dict[str, Any], after: dict[str, Any], key: str) -> dict[str, dict[str, Any]]:
    """Paired changes within each value of a puzzle field (`tier`, `family`) of two evaluations."""
    groups: dict[str, list[str]] = defaultdict(list)
    for row in before["puzzles"]:
        groups[str(row.get(key))].append(row["id"])
    rates = [{r["id"]: r["pass@1"] for r in report["puzzles"]} for report in (before, after)]
    return {value: paired_change(*({i: r[i] for i in ids if i in r} for r in rates))
            for value, ids in sorted(groups.items())}


def collect(runs_dir: Path, experiment: Experiment) -> dict[str, Any]:
    """Every paired change the experiment's files allow, and each run's step curves."""
    base = {s: load(runs_dir / f"eval-base-{s}.json") for s in experiment.sets}
    result: dict[str, Any] = {"script": experiment.script, "sets": {}, "levels": {"base": {}}, "runs": {},
                              "pairs": {}}
    for s, report in base.items():
        if report is not None:
            result["sets"][s] = {"about": experiment.sets[s], "samples": samples(report),
                                 "temperature": report["settings"]["temperature"],
                                 "max_tokens": report["settings"]["max_tokens"]}
            result["levels"]["base"][s] = overall(report)
    for run in experiment.runs:
        history = read_history(runs_dir / run, missing_ok=True)
        evaluations = {s: load(runs_dir / f"eval-{run}-{s}.json") for s in experiment.sets}
        if not history and not any(evaluations.values()):
            continue
        entry: dict[str, Any] = {"steps": len(history),
                                 "curves": {k: [h.get(k) for h in history] for k in CURVES},
                                 "train_hours": sum(h["step_s"] for h in history) / 3600, "change": {},
                                 "breakdown": {}}
        for s, before in base.items():
            after = evaluations[s]
            if before is not None and after is not None:
                entry["change"][s] = compare_reports(before, after)["all"]
                result["levels"].setdefault(run, {})[s] = overall(after)
                if s in experiment.breakdown:
                    entry["breakdown"][s] = breakdown(before, after, experiment.breakdown[s])
        result["runs"][run] = entry
    for first, second in experiment.pairs:
        for s in experiment.sets:
            before, after = (load(runs_dir / f"eval-{run}-{s}.json") for run in (first, second))
            if before is not None and after is not None:
                result["pairs"].setdefault(f"{second} minus {first}", {})[s] = compare_reports(before, after)["all"]
    return result


def first_block_rates(runs_dir: Path, experiment: Experiment) -> dict[str, dict[str, float]]:
    """How much of a change is answer format: the avg@K of each evaluation's completions cut
    after their first code block (SmolLM2 often follows a right fix with a wrong "alternative"
    block, and the answer is the last block), rescored in the sandbox, next to the recorded avg@K."""
    from mlx_swe_rl.env import CodeFixEnv
    from mlx_swe_rl.env.prompts import python_blocks

    out: dict[str, dict[str, float]] = {}
    for s, path in experiment.set_files.items():
        with CodeFixEnv(load_train_set(path)) as env:
            for run in ("base",) + experiment.runs:
                report = load(runs_dir / f"eval-{run}-{s}.json")
                if report is None:
                    continue
                items, owners = [], []
                for row in report["puzzles"]:
                    for c in row["completions"]:
                        blocks = python_blocks(c["text"])
                        items.append((row["id"], f"```python\n{blocks[0]}\n```" if blocks else c["text"]))
                        owners.append(row["id"])
                solved: dict[str, list[bool]] = {}
                for owner, verdict in zip(owners, env.score(items)):
                    solved.setdefault(owner, []).append(verdict.solved)
                rates = [sum(v) / len(v) for v in solved.values()]
                out.setdefault(run, {})[s] = {"recorded": overall(report)[0], "first_block": sum(rates) / len(rates)}
    return out


def answer_kinds(runs_dir: Path, experiment: Experiment) -> dict[str, dict[str, dict[str, float]]]:
    """What the answers did before and after training, per run and set: the share of completions
    of each kind (`rewards.answer_kind`: solved, no answer, the buggy code given back, an edit
    toward the fix, another edit), from the evaluations' recorded code and test outcomes."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for s in experiment.sets:
        path = experiment.set_files.get(s)
        puzzles = {p.id: p for p in (load_train_set(path) if path is not None else load_puzzles())}
        for run in ("base",) + experiment.runs:
            report = load(runs_dir / f"eval-{run}-{s}.json")
            if report is None:
                continue
            out.setdefault(run, {})[s] = answer_kind_shares(report["puzzles"], puzzles)
    return out


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def change_cell(c: dict[str, Any]) -> str:
    low, high = c["ci95"]
    return f"{100 * c['change']:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"


def markdown(result: dict[str, Any]) -> str:
    """The README table: avg@K before and after per run and set, the paired change with its CI."""
    lines = ["| run | puzzles | K | before | after | change, points [95% CI] | up / down |",
             "|---|---|---|---|---|---|---|"]
    rows = [(run, entry["change"]) for run, entry in result["runs"].items()] + list(result["pairs"].items())
    for label, changes in rows:
        for s, c in changes.items():
            lines.append(f"| {label} | {s} ({c['puzzles']}) | {result['sets'][s]['samples']} | {pct(c['before'])} | "
                         f"{pct(c['after'])} | {change_cell(c)} | {c['improved']} / {c['worsened']} |")
    return "\n".join(lines)


def figure(result: dict[str, Any], runs: tuple[str, ...], out: Path) -> Path:
    """Reward and entropy per step for each run; before/after avg@K per set with 95% CIs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_l, ax_e, ax_b) = plt.subplots(1, 4, figsize=(20, 4.2))
    color = {"base": "0.55", **{run: f"C{i}" for i, run in enumerate(runs)}}  # one colour per run in every panel
    for run, entry in result["runs"].items():
        steps = range(1, entry["steps"] + 1)
        ax_r.plot(steps, smooth(entry["curves"]["reward_mean"]), color=color[run], label=run)
        ax_r.plot(steps, entry["curves"]["reward_mean"], color=color[run], alpha=0.25)
        ax_l.plot(steps, entry["curves"]["completion_len"], color=color[run], label=run)
        ax_e.plot(steps, entry["curves"]["entropy"], color=color[run], label=run)
    ax_r.set(title="training reward (mean over the step's completions)", xlabel="step", ylabel="reward")
    ax_l.set(title="mean completion length (limit 192)", xlabel="step", ylabel="tokens")
    ax_e.set(title="policy entropy per loss token", xlabel="step", ylabel="nats")
    ax_r.legend(fontsize=8)
    labels = list(result["levels"]["base"])
    width = 0.8 / len(result["levels"])
    for i, (name, levels) in enumerate(result["levels"].items()):
        rows = [levels.get(s, [float("nan")] * 3) for s in labels]
        means = [100 * m for m, _, _ in rows]
        errs = [[100 * (m - lo) for m, lo, _ in rows], [100 * (hi - m) for m, _, hi in rows]]
        ax_b.bar([j + i * width for j in range(len(labels))], means, width, yerr=errs, capsize=3, label=name,
                 color=color[name])
    ax_b.set_xticks([j + width * (len(result["levels"]) - 1) / 2 for j in range(len(labels))],
                    [f"{s}\n(avg@{result['sets'][s]['samples']})" for s in labels])
    ax_b.set(title="pass rate before and after (%)", ylabel="avg@K, %")
    ax_b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def breakdown_lines(result: dict[str, Any]) -> list[str]:
    """One line per run and broken-down set: each tier's or family's change in points."""
    lines = []
    for run, entry in result["runs"].items():
        for s, groups in entry["breakdown"].items():
            cells = ", ".join(f"{value} {100 * c['change']:+.1f} ({c['puzzles']})" for value, c in groups.items())
            lines.append(f"  {run:<12} {s}: {cells}")
    return lines


@click.command()
@click.option("--experiment", "experiment_name", type=click.Choice(sorted(EXPERIMENTS)), default="learn",
              show_default=True)
@click.option("--runs", "runs_dir", type=click.Path(path_type=Path), default=None,
              help="The experiment's output directory (default: its file's output_dir).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("docs/results"), show_default=True)
@click.option("--name", default=None, help="Writes NAME.json and NAME.png (default: the experiment's name).")
def main(experiment_name: str, runs_dir: Path | None, out_dir: Path, name: str | None) -> None:
    experiment = EXPERIMENTS[experiment_name]
    runs_dir = runs_dir or experiment.runs_dir
    name = name or experiment_name
    first = next(iter(experiment.sets))
    if not (runs_dir / f"eval-base-{first}.json").is_file():
        sys.exit(f"{runs_dir}: no eval-base-{first}.json: run mlx-swe-rl experiment {experiment.script} first")
    result = collect(runs_dir, experiment)
    result["first_block"] = first_block_rates(runs_dir, experiment)
    result["answer_kinds"] = answer_kinds(runs_dir, experiment)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / f"{name}.json", result)
    figure(result, experiment.runs, out_dir / f"{name}.png")
    click.echo(markdown(result))
    lines = breakdown_lines(result)
    if lines:
        click.echo("\nchange per tier / mutator family, points (puzzles):")
        click.echo("\n".join(lines))
    click.echo("\navg@K as recorded / with every completion cut after its first code block (%):")
    for run, sets in result["first_block"].items():
        click.echo(f"  {run:<12} " + ", ".join(f"{s} {pct(v['recorded'])} / {pct(v['first_block'])}" for s, v in sets.items()))
    click.echo("\nshare of answers by kind (%): " + ", ".join(ANSWER_KINDS))
    for run, sets in result["answer_kinds"].items():
        for s, shares in sets.items():
            click.echo(f"  {run:<12} {s:<8} " + " ".join(f"{pct(v):>5}" for v in shares.values()))
    click.echo(f"wrote {out_dir / f'{name}.json'} and {out_dir / f'{name}.png'}")


if __name__ == "__main__":
    main()
