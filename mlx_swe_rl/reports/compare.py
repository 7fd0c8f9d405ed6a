"""Comparison experiments: several training runs that differ in one thing.

A comparison file names a base config, overrides shared by all variants, and the variants'
own overrides (`key.sub: value`, as with `--set`):

    name: onpolicy-vs-frozen
    base: configs/quickstart.yaml
    overrides: {train.steps: 8}
    variants:
      on_policy: {sampling.mode: on_policy}
      frozen: {sampling.mode: frozen}

Each variant runs in `<output_dir>/<name>/<variant>/` with the same seed and puzzles. A
finished variant is not rerun and an interrupted one is resumed. The summary (final greedy
pass rates on train and held-out puzzles, regressions, wall time, peak memory) is written as
Markdown and JSON next to a figure of the reward curves.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..rl.config import Config, ConfigError, as_assignments, load_config, read_yaml_mapping
from ..rl.stats import compare_reports


@dataclass
class Comparison:
    name: str
    base: Path | None
    overrides: dict[str, Any]
    variants: dict[str, dict[str, Any]]
    output_dir: Path


def load_comparison(path: Path) -> Comparison:
    """Read and check a comparison file; errors are one line naming the file and key."""
    data = read_yaml_mapping(path)
    unknown = set(data) - {"name", "base", "overrides", "variants", "output_dir"}
    if unknown:
        raise ConfigError(f"{path}: {sorted(unknown)[0]}: unknown key (valid: name, base, overrides, variants, output_dir)")
    variants = data.get("variants")
    if not isinstance(variants, dict) or len(variants) < 2:
        raise ConfigError(f"{path}: variants: expected a mapping of at least two named variants")
    for key in ("overrides", *(f"variants.{v}" for v in variants)):
        value = data.get("overrides") if key == "overrides" else variants[key.split(".", 1)[1]]
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"{path}: {key}: expected a mapping of key.sub: value")
    base = data.get("base")
    base_path = None if base is None else (Path(base) if Path(base).is_file() else Path(path).parent / base)
    if base_path is not None and not base_path.is_file():
        raise ConfigError(f"{path}: base: no such config file '{base}'")
    comparison = Comparison(str(data.get("name") or Path(path).stem), base_path, data.get("overrides") or {},
                            {str(k): v or {} for k, v in variants.items()},
                            Path(data.get("output_dir", "outputs")))
    for variant in comparison.variants:
        variant_config(comparison, variant, path)  # validate every variant before running any
    return comparison


def variant_config(comparison: Comparison, variant: str, source: Path | str = "comparison") -> Config:
    """The full config of one variant: base, then shared overrides, then the variant's own."""
    assignments = as_assignments({**comparison.overrides, **comparison.variants[variant],
                                  "output_dir": str(comparison.output_dir / comparison.name), "run_name": variant})
    try:
        return load_config(comparison.base, assignments)
    except ConfigError as exc:
        raise ConfigError(f"{source}: variant '{variant}': {exc}") from None


def is_finished(cfg: Config) -> bool:
    """True when the run's last checkpoint is its final step (and its final eval exists)."""
    state = cfg.run_dir / "checkpoint" / "state.json"
    if not state.is_file() or json.loads(state.read_text())["step"] < cfg.train.steps:
        return False
    return not cfg.train.final_eval or (cfg.run_dir / "eval-after.json").is_file()


def run_comparison(comparison: Comparison, train_fn: Callable[..., Any] | None = None,
                   log: Callable[[str], None] = print, progress: bool = True) -> dict[str, Any]:
    """Run (or resume, or skip) every variant, then write the summary and figure."""
    from ..rl.trainer import train

    train_fn = train_fn or train
    for variant in comparison.variants:
        cfg = variant_config(comparison, variant)
        if is_finished(cfg):
            log(f"[{variant}] finished earlier: not rerun")
            continue
        resume = (cfg.run_dir / "config.yaml").is_file()
        log(f"[{variant}] {'resuming' if resume else 'starting'} in {cfg.run_dir}")
        start = time.perf_counter()
        train_fn(cfg, resume=resume, progress=progress, log=log)
        add_wall_time(cfg.run_dir, time.perf_counter() - start)
    return write_summary(comparison)


