"""Evaluate a model on the puzzles (the `eval` command and the trainer's before/after).

Greedy by default (one completion per puzzle at temperature 0). With `--samples K` it draws K
completions per puzzle and reports pass@1 and the unbiased pass@K per puzzle. Every completion,
its extracted code, test results and reward go to a JSON file, so figures and comparisons are
drawn from recorded data. The trainer evaluates through `evaluate` too.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..env.codefix import CodeFixEnv
from ..puzzles.format import Puzzle
from .rollouts import collect_rollouts
from .stats import bootstrap_ci


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021): 1 - C(n-c, k) / C(n, k), for c correct of n samples."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def evaluate(model: Any, tokenizer: Any, env: CodeFixEnv, puzzles: list[Puzzle], *, samples: int = 1,
             temperature: float = 0.0, max_tokens: int = 384, seed: int = 0, batch_size: int = 32,
             stop_after_answer: bool = True, progress: bool = True) -> dict[str, Any]:
    """Sample and score, and return the report: per-puzzle results with every completion,
    and totals per tier and split. With `stop_after_answer` completions end where their answer
    does (the block the answer is read from), so the prose after it is never generated."""
    start = time.perf_counter()
    batch = collect_rollouts(model, tokenizer, env, puzzles, group_size=samples, temperature=temperature,
                             max_tokens=max_tokens, seed=seed, batch_size=batch_size,
                             stop_after_answer=stop_after_answer, progress=progress, desc="eval")
    rows = []
    for puzzle, group in zip(batch.puzzles, batch.groups):
        solved = sum(r.solved for r in group)
        rows.append({
            "id": puzzle.id, "tier": puzzle.tier, "split": puzzle.split, "family": puzzle.family,
            "samples": len(group), "solved": solved,
            "pass@1": pass_at_k(len(group), solved, 1),
            f"pass@{samples}": pass_at_k(len(group), solved, samples),
            "mean_reward": sum(r.reward for r in group) / len(group),
            "completions": [r.record() for r in group],
        })
    stats = batch.stats
    return {
        "settings": {"samples": samples, "temperature": temperature, "max_tokens": max_tokens, "seed": seed,
                     "stop_after_answer": stop_after_answer},
        "timing": {"seconds": time.perf_counter() - start, "sampling_seconds": stats.seconds,
                   "prefill_seconds": stats.prefill_seconds,
                   "generated_tokens": stats.generated_tokens, "tokens_per_second": stats.tokens_per_second,
                   "peak_memory_gb": stats.peak_memory_gb, "truncated": stats.truncated,
                   "stopped": stats.stopped},
        "totals": totals(rows, samples),
        "puzzles": rows,
    }


def read_report(path: Path) -> dict[str, Any]:
    """An evaluation report written earlier, or ValueError naming the file."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read an evaluation report: {exc}") from None
    if not isinstance(report, dict) or not isinstance(report.get("puzzles"), list):
        raise ValueError(f"{path}: not an evaluation report (no 'puzzles' list)")
    return report


def totals(rows: list[dict[str, Any]], samples: int) -> list[dict[str, Any]]:
    """Mean pass@1 (avg@K when sampled) with its 95% bootstrap interval over puzzles, pass@K
    and solved puzzles per (tier, split), per split, and overall; then per mutator family for
    forged puzzles (rows with "family" instead of "tier")."""
    key_k = f"pass@{samples}"
    buckets: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        for tier in (row["tier"], "all"):
            for split in (row["split"], "all"):
                buckets[(tier, split)].append(row)
    order = {"easy": 0, "medium": 1, "hard": 2, "all": 9}
    out = sorted((_bucket({"tier": tier, "split": split}, members, key_k)
                  for (tier, split), members in buckets.items()),
                 key=lambda t: (order.get(t["tier"], 5), t["tier"], t["split"] == "all", t["split"]))
    families: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row.get("family"):
            families[row["family"]].append(row)
    return out + [_bucket({"family": f, "split": "all"}, families[f], key_k) for f in sorted(families)]


def _bucket(label: dict[str, str], members: list[dict[str, Any]], key_k: str) -> dict[str, Any]:
    mean, low, high = bootstrap_ci([r["pass@1"] for r in members])
    return {**label, "puzzles": len(members),
            "pass@1": mean, "ci95": [low, high],
            key_k: sum(r[key_k] for r in members) / len(members),
            "any_solved": sum(r["solved"] > 0 for r in members)}


def format_report(report: dict[str, Any]) -> str:
    """The per-puzzle table and the totals, as printed by the command."""
    samples = report["settings"]["samples"]
    key_k = f"pass@{samples}"
    rows = report["puzzles"]
    width = max([len(r["id"]) for r in rows] + [6])
    tier_width = max([len(r["tier"]) for r in rows] + [6])
    lines = [f"{'puzzle':<{width}}  {'tier':<{tier_width}}  {'split':<7}  {'solved':>7}  {'pass@1':>6}"
             + (f"  {key_k:>7}" if samples > 1 else "") + f"  {'reward':>6}  {'tokens':>6}"]
    for r in rows:
        tokens = sum(c["num_tokens"] for c in r["completions"]) / len(r["completions"])
        lines.append(f"{r['id']:<{width}}  {r['tier']:<{tier_width}}  {r['split']:<7}  "
                     f"{r['solved']:>3}/{r['samples']:<3}  {r['pass@1']:>6.2f}"
                     + (f"  {r[key_k]:>7.2f}" if samples > 1 else "")
                     + f"  {r['mean_reward']:>6.2f}  {tokens:>6.0f}")
    lines.append("")
    group_width = max([len(t.get("tier") or t["family"]) for t in report["totals"]] + [6])
    rate = f"avg@{samples}" if samples > 1 else "pass@1"  # the mean sampled pass@1 over K samples
    kind = None
    for t in report["totals"]:  # tier rows, then (forged sets) family rows, each under its header
        if ("tier" if "tier" in t else "family") != kind:
            kind = "tier" if "tier" in t else "family"
            lines.append(("" if kind == "tier" else "\n") + f"{kind:<{group_width}}  {'split':<7}  {'puzzles':>7}  "
                         f"{rate:>6}  {'95% CI':>14}" + (f"  {key_k:>7}" if samples > 1 else "")
                         + f"  {'solved (any sample)':>19}")
        low, high = t["ci95"]
        lines.append(f"{t[kind]:<{group_width}}  {t['split']:<7}  {t['puzzles']:>7}  {t['pass@1']:>6.3f}  "
                     f"[{low:.3f}, {high:.3f}]" + (f"  {t[key_k]:>7.3f}" if samples > 1 else "")
                     + f"  {t['any_solved']:>10}/{t['puzzles']}")
    timing = report["timing"]
    lines.append(f"\n{timing['generated_tokens']} tokens in {timing['sampling_seconds']:.1f}s sampling "
                 f"({timing['tokens_per_second']:.1f} tok/s), {timing['seconds']:.1f}s in all")
    return "\n".join(lines)
