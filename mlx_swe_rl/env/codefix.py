"""CodeFixEnv: the gym-style facade over puzzles, prompts, the scorer and the rewards."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from .prompts import AnswerEnd, build_messages, extract_code
from ..puzzles.format import Puzzle
from .rewards import DEFAULT_REWARD, NEEDS_TESTS, Completion, combine, validate_weights
from ..sandbox.scorer import Scorer


class CodeFixEnv:
    """reset(puzzle_id) -> observation; get_prompt() -> chat messages; step(completion) ->
    (reward, info). `score` does the same for many completions at once, in parallel; every
    caller (training, rollouts, eval) scores through it."""

    def __init__(self, puzzles: list[Puzzle], scorer: Scorer | None = None,
                 reward: Mapping[str, float] = DEFAULT_REWARD):
        if not puzzles:
            raise ValueError("CodeFixEnv needs at least one puzzle")
        self.puzzles = {p.id: p for p in puzzles}
        self.reward = validate_weights(reward)
        self._own_scorer = scorer is None
        self.scorer = scorer or Scorer()
        self.current: Puzzle | None = None

    def reset(self, puzzle_id: str | None = None) -> dict[str, str]:
        """Select a puzzle (the first one when no id is given) and return its observation."""
        if puzzle_id is None:
            puzzle_id = next(iter(self.puzzles))
        if puzzle_id not in self.puzzles:
            raise KeyError(f"unknown puzzle id '{puzzle_id}'")
        self.current = self.puzzles[puzzle_id]
        p = self.current
        return {"puzzle_id": p.id, "tier": p.tier, "description": p.description,
                "buggy_code": p.buggy, "entry_point": p.entry_point}

    def _require_current(self) -> Puzzle:
        if self.current is None:
            raise RuntimeError("call reset() before get_prompt() or step()")
        return self.current

    def get_prompt(self) -> list[dict[str, str]]:
        return build_messages(self._require_current())

    def prompt_for(self, puzzle_id: str) -> list[dict[str, str]]:
        """The chat messages for any puzzle of this environment."""
        return build_messages(self.puzzles[puzzle_id])

    def stop_rule(self, puzzle_id: str) -> AnswerEnd:
        """Where the sampler may end a completion for this puzzle: once its answer is complete."""
        return AnswerEnd(self.puzzles[puzzle_id].entry_point)

    def step(self, completion: str) -> tuple[float, dict[str, Any]]:
        """Score one model response for the current puzzle."""
        return self.score([(self._require_current().id, completion)])[0]

    def score(self, items: list[tuple[str, str]]) -> list[tuple[float, dict[str, Any]]]:
        """Score (puzzle_id, response) pairs; responses without code are format failures and
        are not run. Returns (reward, info) per pair, in input order."""
        puzzles = [self.puzzles[pid] for pid, _ in items]
        codes = [extract_code(text, p.entry_point) for p, (_, text) in zip(puzzles, items)]
        needs_run = bool(NEEDS_TESTS & self.reward.keys())
        to_run = [i for i, code in enumerate(codes) if code is not None and needs_run]
        runs = dict(zip(to_run, self.scorer.run_many([(puzzles[i], codes[i]) for i in to_run])))
        out = []
        for i, (puzzle, code) in enumerate(zip(puzzles, codes)):
            run = runs.get(i)
            reward, parts = combine(Completion(puzzle, code, run), self.reward)
            info = {
                "puzzle_id": puzzle.id,
                "code": code,
                "format_ok": code is not None,
                "passed": run.passed if run else 0,
                "total": run.total if run else len(puzzle.tests),
                "tests": [asdict(r) for r in run.results] if run else [],
                "output": run.output if run else "",
                "reward_parts": parts,
            }
            out.append((reward, info))
        return out

    def close(self) -> None:
        if self._own_scorer:
            self.scorer.close()

    def __enter__(self) -> "CodeFixEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