def add_wall_time(run_dir: Path, seconds: float) -> None:
    """Add `seconds` to the run's wall_time.json (a resumed run adds each sitting's time)."""
    path = run_dir / "wall_time.json"
    before = json.loads(path.read_text())["seconds"] if path.is_file() else 0.0
    path.write_text(json.dumps({"seconds": before + seconds}))


def summarize_variant(cfg: Config) -> dict[str, Any]:
    """Final greedy pass rates, regressions, wall time and peak memory of one finished run."""
    from ..runfiles import read_history
    from .figures import puzzle_changes

    history = read_history(cfg.run_dir)
    row: dict[str, Any] = {"steps": len(history),
                           "first_reward": history[0]["reward_mean"] if history else None,
                           "last_reward": history[-1]["reward_mean"] if history else None,
                           "peak_memory_gb": max((h["peak_memory_gb"] for h in history), default=None)}
    wall = cfg.run_dir / "wall_time.json"
    row["wall_seconds"] = json.loads(wall.read_text())["seconds"] if wall.is_file() else None
    before_path, after_path = cfg.run_dir / "eval-before.json", cfg.run_dir / "eval-after.json"
    if before_path.is_file() and after_path.is_file():
        before, after = json.loads(before_path.read_text()), json.loads(after_path.read_text())
        for name, report in (("before", before), ("after", after)):
            rates = {(t["tier"], t["split"]): t["pass@1"] for t in report["totals"] if "tier" in t}
            row[f"train_{name}"] = rates.get(("all", "train"))
            row[f"heldout_{name}"] = rates.get(("all", "heldout"))
        changes = puzzle_changes(before, after)
        row["newly_solved"] = changes["newly_solved"]
        row["regressed"] = changes["regressed"]
        for split, change in compare_reports(before, after).items():
            if split != "all":
                row[f"{split}_change"] = {"change": change["change"], "ci95": change["ci95"]}
    return row


def write_summary(comparison: Comparison) -> dict[str, Any]:
    from .figures import comparison as comparison_figure
    from ..runfiles import read_history
    from .figures import has_tokens, label

    root = comparison.output_dir / comparison.name
    rows = {v: summarize_variant(variant_config(comparison, v)) for v in comparison.variants}
    summary = {"name": comparison.name, "base": str(comparison.base) if comparison.base else None,
               "overrides": comparison.overrides, "variants": comparison.variants, "results": rows}
    root.mkdir(parents=True, exist_ok=True)
    (root / "summary.json").write_text(json.dumps(summary, indent=1))
    (root / "summary.md").write_text(summary_markdown(rows))
    cfg = variant_config(comparison, next(iter(comparison.variants)))
    histories = {v: read_history(variant_config(comparison, v).run_dir) for v in comparison.variants}
    footer = label(cfg.model.spec, str(comparison.base or "defaults") + f" ({comparison.name})")
    figures = comparison_figure(histories, root / "comparison", footer)
    if all(has_tokens(h) for h in histories.values()):  # e.g. dynamic sampling on and off, per token
        figures += comparison_figure(histories, root / "comparison_tokens", footer, x="tokens")
    summary["figures"] = [str(path) for path in figures]
    return summary


def summary_markdown(rows: dict[str, dict[str, Any]]) -> str:
    """The summary table as Markdown."""
    def fmt(value: Any, spec: str = ".2f") -> str:
        return "n/a" if value is None else format(value, spec)

    def change(value: dict[str, Any] | None) -> str:
        if not value:
            return "n/a"
        low, high = value["ci95"]
        return f"{value['change']:+.3f} [{low:+.3f}, {high:+.3f}]"

    lines = ["| variant | train pass@1 before -> after | change [95% CI] | held-out pass@1 before -> after | "
             "change [95% CI] | newly solved | regressed | first -> last step reward | wall time | peak memory |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {fmt(r.get('train_before'))} -> {fmt(r.get('train_after'))} | "
            f"{change(r.get('train_change'))} | "
            f"{fmt(r.get('heldout_before'))} -> {fmt(r.get('heldout_after'))} | {change(r.get('heldout_change'))} | "
            f"{len(r.get('newly_solved', []))} | {len(r.get('regressed', []))} | "
            f"{fmt(r['first_reward'])} -> {fmt(r['last_reward'])} | "
            f"{fmt(r['wall_seconds'] / 60 if r['wall_seconds'] is not None else None, '.1f')} min | "
            f"{fmt(r['peak_memory_gb'])} GB |")
    return "\n".join(lines) + "\n"
