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
from ..models.sampling import SampleStats
from .rollouts import MIXED, category, collect_rollouts


def calibrate(model: Any, tokenizer: Any, env: CodeFixEnv, puzzles: list[Puzzle], *, group_size: int,
              temperature: float, max_tokens: int, seed: int = 0, batch_size: int = 32,
              advantage: str = "std", rounds: int = 1, progress: bool = True) -> dict[str, Any]:
    """Sample G completions per puzzle and report solve rate, category and advantages.

    `rounds` > 1 samples G in that many rounds and stops sampling a puzzle once it is mixed: a
    mixed group stays mixed whatever else is drawn, so every puzzle gets the category it would
    get from all G samples (the same decision), for fewer tokens; the solve rate of a puzzle
    that stopped early is measured on fewer samples (its row's `samples`).
    """
    per_round = -(-group_size // min(rounds, group_size))  # ceil: every puzzle gets G in at most `rounds`
    groups: dict[str, list] = {p.id: [] for p in puzzles}
    stats = SampleStats()
    pending, round_index = list(puzzles), 0
    while pending:
        # Seed each round apart, so a round does not redraw the samples of the last one.
        round_seed = seed + 1_000_003 * round_index
        size = min(per_round, group_size - len(groups[pending[0].id]))
        batch = collect_rollouts(model, tokenizer, env, pending, group_size=size, temperature=temperature,
                                 max_tokens=max_tokens, seed=round_seed, batch_size=batch_size, progress=progress,
                                 desc="rollouts" if rounds == 1 else f"rollouts, round {round_index + 1}")
        for puzzle, group in zip(batch.puzzles, batch.groups):
            groups[puzzle.id].extend(group)
        add_stats(stats, batch.stats)
        pending = [p for p in pending if len(groups[p.id]) < group_size and category(groups[p.id]) != MIXED]
        round_index += 1
    rows = []
    for puzzle in puzzles:
        group = groups[puzzle.id]
        advantages, _ = group_advantages(mx.array([[r.reward for r in group]]), advantage)
        rows.append({
            "id": puzzle.id, "tier": puzzle.tier, "split": puzzle.split,
            "solved": sum(r.solved for r in group), "samples": len(group),
            "solve_rate": sum(r.solved for r in group) / len(group),
            "category": category(group),
            "rewards": [r.reward for r in group],
            "advantages": advantages[0].tolist(),
            "completions": [r.record() for r in group],
        })
    return {
        "settings": {"group_size": group_size, "temperature": temperature, "max_tokens": max_tokens,
                     "seed": seed, "advantage": advantage, "rounds": rounds},
        "timing": {"sampling_seconds": stats.seconds, "prefill_seconds": stats.prefill_seconds,
                   "generated_tokens": stats.generated_tokens,
                   "tokens_per_second": stats.tokens_per_second, "peak_memory_gb": stats.peak_memory_gb,
                   "completions": stats.completions},
        "categories": dict(Counter(row["category"] for row in rows)),
        "puzzles": rows,
    }


def add_stats(total: SampleStats, part: SampleStats) -> None:
    """Fold the totals of one `sample` call into a running total (peak memory: the maximum)."""
    total.prompt_tokens += part.prompt_tokens
    total.generated_tokens += part.generated_tokens
    total.seconds += part.seconds
    total.prefill_seconds += part.prefill_seconds
    total.completions += part.completions
    total.truncated += part.truncated
    total.peak_memory_gb = max(total.peak_memory_gb, part.peak_memory_gb)


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
