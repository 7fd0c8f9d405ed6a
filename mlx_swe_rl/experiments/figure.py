"""The report's figure: reward, completion length, KL and the share of answers that give the buggy
code back per step for every run (one colour per variant, one line style per seed), the reward
against the tokens each run sampled (settings that sample more per step, such as dynamic
sampling, compared per token spent), and every run's paired change from the base model per set
with its 95% CI. Drawn from report.json's numbers only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

STYLES = ("-", "--", ":", "-.")  # line style per seed
HATCHES = ("", "//", "..", "xx")  # bar hatch per seed


def draw(result: dict[str, Any], out: Path) -> Path:
    from ..reports.figures import plt, smooth  # matplotlib set up for files (Agg) in one place

    panels = (("reward_mean", "training reward (mean over the step's completions)", "reward"),
              ("completion_len", "mean completion length", "tokens"),
              ("kl", "KL to the reference", "nats"),
              ("unchanged", "answers that give the buggy code back", "share of completions"))
    fig, axes = plt.subplots(1, len(panels) + 2, figsize=(31, 4.4))
    variants = list(dict.fromkeys(entry["variant"] for entry in result["runs"].values()))
    seeds = sorted({entry["seed"] for entry in result["runs"].values()})
    for run, entry in result["runs"].items():
        colour, style = _look(entry, variants, seeds)
        for ax, (key, _, _) in zip(axes, panels):
            steps, shown = recorded(entry["curves"][key])
            if not steps:
                continue
            noisy = key in ("reward_mean", "unchanged")  # shares of one step's 32 answers: smoothed
            ax.plot(steps, smooth(shown) if noisy else shown, style, color=colour, label=run,
                    marker="o", markersize=3)  # markers: a one-step run still shows
    for ax, (key, title, unit) in zip(axes, panels):
        ax.set(title=title, xlabel="step", ylabel=unit)
        ax.grid(alpha=0.3)
        if not ax.lines:
            ax.text(0.5, 0.5, "nothing recorded" + (" (grpo.beta 0 skips the KL)" if key == "kl" else ""),
                    ha="center", va="center", transform=ax.transAxes)
    axes[0].legend(fontsize=8)
    _per_token(axes[-2], result, variants, seeds)
    _changes(axes[-1], result, variants, seeds)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _look(entry: dict[str, Any], variants: list[str], seeds: list[int]) -> tuple[str, str]:
    """A run's colour (its variant's) and line style (its seed's), the same in every panel."""
    return f"C{variants.index(entry['variant'])}", STYLES[seeds.index(entry["seed"]) % len(STYLES)]


def recorded(values: list[float | None]) -> tuple[list[int], list[float]]:
    """The steps (from 1) of a per-step curve that recorded a value, and those values. None is a
    step with nothing recorded: beta 0 records no KL, and a step with no group to learn from
    makes no update, so no KL either. Those steps are left out, not the whole curve."""
    points = [(step, v) for step, v in enumerate(values, 1) if v is not None]
    return [s for s, _ in points], [v for _, v in points]


def _per_token(ax: Any, result: dict[str, Any], variants: list[str], seeds: list[int]) -> None:
    """Each run's reward (smoothed) against the model tokens it had sampled by that step."""
    from ..reports.figures import smooth

    for run, entry in result["runs"].items():
        curves = entry["curves"]
        points = [(t, r) for t, r in zip(curves.get("tokens_total", []), curves["reward_mean"])
                  if t is not None and r is not None]  # histories from before tokens_total have no place here
        if points:
            colour, style = _look(entry, variants, seeds)
            ax.plot([t for t, _ in points], smooth([r for _, r in points]), style, color=colour, label=run,
                    marker="o", markersize=3)
    ax.set(title="training reward per sampled token", xlabel="model tokens sampled (cumulative)", ylabel="reward")
    ax.grid(alpha=0.3)
    if not ax.lines:
        ax.text(0.5, 0.5, "nothing recorded", ha="center", va="center", transform=ax.transAxes)


def _changes(ax: Any, result: dict[str, Any], variants: list[str], seeds: list[int]) -> None:
    """Each run's paired change per set (points) with its 95% CI, coloured as its curves; then
    each evaluation-only variant's (an adapter made elsewhere), in colours of their own."""
    sets = list(result["sets"])
    runs = [(run, entry) for run, entry in result["runs"].items() if entry["change"]]
    runs += [(name, entry) for name, entry in result["evaluated"].items() if entry["change"]]
    colours = variants + [entry["variant"] for _, entry in runs if entry["variant"] not in variants]
    width = 0.8 / max(len(runs), 1)
    for i, (run, entry) in enumerate(runs):
        rows = [entry["change"].get(s) for s in sets]
        xs = [j + i * width for j, row in enumerate(rows) if row]
        means = [100 * row["change"] for row in rows if row]
        errs = [[100 * (row["change"] - row["ci95"][0]) for row in rows if row],
                [100 * (row["ci95"][1] - row["change"]) for row in rows if row]]
        hatch = HATCHES[seeds.index(entry["seed"]) % len(HATCHES)] if "seed" in entry else ""
        ax.bar(xs, means, width, yerr=errs, capsize=3, label=run, color=f"C{colours.index(entry['variant'])}",
               hatch=hatch, edgecolor="white")
    ax.axhline(0, color="0.3", linewidth=0.8)
    ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(sets))],
                  [f"{s}\n(avg@{result['sets'][s]['samples']})" for s in sets])
    ax.set(title="paired change from the base model (points, 95% CI)", ylabel="points")
    if runs:
        ax.legend(fontsize=7)
