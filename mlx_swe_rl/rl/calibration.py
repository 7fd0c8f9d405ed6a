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
from ..models.sampling import Request, Sample
from .config import SamplingPlan
from .rollouts import (MIXED, Episode, category, collect_rollouts, encode_prompts, plan_engine, score_samples,
                       stop_rules)


def calibrate(model: Any, tokenizer: Any, env: CodeFixEnv, puzzles: list[Puzzle], plan: SamplingPlan, *,
              advantage: str = "std", rounds: int = 1, progress: bool = True) -> dict[str, Any]:
    """Sample G (`plan.group_size`) completions per puzzle and report solve rate, category and
    advantages.

    `rounds` > 1 samples G in that many rounds and stops sampling a puzzle once it is mixed: a
    mixed group stays mixed whatever else is drawn, so every puzzle gets the category it would
    get from all G samples (the same decision), for fewer tokens; the solve rate of a puzzle
    that stopped early is measured on fewer samples (its row's `samples`). The rounds share one
    continuous batch: a puzzle's next round joins as soon as its last one is finished and
    scored, while other puzzles decode, so no round waits for the slowest completion of all.

    `plan.max_turns` > 1 (an env with a test split) calibrates multi-turn episodes: a puzzle is
    mixed when some of its G episodes end solved and some do not (one round only).
    """
    group_size, turns = plan.group_size, plan.max_turns
    settings = {"group_size": group_size, "temperature": plan.temperature, "max_tokens": plan.max_tokens,
                "seed": plan.seed, "advantage": advantage, "rounds": rounds,
                "stop_after_answer": plan.stop_after_answer, **({"turns": turns} if turns > 1 else {})}
    if turns > 1:
        if rounds > 1:
            raise ValueError("calibration rounds need single-turn episodes (turns 1)")
        batch = collect_rollouts(model, tokenizer, env, puzzles, plan, progress=progress, desc="rollouts")
        outcomes = {p.id: group for p, group in zip(puzzles, batch.groups)}
        return _report(puzzles, outcomes, batch.stats, advantage, settings)
    per_round = -(-group_size // min(rounds, group_size))  # ceil: every puzzle gets G in at most `rounds`
    sizes = [min(per_round, group_size - start) for start in range(0, group_size, per_round)]
    # Entry e is round e % R of puzzle e // R (puzzle-major: a puzzle's later rounds take free
    # slots before new puzzles start, so few prompt caches are alive at once).
    n_rounds = len(sizes)
    entries = range(len(puzzles) * n_rounds)
    prompts = encode_prompts(tokenizer, env, puzzles)
    finished: dict[int, list[Sample]] = {e: [] for e in entries}
    scored: set[int] = set()
    outcomes: dict[str, list[Episode]] = {p.id: [] for p in puzzles}  # in round order
    stopped: set[int] = set()  # entries gated out: their puzzle was already mixed

    def score(chosen: list[int]) -> None:
        pairs = [(puzzles[e // n_rounds], s) for e in chosen for s in finished[e]]
        for (puzzle, _), rollout in zip(pairs, score_samples(env, pairs)):
            outcomes[puzzle.id].append(rollout)
        scored.update(chosen)

    def gate(e: int) -> bool | None:
        """Decode round r of a puzzle once round r - 1 is done and left it unmixed."""
        if e % n_rounds == 0:
            return True
        before = e - 1
        if before not in stopped:
            if before not in scored:
                if len(finished[before]) < sizes[before % n_rounds]:
                    return None  # still decoding (it joined: its own gate said True)
                score([before])
            if category(outcomes[puzzles[e // n_rounds].id]) != MIXED:
                return True
        stopped.add(e)
        return False

    stops = stop_rules(env, puzzles, plan.stop_after_answer)
    engine = plan_engine(model, tokenizer, plan, progress, "rollouts")
    entry_of: dict[int, int] = {}  # engine sequence -> entry
    decided: dict[int, bool] = {}  # gate verdicts, per entry
    try:
        for e in entries:  # later rounds wait in the queue (held) until the gate decides them
            for _ in range(sizes[e % n_rounds]):
                seq = engine.submit(Request(prompts[e // n_rounds], stops[e // n_rounds], held=e % n_rounds > 0, label=e))
                entry_of[seq] = e
        while engine.busy:
            step = engine.step()
            for seq in step.asked:
                e = entry_of[seq]
                if e not in decided:
                    verdict = gate(e)
                    if verdict is None:
                        continue
                    decided[e] = verdict
                engine.release(seq) if decided[e] else engine.drop(seq)
            for _, s in step.finished:
                finished[s.prompt_index].append(s)
    finally:
        stats = engine.close()
    score([e for e in entries if e not in scored and finished[e]])
    return _report(puzzles, outcomes, stats, advantage, settings)


def _report(puzzles: list[Puzzle], outcomes: dict[str, list[Episode]], stats: Any, advantage: str,
            settings: dict[str, Any]) -> dict[str, Any]:
    """The calibration report: per puzzle its solve rate, category, rewards and advantages."""
    rows = []
    for puzzle in puzzles:
        group = outcomes[puzzle.id]
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
        "settings": settings,
        "timing": {"sampling_seconds": stats.seconds, "prefill_seconds": stats.prefill_seconds,
                   "generated_tokens": stats.generated_tokens,
                   "tokens_per_second": stats.tokens_per_second, "peak_memory_gb": stats.peak_memory_gb,
                   "completions": stats.completions},
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
