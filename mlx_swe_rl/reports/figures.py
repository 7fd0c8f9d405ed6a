"""Figures drawn from recorded files only (history.jsonl, eval JSON, rollouts JSON).

Every number on a chart comes from those files; each figure carries a footer naming the
model, the config and the date, and is written as PNG and PDF.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ..runfiles import HISTORY, read_history

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402

CATEGORY_COLOURS = {"all-solved": "#2a9d8f", "mixed": "#e9c46a", "all-failed": "#e76f51"}
TIER_ORDER = ("easy", "medium", "hard")


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def smooth(values: Sequence[float], weight: float = 0.6) -> list[float]:
    """Exponential moving average (TensorBoard style), for a readable trend line."""
    out, last = [], None
    for v in values:
        last = v if last is None else weight * last + (1 - weight) * v
        out.append(last)
    return out


def label(model: str, config: str, date: str | None = None) -> str:
    return f"model: {model}  |  config: {config}  |  {date or datetime.now().strftime('%Y-%m-%d')}"


def run_label(run_dir: Path) -> str:
    """Footer text for a run: its model spec, config file and the date of its last record."""
    import yaml

    cfg = yaml.safe_load((Path(run_dir) / "config.yaml").read_text()) if (Path(run_dir) / "config.yaml").is_file() else {}
    model = (cfg.get("model") or {}).get("spec", "?")
    stamp = datetime.fromtimestamp((Path(run_dir) / HISTORY).stat().st_mtime).strftime("%Y-%m-%d")
    return label(model, f"{Path(run_dir).name}/config.yaml", stamp)


def _save(fig: plt.Figure, out: Path, footer: str) -> list[Path]:
    fig.tight_layout(rect=(0, 0.05, 1, 1))  # leave a strip at the bottom for the footer
    fig.text(0.01, 0.005, footer, fontsize=7, color="#555555", ha="left", va="bottom")
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [out.with_suffix(".png"), out.with_suffix(".pdf")]
    for path in paths:
        fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return paths


# The x-axes a curve can be drawn against: the step, or the model tokens sampled so far
# (`tokens_total`: learning per sampled token, which is what dynamic sampling spends more of).
X_AXES = {"step": "step", "tokens": "tokens_total"}
X_LABELS = {"step": "step", "tokens": "model tokens sampled (cumulative)"}


def _series(history: list[dict[str, Any]], key: str, x: str = "step") -> tuple[list[int], list[float]]:
    """(x, value) of the records that have both: records written before `tokens_total` existed
    have no place on a token axis."""
    points = [(h[X_AXES[x]], h[key]) for h in history if h.get(key) is not None and h.get(X_AXES[x]) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def has_tokens(history: list[dict[str, Any]]) -> bool:
    """Whether a history can be drawn against sampled tokens."""
    return any(h.get(X_AXES["tokens"]) is not None for h in history)


def training_curve(history: list[dict[str, Any]], out: Path, footer: str, x: str = "step") -> list[Path]:
    """Figure 1: reward mean and solve rate per step (raw and smoothed), loss and KL below;
    `x="tokens"` draws them against the model tokens sampled so far."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=[3, 2])
    for key, colour in (("reward_mean", "#264653"), ("solve_rate", "#2a9d8f")):
        steps, values = _series(history, key, x)
        top.plot(steps, values, "o", color=colour, alpha=0.35, markersize=3)
        top.plot(steps, smooth(values), "-", color=colour, label=f"{key} (smoothed)")
    top.set_ylabel("per step")
    top.set_title("GRPO training" + (" per sampled token" if x == "tokens" else ""))
    top.legend(loc="best", fontsize=8)
    top.grid(alpha=0.3)
    steps, loss = _series(history, "loss", x)
    bottom.plot(steps, loss, "-", color="#e76f51", label="loss")
    bottom.set_ylabel("loss")
    bottom.set_xlabel(X_LABELS[x])
    bottom.grid(alpha=0.3)
    steps_kl, kl = _series(history, "kl", x)
    if kl:
        twin = bottom.twinx()
        twin.plot(steps_kl, kl, "-", color="#8d99ae", label="KL (k3)")
        twin.set_ylabel("KL")
        twin.legend(loc="upper right", fontsize=8)
    bottom.legend(loc="upper left", fontsize=8)
    return _save(fig, out, footer)


def _pass_rates(report: dict[str, Any]) -> dict[tuple[str, str], float]:
    return {(t["tier"], t["split"]): t["pass@1"] for t in report["totals"] if "tier" in t}


def _error_bars(report: dict[str, Any], tiers: list[str], split: str,
                heights: list[float]) -> list[list[float]] | None:
    """Distances from each bar's top to its 95% CI ends (None for reports without CIs)."""
    cis = {(t["tier"], t["split"]): t["ci95"] for t in report["totals"] if "tier" in t and "ci95" in t}
    if not cis:
        return None
    ends = [cis.get((t, split), [h, h]) for t, h in zip(tiers, heights)]
    return [[max(0.0, h - low) for (low, _), h in zip(ends, heights)],
            [max(0.0, high - h) for (_, high), h in zip(ends, heights)]]


