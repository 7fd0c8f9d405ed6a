"""Confidence intervals for pass rates: a bootstrap over puzzles, and paired differences.

A pass rate over N puzzles, each measured with K samples (avg@K: the mean over puzzles of the
sampled pass@1), varies mostly with which puzzles happen to be in the set, so the bootstrap
resamples puzzles. A paired comparison of two evaluations of the same puzzles (before and
after training, variant A and B) resamples the per-puzzle differences: each puzzle's
difficulty cancels, and the interval is much tighter than two separate intervals suggest.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

LEVEL = 0.95
RESAMPLES = 10_000


def bootstrap_ci(values: list[float], *, level: float = LEVEL, resamples: int = RESAMPLES,
                 seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the mean of `values` and the percentile bootstrap interval of it.
    Seeded, so the same values always give the same interval. NaNs for no values."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(x.mean()), float(low), float(high)


def paired_change(before: dict[str, float], after: dict[str, float], **kwargs: Any) -> dict[str, Any]:
    """The change of per-puzzle rates from `before` to `after` over the puzzles both have:
    mean change with its bootstrap interval, and how many puzzles went up and down."""
    common = sorted(before.keys() & after.keys())
    diffs = [after[i] - before[i] for i in common]
    change, low, high = bootstrap_ci(diffs, **kwargs)
    n = len(common)
    return {"puzzles": n,
            "before": sum(before[i] for i in common) / n if n else math.nan,
            "after": sum(after[i] for i in common) / n if n else math.nan,
            "change": change, "ci95": [low, high],
            "improved": sum(d > 0 for d in diffs), "worsened": sum(d < 0 for d in diffs)}


def compare_reports(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Paired changes of pass@1 (avg@K when sampled) per split and overall, between two
    evaluation reports (`rl.evaluation.evaluate`) of the same puzzles."""
    out = {}
    for split in ("train", "heldout", "all"):
        rates = [{r["id"]: r["pass@1"] for r in report["puzzles"] if split in ("all", r["split"])}
                 for report in (before, after)]
        if rates[0] and rates[1]:
            out[split] = paired_change(*rates)
    return out


def format_changes(changes: dict[str, dict[str, Any]], title: str) -> str:
    """A small table: split, puzzles, before, after, change [95% CI], up/down."""
    lines = [title, f"{'split':<8}  {'puzzles':>7}  {'before':>6}  {'after':>6}  {'change':>7}  "
                    f"{'95% CI':>17}  {'up':>4}  {'down':>4}"]
    for split, c in changes.items():
        low, high = c["ci95"]
        lines.append(f"{split:<8}  {c['puzzles']:>7}  {c['before']:>6.3f}  {c['after']:>6.3f}  "
                     f"{c['change']:>+7.3f}  [{low:>+6.3f}, {high:>+6.3f}]  {c['improved']:>4}  {c['worsened']:>4}")
    return "\n".join(lines)
