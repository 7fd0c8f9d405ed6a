"""CodeFixEnv: the gym-style facade over puzzles, prompts, the scorer and the rewards."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from . import formats
from .feedback import TestSplit, feedback_message, public_view
from .prompts import PromptStyle
from ..puzzles.format import Puzzle
from ..stopping import StopRule
from .rewards import (DEFAULT_REWARD, DEFAULT_REWARD_WITHOUT_TESTS, NEEDS_TESTS, Completion, combine,
                      exact_match, validate_weights)
from ..sandbox.scorer import Scorer, TestRun
from .verdict import Verdict


class CodeFixEnv:
    """reset(puzzle_id) -> observation; get_prompt() -> chat messages; step(completion) ->
    Verdict. `score` does the same for many completions at once, in parallel; every caller
    (training, rollouts, eval) scores through it, and it alone makes verdicts (env.verdict).

    `reward` weighs the rewards of tasks with tests; tasks without tests (mined from a history
    with no usable tests) earn `reward_without_tests`, which cannot use the test rewards.
    `answer_format` is how the model is asked and read (env.formats: function, search_replace),
    `style` the wording and system message of the question (env.prompts).

    With a `split` (multi-turn repair) every scored answer also runs the puzzle's public tests
    alone, for the feedback, and its reward and `solved` come from the hidden tests (or all,
    `split.reward_on`), run separately (env.feedback says why).

    A puzzle that cannot be scored (its oracle fails its own tests or its public view, so the
    expected values are unknown) does not stop a batch: each of its answers gets the error
    verdict (reward 0, not solved, `Verdict.error` says why) and the others are scored."""

    def __init__(self, puzzles: list[Puzzle], scorer: Scorer | None = None,
                 reward: Mapping[str, float] = DEFAULT_REWARD, answer_format: str = "function",
                 reward_without_tests: Mapping[str, float] = DEFAULT_REWARD_WITHOUT_TESTS,
                 split: TestSplit | None = None, style: PromptStyle = PromptStyle()):
        if not puzzles:
            raise ValueError("CodeFixEnv needs at least one puzzle")
        self.puzzles = {p.id: p for p in puzzles}
        self.reward = validate_weights(reward)
        self.reward_without_tests = validate_weights(reward_without_tests, "reward_without_tests", without_tests=True)
        self.format = formats.answer_format(answer_format)
        self.style = style
        self.split = split
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
        return self.format.messages(self._require_current(), self.style)

    def prompt_for(self, puzzle_id: str) -> list[dict[str, str]]:
        """The chat messages for any puzzle of this environment."""
        return self.format.messages(self.puzzles[puzzle_id], self.style)

    def stop_rule(self, puzzle_id: str) -> StopRule | None:
        """Where the sampler may end a completion for this puzzle: once its answer is complete."""
        return self.format.stop_rule(self.puzzles[puzzle_id])

    def step(self, completion: str) -> Verdict:
        """Score one model response for the current puzzle."""
        return self.score([(self._require_current().id, completion)])[0]

    def score(self, items: list[tuple[str, str]]) -> list[Verdict]:
        """Score (puzzle_id, response) pairs; responses without code are format failures and
        are not run. Returns a verdict per pair, in input order.

        `Verdict.solved`: every test passed, or for a task without tests, the code equals the
        oracle once normalised (formatting and comments aside)."""
        puzzles = [self.puzzles[pid] for pid, _ in items]
        extracted = [self.format.extract(text, p) for p, (_, text) in zip(puzzles, items)]
        codes = [code for code, _ in extracted]
        needs_run = bool(NEEDS_TESTS & self.reward.keys()) or self.split is not None
        errors = self._errors(puzzles) if needs_run else {}
        to_run = [i for i, code in enumerate(codes)
                  if code is not None and needs_run and puzzles[i].tests and puzzles[i].id not in errors]
        runs = dict(zip(to_run, self.scorer.run_many([(puzzles[i], codes[i]) for i in to_run])))
        public = self._public_runs(puzzles, codes, to_run) if self.split is not None else {}
        out = []
        for i, (puzzle, (code, problem)) in enumerate(zip(puzzles, extracted)):
            if puzzle.id in errors:
                out.append(self._error_verdict(puzzle, code, problem, errors[puzzle.id]))
                continue
            run = self._rewarded(puzzle, runs.get(i))
            weights = self.reward if puzzle.tests else self.reward_without_tests
            reward, parts = combine(Completion(puzzle, code, run), weights)
            if puzzle.tests:
                solved = run is not None and run.all_passed
            else:
                solved = code is not None and exact_match(code, puzzle.oracle)
            verdict = Verdict(puzzle.id, reward, solved, code, problem, parts,
                              passed=run.passed if run else 0, total=run.total if run else len(puzzle.tests),
                              tests=list(run.results) if run else [], output=run.output if run else "")
            if self.split is not None:
                verdict = self._turn_outcome(verdict, puzzle, public.get(i))
            out.append(verdict)
        return out

    def _errors(self, puzzles: list[Puzzle]) -> dict[str, str]:
        """{puzzle id: why it cannot be scored} for the batch's puzzles with tests: the scorer
        cannot compute the expected values of the puzzle or (with a split) of its public view."""
        unique = list({p.id: p for p in puzzles if p.tests}.values())
        views = {p.id: public_view(p, self.split.public_indices(p)) for p in unique
                 if self.split is not None and self.split.public_indices(p)}
        found = self.scorer.errors(unique + list(views.values()))
        errors = {p.id: found[p.id] for p in unique if p.id in found}
        for pid, view in views.items():
            if pid not in errors and view.id in found:
                errors[pid] = f"public tests: {found[view.id]}"
        return errors

    def _error_verdict(self, puzzle: Puzzle, code: str | None, problem: str | None,
                       error: str) -> Verdict:
        """What an answer to a puzzle that cannot be scored gets: reward 0 (every part 0, so its
        group carries no signal), not solved, the error; with a split, no feedback (its episode
        ends here)."""
        weights = self.reward if puzzle.tests else self.reward_without_tests
        verdict = Verdict(puzzle.id, 0.0, False, code, problem, dict.fromkeys(weights, 0.0), passed=0,
                          total=len(puzzle.tests), error=error)
        if self.split is not None:
            verdict = dataclasses.replace(verdict, public_tests=list(self.split.public_indices(puzzle)),
                                          public_passed=0, public_ok=False)
        return verdict

    def _rewarded(self, puzzle: Puzzle, run: TestRun | None) -> TestRun | None:
        """The results the reward reads: all tests, or (split.reward_on hidden) the hidden ones.
        All tests always run, in order, so state one test leaves for the next stays as written."""
        if run is None or self.split is None or self.split.reward_on == "all":
            return run
        hidden = set(self.split.hidden_indices(puzzle))
        return dataclasses.replace(run, results=[r for r in run.results if r.index in hidden])

    def _public_runs(self, puzzles: list[Puzzle], codes: list[str | None], ran: list[int]) -> dict[int, TestRun]:
        """The public tests alone, in runs of their own, for the answers that were run."""
        views = {i: public_view(puzzles[i], self.split.public_indices(puzzles[i])) for i in ran}
        chosen = [i for i in ran if views[i].tests]
        return dict(zip(chosen, self.scorer.run_many([(views[i], codes[i]) for i in chosen])))

    def _turn_outcome(self, verdict: Verdict, puzzle: Puzzle, public: TestRun | None) -> Verdict:
        """`verdict` with what multi-turn repair needs of an answer: did it pass the public tests
        (a puzzle without public tests: did it pass the hidden ones; then only that bit reaches
        the model, as a generic message), and the feedback to show when it did not."""
        indices = self.split.public_indices(puzzle)
        view = public_view(puzzle, indices)
        ok = (public is not None and public.all_passed) if indices else verdict.solved
        return dataclasses.replace(verdict, public_tests=list(indices), public_passed=public.passed if public else 0,
                                   public_ok=ok, feedback=None if ok else
                                   feedback_message(view, public, self.split, has_code=verdict.code is not None))

    def close(self) -> None:
        if self._own_scorer:
            self.scorer.close()

    def __enter__(self) -> "CodeFixEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