def before_after(before: dict[str, Any], after: dict[str, Any], out: Path, footer: str) -> list[Path]:
    """Figure 2: pass rate per tier (greedy, or avg@K), train vs held-out, before and after
    training, with 95% bootstrap intervals over puzzles as error bars where the reports have them."""
    b, a = _pass_rates(before), _pass_rates(after)
    tiers = [t for t in (*TIER_ORDER, "all") if (t, "all") in a or (t, "all") in b]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8), sharey=True)
    width = 0.38
    for ax, split in zip(axes, ("train", "heldout")):
        xs = range(len(tiers))
        vb = [b.get((t, split), 0.0) for t in tiers]
        va = [a.get((t, split), 0.0) for t in tiers]
        ax.bar([x - width / 2 for x in xs], vb, width, label="before", color="#8d99ae",
               yerr=_error_bars(before, tiers, split, vb), capsize=3)
        ax.bar([x + width / 2 for x in xs], va, width, label="after", color="#2a9d8f",
               yerr=_error_bars(after, tiers, split, va), capsize=3)
        for x, v in zip(xs, vb):
            ax.text(x - width / 2, v + 0.01, f"{v:.2f}", ha="center", fontsize=7)
        for x, v in zip(xs, va):
            ax.text(x + width / 2, v + 0.01, f"{v:.2f}", ha="center", fontsize=7)
        ax.set_xticks(list(xs), tiers)
        ax.set_title(f"{split} puzzles")
        ax.set_ylim(0, 1.05)
        ax.grid(axis="y", alpha=0.3)
    samples = after.get("settings", {}).get("samples", 1)
    axes[0].set_ylabel("greedy pass rate" if samples == 1 else f"avg@{samples} (95% CI)")
    axes[0].legend(fontsize=8)
    return _save(fig, out, footer)


def rollout_analysis(rollouts: dict[str, Any], out: Path, footer: str) -> list[Path]:
    """Figure 3: per-puzzle solve rate at temperature, coloured by category, and the
    advantages of one mixed group."""
    rows = rollouts["puzzles"]
    settings = rollouts.get("settings", {})
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, max(3.5, 0.18 * len(rows))),
                                      width_ratios=[3, 2])
    ys = range(len(rows))
    left.barh(list(ys), [r["solve_rate"] for r in rows],
              color=[CATEGORY_COLOURS[r["category"]] for r in rows])
    left.set_yticks(list(ys), [r["id"] for r in rows], fontsize=6)
    left.invert_yaxis()
    left.set_xlim(0, 1)
    left.set_xlabel(f"solve rate (G={settings.get('group_size', '?')}, T={settings.get('temperature', '?')})")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in CATEGORY_COLOURS.values()]
    counts = rollouts.get("categories", {})
    left.legend(handles, [f"{k} ({counts.get(k, 0)})" for k in CATEGORY_COLOURS], fontsize=7, loc="lower right")
    mixed = [r for r in rows if r["category"] == "mixed"]
    if mixed:
        group = mixed[0]
        adv = group["advantages"]
        right.bar(range(len(adv)), adv, color=["#2a9d8f" if a > 0 else "#e76f51" for a in adv])
        right.axhline(0, color="black", linewidth=0.8)
        for i, reward in enumerate(group["rewards"]):
            right.text(i, 0, f"r={reward:g}", ha="center", va="bottom" if adv[i] < 0 else "top", fontsize=7)
        right.set_title(f"advantages of one mixed group: {group['id']}", fontsize=9)
        right.set_xlabel("completion")
    else:
        right.text(0.5, 0.5, "no mixed group: no learning signal", ha="center", va="center")
        right.set_axis_off()
    return _save(fig, out, footer)


def puzzle_changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list[str]]:
    """Puzzle ids newly solved, regressed, solved in both and in neither (greedy: solved > 0)."""
    b = {r["id"]: r["solved"] > 0 for r in before["puzzles"]}
    a = {r["id"]: r["solved"] > 0 for r in after["puzzles"]}
    common = [pid for pid in a if pid in b]
    return {
        "newly_solved": [p for p in common if a[p] and not b[p]],
        "regressed": [p for p in common if b[p] and not a[p]],
        "kept": [p for p in common if a[p] and b[p]],
        "never": [p for p in common if not a[p] and not b[p]],
    }


