"""Calibration (the seed's rollout step): which puzzles give GRPO a learning signal for a model.

At a sampling temperature, a puzzle whose G completions all pass or all fail has zero
advantage everywhere; only "mixed" puzzles teach anything. `calibrate` measures that per
puzzle and records the advantages GRPO would compute.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import mlx.core as mx

from ..env.codefix import CodeFixEnv
from .grpo import group_advantages
from ..puzzles.format import Puzzle
from .rollouts import category, collect_rollouts


def calibrate(model: Any, tokenizer: Any, env: CodeFixEnv, puzzles: list[Puzzle], *, group_size: int,
              temperature: float, max_tokens: int, seed: int = 0, batch_size: int = 32,
              advantage: str = "std", progress: bool = True) -> dict[str, Any]:
    """Sample G completions per puzzle and report solve rate, category and advantages."""
    batch = collect_rollouts(model, tokenizer, env, puzzles, group_size=group_size, temperature=temperature,
                             max_tokens=max_tokens, seed=seed, batch_size=batch_size, progress=progress,
                             desc="rollouts")
    rewards = mx.array([[r.reward for r in group] for group in batch.groups])
    advantages, _ = group_advantages(rewards, advantage)
    rows = []
    for puzzle, group, adv in zip(batch.puzzles, batch.groups, advantages.tolist()):
        rows.append({
            "id": puzzle.id, "tier": puzzle.tier, "split": puzzle.split,
            "solved": sum(r.solved for r in group), "samples": len(group),
            "solve_rate": sum(r.solved for r in group) / len(group),
            "category": category(group),
            "rewards": [r.reward for r in group],
            "advantages": adv,
            "completions": [r.record() for r in group],
        })
    stats = batch.stats
    return {
        "settings": {"group_size": group_size, "temperature": temperature, "max_tokens": max_tokens,
                     "seed": seed, "advantage": advantage},
        "timing": {"sampling_seconds": stats.seconds, "generated_tokens": stats.generated_tokens,
                   "tokens_per_second": stats.tokens_per_second, "peak_memory_gb": stats.peak_memory_gb},
        "categories": dict(Counter(row["category"] for row in rows)),
        "puzzles": rows,
    }


def format_calibration(report: dict[str, Any]) -> str:
    """Per-puzzle solve rate, category and advantages, then the category counts."""
    rows = report["puzzles"]
    width = max([len(r["id"]) for r in rows] + [6])
    lines = [f"{'puzzle':<{width}}  {'tier':<6}  {'solved':>7}  {'category':<10}  advantages"]
    for r in rows:
        adv = " ".join(f"{a:+.2f}" for a in r["advantages"])
        lines.append(f"{r['id']:<{width}}  {r['tier']:<6}  {r['solved']:>3}/{r['samples']:<3}  "
                     f"{r['category']:<10}  {adv}")
    counts = report["categories"]
    lines.append("\n" + ", ".join(f"{k}: {counts.get(k, 0)}" for k in ("all-solved", "mixed", "all-failed")))
    t = report["timing"]
    lines.append(f"{t['generated_tokens']} tokens in {t['sampling_seconds']:.1f}s ({t['tokens_per_second']:.1f} tok/s)")
    return "\n".join(lines)
