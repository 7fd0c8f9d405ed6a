"""The issue "No wasted groups", collected into docs/results/NAME.json and NAME.png: runs of the
transfer experiment (configs/experiments/no-wasted-groups.yaml) with other puzzle orders or dynamic sampling, against
today's epoch order, per sampled token.

Per run, from its history only: the share of sampled groups whose answers all scored alike (no
gradient), the groups the loss read per 100k sampled tokens and the training reward, over the
whole run and at the largest token count every run reached (equal sampled tokens). From its
evaluations: the paired change of avg@K from the base model on each set with its 95% CI, and that
change per 100k sampled tokens and per training hour. Nothing in the files is typed by hand.

Runs come from run directories (their evaluations beside them: DIR/../eval-RUN-SET.json, paired
with eval-base-SET.json) or from a committed results file of the same experiment
(`--committed docs/results/transfer.json:breadth-s0,breadth-s1`): its per-step curves and paired
changes. Its sampled tokens per step are the mean episode length times the episodes per step of
the first run directory's config (the same configs/transfer.yaml). An earlier report of this
script is read back the same way (`--committed docs/results/no-wasted-groups.json:dynamic-s0`):
its steps, whole-run totals and paired changes as written, so a second seed can join the first
on a machine where the first one's run directory is gone.

    python scripts/groups_report.py outputs/no-wasted-groups/{learnable-s0,dynamic-s0,dynamic-s1} \
        --committed docs/results/transfer.json:breadth-s0,breadth-s1 --out docs/results/no-wasted-groups
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

import mlx_swe_rl  # noqa: E402,F401  (OpenBLAS preload before MLX)
from mlx_swe_rl.rl.stats import compare_reports  # noqa: E402
from mlx_swe_rl.runfiles import RunFileError, read_history, write_json_atomic  # noqa: E402

SETS = ("valid", "heldout", "bundled")
# What a report keeps of each step: enough to read the run back as a committed one later
# (`--committed REPORT.json:RUN`) when its run directory is gone.
PER_STEP = ("step", "tokens_total", "sampled_tokens", "extra_tokens", "groups_sampled", "groups_kept",
            "extra_groups", "reward_mean", "step_s", "puzzles")


def settings(run_dir: Path) -> dict[str, Any]:
    """What distinguishes the runs: seed, steps, order, dynamic sampling."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    t = cfg["train"]
    return {"seed": cfg["seed"], "steps": t["steps"], "puzzles_per_step": t["puzzles_per_step"],
            "group_size": cfg["sampling"]["group_size"], "order": t.get("order", "epoch"),
            "dynamic_sampling": t.get("dynamic_sampling", {"enabled": False})}


def committed_history(curves: dict[str, list[float]], puzzles_per_step: int, group_size: int) -> list[dict]:
    """A committed run's steps with the fields a history written today has: with no dynamic
    sampling every step sampled `puzzles_per_step` groups of `group_size` episodes, so its
    sampled tokens are the mean episode length times their number, and its kept groups the
    share with reward variance."""
    history, tokens = [], 0
    for i, (length, zero_var) in enumerate(zip(curves["completion_len"], curves["zero_var_frac"])):
        sampled = round(length * puzzles_per_step * group_size)
        tokens += sampled
        history.append({"step": i + 1, "reward_mean": curves["reward_mean"][i], "step_s": curves["step_s"][i],
                        "groups_sampled": puzzles_per_step, "groups_kept": round((1 - zero_var) * puzzles_per_step),
                        "extra_groups": 0, "sampled_tokens": sampled, "extra_tokens": 0, "tokens_total": tokens})
    return history


def upto(history: list[dict], tokens: float) -> list[dict]:
    """The steps whose cumulative sampled tokens stay within `tokens` (the first step always)."""
    return [h for i, h in enumerate(history) if i == 0 or h["tokens_total"] <= tokens]


def total(steps: list[dict], key: str) -> float | None:
    """The sum of `key` over `steps`, or None when a step does not record it (a run read back
    from a report written before its per-step records kept it)."""
    values = [h.get(key) for h in steps]
    return None if None in values else sum(values)