def changes_figure(before: dict[str, Any], after: dict[str, Any], out: Path, footer: str) -> list[Path]:
    """Figure 4: which puzzles were newly solved and which regressed."""
    changes = puzzle_changes(before, after)
    split = {r["id"]: r["split"] for r in after["puzzles"]}
    fig, ax = plt.subplots(figsize=(8, 4))
    columns = [("newly_solved", "#2a9d8f"), ("regressed", "#e76f51"), ("kept", "#8d99ae")]
    for x, (key, colour) in enumerate(columns):
        ids = changes[key]
        ax.bar(x, len(ids), color=colour)
        text = "\n".join(f"{pid}{' (held-out)' if split.get(pid) == 'heldout' else ''}" for pid in ids[:14])
        if len(ids) > 14:
            text += f"\n... {len(ids) - 14} more"
        ax.text(x, len(ids) + 0.1, text or "none", ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(columns)), [f"{k.replace('_', ' ')} ({len(changes[k])})" for k, _ in columns])
    ax.set_ylabel("puzzles (greedy)")
    top = max([len(changes[k]) for k, _ in columns] + [1])
    ax.set_ylim(0, top * 2 + 2)
    ax.set_title(f"per-puzzle changes ({len(changes['never'])} solved neither before nor after)")
    return _save(fig, out, footer)


def run_figures(run_dir: Path, out_dir: Path | None = None, eval_before: Path | None = None,
                eval_after: Path | None = None, rollouts: Path | None = None) -> list[Path]:
    """Every figure the files of a run allow; returns the paths written."""
    run_dir = Path(run_dir)
    out_dir = out_dir or run_dir / "figures"
    footer = run_label(run_dir)
    history = read_history(run_dir)
    written = training_curve(history, out_dir / "training_curve", footer)
    if has_tokens(history):
        written += training_curve(history, out_dir / "training_curve_tokens", footer, x="tokens")
    eval_before = eval_before or (run_dir / "eval-before.json")
    eval_after = eval_after or (run_dir / "eval-after.json")
    if Path(eval_before).is_file() and Path(eval_after).is_file():
        before, after = read_json(eval_before), read_json(eval_after)
        written += before_after(before, after, out_dir / "before_after", footer)
        written += changes_figure(before, after, out_dir / "puzzle_changes", footer)
    if rollouts is not None:
        written += rollout_analysis(read_json(rollouts), out_dir / "rollouts", footer)
    return written


def architecture(out: Path) -> list[Path]:
    """The data flow of one training step, drawn as boxes and arrows (README "How it works")."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    boxes = {  # name: (x, y, text)
        "puzzles": (0.06, 0.80, "puzzles/*.yaml\npuzzles/ (validated)"),
        "prompts": (0.32, 0.80, "env/prompts.py\nchat template"),
        "sampler": (0.58, 0.80, "models/sampling.py\nG completions / prompt\n(prompt KV shared)"),
        "sandbox": (0.84, 0.80, "sandbox/\ntests in confined\nprocesses"),
        "rewards": (0.84, 0.45, "env/rewards.py\nreward per completion"),
        "grpo": (0.58, 0.45, "rl/grpo.py\ngroup advantages,\nclipped loss + beta k3"),
        "logprobs": (0.32, 0.45, "rl/policy.py\nlog-probs: policy,\nreference (adapters off)"),
        "policy": (0.06, 0.45, "the policy (MLX)\nbase weights + LoRA"),
        "update": (0.58, 0.12, "rl/trainer.py\nAdamW update,\ncheckpoint, history"),
    }
    arrows = [("puzzles", "prompts"), ("prompts", "sampler"), ("sampler", "sandbox"), ("sandbox", "rewards"),
              ("rewards", "grpo"), ("logprobs", "grpo"), ("grpo", "update"), ("update", "policy"),
              ("policy", "sampler"), ("policy", "logprobs")]
    fig, ax = plt.subplots(figsize=(10, 5.2))
    ax.set_xlim(-0.06, 0.96)
    ax.set_ylim(0, 1)
    ax.set_axis_off()
    for name, (x, y, text) in boxes.items():
        colour = "#e9f5f3" if name != "policy" else "#fdf3d8"
        ax.add_patch(FancyBboxPatch((x - 0.1, y - 0.08), 0.2, 0.16, boxstyle="round,pad=0.01",
                                    facecolor=colour, edgecolor="#264653"))
        ax.text(x, y, text, ha="center", va="center", fontsize=8)
    def edge(x: float, y: float, dx: float, dy: float) -> tuple[float, float]:
        # Where the ray from a box centre in direction (dx, dy) leaves the box.
        t = min(0.105 / abs(dx) if dx else float("inf"), 0.085 / abs(dy) if dy else float("inf"))
        return x + t * dx, y + t * dy

    for a, b in arrows:
        (xa, ya, _), (xb, yb, _) = boxes[a], boxes[b]
        start, end = edge(xa, ya, xb - xa, yb - ya), edge(xb, yb, xa - xb, ya - yb)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color="#264653"))
    ax.set_title("One on-policy GRPO step: the model that samples is the model being trained", fontsize=10)
    return _save(fig, out, "mlx-swe-rl architecture (drawn by mlx_swe_rl.reports.figures.architecture)")
