"""Calibration (the seed's rollout step): which puzzles give GRPO a learning signal for a model.

At a sampling temperature, a puzzle whose G completions all pass or all fail has zero
advantage everywhere; only "mixed" puzzles teach anything. `calibrate` measures that per
puzzle and records the advantages GRPO would compute.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import mlx.core as mx

from ..env.codefix import CodeFixEnv
from .grpo import group_advantages
from ..puzzles.format import Puzzle
from ..models.sampling import SampleStats
from .config import SamplingPlan
from .journal import Journal
from .rollouts import (END, JOIN, MIXED, WAIT, Decision, Driver, Episode, LiveEpisode, category, collect_rollouts,
                       decide_once, plan_driver)


def calibration_settings(plan: SamplingPlan, advantage: str = "std", rounds: int = 1) -> dict[str, Any]:
    """The settings a calibration report (and its journal's header) records."""
    return {"group_size": plan.group_size, "temperature": plan.temperature, "max_tokens": plan.max_tokens,
            "seed": plan.seed, "advantage": advantage, "rounds": rounds,
            "stop_after_answer": plan.stop_after_answer, **({"turns": plan.max_turns} if plan.max_turns > 1 else {})}


def journal_header(puzzles: list[Puzzle], plan: SamplingPlan, advantage: str = "std", rounds: int = 1,
                   **asked: Any) -> dict[str, Any]:
    """What a calibration's journal belongs to (`rl.journal`): who was asked and how (`asked`:
    the model, ...), the calibration's settings and its puzzles, in order."""
    return {**asked, "settings": calibration_settings(plan, advantage, rounds), "puzzles": [p.id for p in puzzles]}


def calibrate(model: Any, tokenizer: Any, env: CodeFixEnv, puzzles: list[Puzzle], plan: SamplingPlan, *,
              advantage: str = "std", rounds: int = 1, progress: bool = True,
              journal: Journal | None = None) -> dict[str, Any]:
    """Sample G (`plan.group_size`) completions per puzzle and report solve rate, category and
    advantages.

    `rounds` > 1 samples G in that many rounds and stops sampling a puzzle once it is mixed: a
    mixed group stays mixed whatever else is drawn, so every puzzle gets the category it would
    get from all G samples (the same decision), for fewer tokens; the solve rate of a puzzle
    that stopped early is measured on fewer samples (its row's `samples`). The rounds share one
    continuous batch: a puzzle's next round joins as soon as its last one is finished and
    scored, while other puzzles decode, so no round waits for the slowest completion of all.

    `journal` (single-turn): each puzzle's row is recorded there as soon as the puzzle is
    decided, and the puzzles it already holds are not sampled again (`rl.journal`).

    `plan.max_turns` > 1 (an env with a test split) calibrates multi-turn episodes: a puzzle is
    mixed when some of its G episodes end solved and some do not (one round only).
    """
    group_size, turns = plan.group_size, plan.max_turns
    settings = calibration_settings(plan, advantage, rounds)
    if turns > 1:
        if rounds > 1:
            raise ValueError("calibration rounds need single-turn episodes (turns 1)")
        batch = collect_rollouts(model, tokenizer, env, puzzles, plan, progress=progress, desc="rollouts")
        rows = [_row(p, group, advantage) for p, group in zip(puzzles, batch.groups)]
        return _report(rows, batch.stats, settings)
    per_round = -(-group_size // min(rounds, group_size))  # ceil: every puzzle gets G in at most `rounds`
    sizes = [min(per_round, group_size - start) for start in range(0, group_size, per_round)]
    done = journal.rows if journal else {}
    todo = [p for p in puzzles if p.id not in done]
    rows = dict(done)
    stats = SampleStats()
    if todo:
        def row(i: int) -> dict[str, Any]:
            return _row(todo[i], [live.episode(todo[i].id, 0.0) for live in policy.answers(i)], advantage)

        def decided(i: int) -> None:
            rows[todo[i].id] = row(i)
            journal.add(rows[todo[i].id])

        driver = plan_driver(model, tokenizer, env, todo, plan, progress, "rollouts")
        policy = Rounds(sizes, decided if journal else None)
        policy.open(driver)
        stats = driver.run(policy)
        for i, p in enumerate(todo):
            if p.id not in rows:  # without a journal, every row is made here, at the end
                rows[p.id] = row(i)
    return _report([rows[p.id] for p in puzzles], stats, settings, journal.earlier if journal else [])


class Rounds:
    """Calibration's policy: each puzzle's G answers in rounds of `sizes`, a puzzle's round r
    joining once round r - 1 is finished, scored and left the puzzle unmixed, and never
    otherwise. Entry e is round e % R of puzzle e // R, queued puzzle-major (a puzzle's later
    rounds take free slots before new puzzles start, so few prompt caches are alive at once)."""

    def __init__(self, sizes: list[int], decided: Callable[[int], None] | None = None):
        self.sizes, self.n_rounds = sizes, len(sizes)
        self.on_decided = decided  # told each puzzle's index once its answers are final and scored
        self.finished: dict[int, list[LiveEpisode]] = {}  # by entry, in the order they finished
        self.decided: dict[int, Decision] = {}  # by entry: its held answers all go the same way

    def open(self, driver: Driver) -> None:
        """Queue every round of every puzzle; later rounds wait held for `decide`."""
        for e in range(len(driver.puzzles) * self.n_rounds):
            self.finished[e] = []
            for _ in range(self.sizes[e % self.n_rounds]):
                driver.open(e // self.n_rounds, held=e % self.n_rounds > 0, tag=e)

    def answers(self, p: int) -> list[LiveEpisode]:
        """Puzzle `p`'s answers, round by round."""
        return [live for r in range(self.n_rounds) for live in self.finished[p * self.n_rounds + r]]

    def answered(self, driver: Driver, live: LiveEpisode) -> None:
        e = live.tag
        self.finished[e].append(live)
        last = e % self.n_rounds == self.n_rounds - 1
        if self.on_decided and last and len(self.finished[e]) == self.sizes[-1]:
            for answer in self.finished[e]:
                driver.verdict(answer)  # scoring sooner than the end changes no sample: the engine never waits on it
            self.on_decided(e // self.n_rounds)

    def decide(self, driver: Driver, live: LiveEpisode) -> Decision | None:
        return decide_once(self.decided, live.tag, lambda: self._gate(driver, live.tag))

    def _gate(self, driver: Driver, e: int) -> Decision | None:
        before = e - 1  # the same puzzle's previous round
        if self.decided.get(before) is END:
            return END
        if len(self.finished[before]) < self.sizes[before % self.n_rounds]:
            return WAIT  # still decoding (it joined: its own gate let it)
        for live in self.finished[before]:
            driver.verdict(live)
        p = e // self.n_rounds
        so_far = [live.episode(driver.puzzles[p].id, 0.0) for live in self.answers(p)]
        if category(so_far) != MIXED:
            return JOIN
        if self.on_decided:
            self.on_decided(p)
        return END


def _row(puzzle: Puzzle, group: list[Episode], advantage: str) -> dict[str, Any]:
    """A puzzle's line of the report: its solve rate, category, rewards, advantages and answers."""
    advantages, _ = group_advantages(mx.array([[r.reward for r in group]]), advantage)
    return {
        "id": puzzle.id, "tier": puzzle.tier, "split": puzzle.split,
        "solved": sum(r.solved for r in group), "samples": len(group),
        "solve_rate": sum(r.solved for r in group) / len(group),
        "category": category(group),
        "rewards": [r.reward for r in group],
        "advantages": advantages[0].tolist(),
        "completions": [r.record() for r in group],
    }


def _report(rows: list[dict[str, Any]], stats: SampleStats, settings: dict[str, Any],
            earlier: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """The calibration report: the rows in puzzle order, the sampling totals (this session's
    `stats`, plus what `earlier` sessions of a resumed calibration spent on the puzzles they
    finished) and the category counts."""
    seconds = stats.seconds + sum(s["seconds"] for s in earlier)
    tokens = stats.generated_tokens + sum(s["generated_tokens"] for s in earlier)
    timing = {"sampling_seconds": seconds, "prefill_seconds": stats.prefill_seconds, "generated_tokens": tokens,
              "tokens_per_second": tokens / seconds if seconds > 0 else 0.0, "peak_memory_gb": stats.peak_memory_gb,
              "completions": stats.completions + sum(s["completions"] for s in earlier)}
    if earlier:  # prefill and peak memory are this session's only
        timing["earlier_sessions"] = list(earlier)
    return {
        "settings": settings,
        "timing": timing,
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