def totals(steps: list[dict]) -> dict[str, Any]:
    """Waste, kept groups per 100k sampled tokens, reward and time over `steps`."""
    hours = total(steps, "step_s")
    sampled = sum(h["groups_sampled"] for h in steps)
    kept = sum(h["groups_kept"] for h in steps)
    tokens = steps[-1]["tokens_total"]
    return {"steps": len(steps), "sampled_tokens": tokens, "groups_sampled": sampled, "groups_kept": kept,
            "wasted_share": 1 - kept / sampled, "kept_per_100k_tokens": 1e5 * kept / tokens,
            "extra_groups": sum(h.get("extra_groups", 0) for h in steps),
            "extra_tokens": total(steps, "extra_tokens"),
            "steps_over_10pct_wasted": sum(h["groups_kept"] < 0.9 * h["groups_sampled"] for h in steps),
            "mean_reward": sum(h["reward_mean"] for h in steps) / len(steps),
            "last_4_reward": sum(h["reward_mean"] for h in steps[-4:]) / len(steps[-4:]),
            "hours": None if hours is None else hours / 3600}


def per_token(change: dict[str, Any], tokens: int, hours: float) -> dict[str, Any]:
    """A paired change with its CI, and the same per 100k sampled tokens and per training hour."""
    low, high = change["ci95"]
    return {**change, "per_100k_tokens": [1e5 * x / tokens for x in (change["change"], low, high)],
            "per_hour": [x / hours for x in (change["change"], low, high)] if hours else None}


def load_runs(dirs: list[Path], committed: list[str]) -> dict[str, dict[str, Any]]:
    """name -> {history, settings, changes} for each run directory and committed run."""
    runs: dict[str, dict[str, Any]] = {}
    for run_dir in dirs:
        try:
            history = read_history(run_dir)
        except RunFileError as exc:
            raise SystemExit(str(exc)) from None
        if not history or "tokens_total" not in history[-1]:
            raise SystemExit(f"{run_dir}: its history has no sampled-token counts (written before they existed)")
        changes = {}
        for s in SETS:
            before, after = (run_dir.parent / f"eval-{name}-{s}.json" for name in ("base", run_dir.name))
            if before.is_file() and after.is_file():
                changes[s] = compare_reports(json.loads(before.read_text()), json.loads(after.read_text()))["all"]
        runs[run_dir.name] = {"history": history, "settings": settings(run_dir), "changes": changes,
                              "source": str(run_dir)}
    shape = next(iter(runs.values()))["settings"] if runs else None
    for spec in committed:
        path, _, names = spec.partition(":")
        if shape is None:
            raise SystemExit("--committed needs a run directory first (its config gives the episodes per step)")
        data = json.loads(Path(path).read_text())
        for name in names.split(","):
            if name not in data.get("runs", {}):
                raise SystemExit(f"{path}: no run '{name}'")
            entry = data["runs"][name]
            changes = {s: c for s, c in entry["change"].items() if s in SETS}
            if "per_step" in entry:  # an earlier report of this script: its steps and whole-run totals as written
                runs[name] = {"history": entry["per_step"], "settings": entry["settings"], "changes": changes,
                              "whole": entry["whole_run"], "source": path}
                continue
            runs[name] = {"history": committed_history(entry["curves"], shape["puzzles_per_step"], shape["group_size"]),
                          "settings": {**shape, "seed": None, "order": "epoch", "dynamic_sampling": {"enabled": False}},
                          "changes": changes, "source": path}
    return runs


def setting_of(name: str) -> str:
    """A run's setting: its name without the seed suffix (dynamic-s1 -> dynamic)."""
    head, sep, seed = name.rpartition("-s")
    return head if sep and seed.isdigit() else name


def by_setting(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each setting's seeds side by side and their means: waste and informative groups per update
    at equal sampled tokens, and each set's paired change (points) and change per 100k tokens.
    The seeds' spread is kept beside the mean: with two seeds it is the honest error bar."""
    out: dict[str, dict[str, Any]] = {}
    for name, run in runs.items():
        entry = out.setdefault(setting_of(name), {"runs": [], "wasted_share": [], "kept_per_update": [], "change": {}})
        equal = run["at_equal_tokens"]
        entry["runs"].append(name)
        entry["wasted_share"].append(equal["wasted_share"])
        entry["kept_per_update"].append(equal["groups_kept"] / equal["steps"])
        for s, c in run["change"].items():
            entry["change"].setdefault(s, {"change": [], "per_100k_tokens": []})
            entry["change"][s]["change"].append(c["change"])
            entry["change"][s]["per_100k_tokens"].append(c["per_100k_tokens"][0])
    for entry in out.values():
        entry["mean"] = {"wasted_share": mean(entry["wasted_share"]), "kept_per_update": mean(entry["kept_per_update"]),
                         **{s: {k: mean(v) for k, v in c.items()} for s, c in entry["change"].items()}}
    return out


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def markdown(data: dict[str, Any]) -> str:
    """README's tables: waste per run (whole run and at equal sampled tokens), then each paired
    change with its CI and per 100k sampled tokens."""
    lines = [f"| run | steps | sampled tokens | hours | groups wasted | kept per 100k tokens | at {data['equal_tokens']:,} "
             "tokens: steps, wasted, training reward |", "|---|---|---|---|---|---|---|"]
    for name, run in data["runs"].items():
        w, e = run["whole_run"], run["at_equal_tokens"]
        lines.append(f"| {name} | {w['steps']} | {w['sampled_tokens']:,} | {w['hours']:.2f} | {100 * w['wasted_share']:.0f}% "
                     f"({w['groups_sampled'] - w['groups_kept']} of {w['groups_sampled']}) | {w['kept_per_100k_tokens']:.1f} | "
                     f"{e['steps']}, {100 * e['wasted_share']:.0f}%, {e['mean_reward']:.3f} |")
    lines += ["", "| run | set | before | after | change, points [95% CI] | per 100k sampled tokens | up / down |",
              "|---|---|---|---|---|---|---|"]
    for name, run in data["runs"].items():
        for s, c in run["change"].items():
            low, high = c["ci95"]
            k = c["per_100k_tokens"]
            before = f"{100 * c['before']:.1f}" if "before" in c else "n/a"
            after = f"{100 * c['after']:.1f}" if "after" in c else "n/a"
            lines.append(f"| {name} | {s} ({c['puzzles']}) | {before} | {after} | {100 * c['change']:+.1f} "
                         f"[{100 * low:+.1f}, {100 * high:+.1f}] | {100 * k[0]:+.1f} [{100 * k[1]:+.1f}, {100 * k[2]:+.1f}] | "
                         f"{c.get('improved', '?')} / {c.get('worsened', '?')} |")
    lines += ["", f"| setting | seeds | at {data['equal_tokens']:,} tokens: wasted, groups in the loss per update | "
              + " | ".join(f"{s}: mean change (seeds); per 100k tokens" for s in SETS) + " |",
              "|---|---|---|" + "---|" * len(SETS)]
    for setting, entry in data["by_setting"].items():
        m = entry["mean"]
        cells = [f"{100 * m[s]['change']:+.1f} ({', '.join(f'{100 * x:+.1f}' for x in entry['change'][s]['change'])}); "
                 f"{100 * m[s]['per_100k_tokens']:+.1f}" if s in entry["change"] else "n/a" for s in SETS]
        lines.append(f"| {setting} | {len(entry['runs'])} | {100 * m['wasted_share']:.0f}%, {m['kept_per_update']:.1f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(runs: dict[str, dict[str, Any]], equal: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.9))
    for i, (name, run) in enumerate(runs.items()):
        history = run["history"]
        x = [h["tokens_total"] / 1e3 for h in history]
        kept, cumulative = 0, []
        for h in history:
            kept += h["groups_kept"]
            cumulative.append(kept)
        style = {"color": f"C{i}", "marker": ".", "label": name, "linestyle": "--" if run["source"].endswith(".json") else "-"}
        axes[0].plot(x, [1 - h["groups_kept"] / h["groups_sampled"] for h in history], **style)
        axes[1].plot(x, cumulative, **style)
        axes[2].plot(x, [h["reward_mean"] for h in history], **style)
    titles = ("share of the step's sampled groups wasted", "groups in the loss (cumulative)", "training reward")
    for ax, title in zip(axes, titles):
        ax.axvline(equal / 1e3, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("sampled tokens (thousands)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].axhline(0.1, color="red", linewidth=0.8, alpha=0.5)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (their names label them)")
    parser.add_argument("--committed", action="append", default=[], metavar="FILE:RUN,RUN",
                        help="runs from a committed results file of the same experiment")
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.png")
    parser.add_argument("--note", default=None, help="how the runs were made (kept in OUT.json: e.g. shared cores)")
    args = parser.parse_args()
    runs = load_runs(args.runs, args.committed)
    equal = min(run["history"][-1]["tokens_total"] for run in runs.values())
    data: dict[str, Any] = {"script": "scripts/groups_report.py", "note": args.note, "equal_tokens": equal, "runs": {}}
    for name, run in runs.items():
        whole = run.get("whole") or totals(run["history"])
        data["runs"][name] = {
            "source": run["source"], "settings": run["settings"], "whole_run": whole,
            "at_equal_tokens": totals(upto(run["history"], equal)),
            "change": {s: per_token(c, whole["sampled_tokens"], whole["hours"]) for s, c in run["changes"].items()},
            "per_step": [{k: h.get(k) for k in PER_STEP if k in h} for h in run["history"]]}
    data["by_setting"] = by_setting(data["runs"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out.with_suffix(".json"), data)
    figure(runs, equal, args.out.with_suffix(".png"))
    print(markdown(data))
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
