"""Public and hidden tests, and the feedback a model reads between turns of multi-turn repair.

Each puzzle's tests split deterministically into public tests, whose failures may be shown to
the model, and hidden tests, which are never shown. The feedback comes from a sandbox run that
holds the public tests alone: a candidate can read its own process's memory and return any
string as its "actual" value, so a hidden test must never be in a process whose output can
reach a prompt. The reward comes from a separate run (env.codefix).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

from ..puzzles.format import Puzzle
from ..sandbox.scorer import TestRun

GENERIC = "The tests failed. Fix the code and answer again in the same form."
NO_CODE = "Your reply held no code that could be run. Answer again in the form asked for."


@dataclass(frozen=True)
class TestSplit:
    """How tests are split and how feedback reads: `public` is a count of public tests (>= 1)
    or a fraction of a puzzle's tests (< 1); at least one test stays hidden, so a puzzle with a
    single test has none public and its feedback is generic. `detailed` False gives the generic
    message always (the ablation that shows whether a model reads the feedback)."""

    __test__ = False  # not a pytest test class, despite the name

    public: float = 1
    reward_on: str = "hidden"  # hidden | all
    detailed: bool = True
    chars: int = 400

    def public_indices(self, puzzle: Puzzle) -> tuple[int, ...]:
        """The indices of the puzzle's public tests: the first ones in a fixed order drawn from
        the puzzle's id (so the split is the same in every run and on every machine)."""
        n = len(puzzle.tests)
        count = int(self.public) if self.public >= 1 else int(self.public * n)
        count = max(0, min(count, n - 1))
        order = sorted(range(n), key=lambda i: hashlib.sha256(f"{puzzle.id}:{i}".encode()).hexdigest())
        return tuple(sorted(order[:count]))

    def hidden_indices(self, puzzle: Puzzle) -> tuple[int, ...]:
        public = set(self.public_indices(puzzle))
        return tuple(i for i in range(len(puzzle.tests)) if i not in public)


def public_view(puzzle: Puzzle, indices: tuple[int, ...]) -> Puzzle:
    """The puzzle with only the given tests (its own id, so the scorer's oracle run for it
    holds exactly these tests)."""
    return dataclasses.replace(puzzle, id=f"{puzzle.id}#public", tests=tuple(puzzle.tests[i] for i in indices))


def feedback_message(view: Puzzle, run: TestRun | None, split: TestSplit, has_code: bool = True) -> str:
    """What the model reads after a turn whose code failed `view`'s (public) tests (`run`): the
    first failing test and its outcome (expected vs actual, the exception, a timeout),
    truncated to `split.chars`. No public test, or the ablation: a generic message."""
    if not has_code:
        return NO_CODE
    failing = next((r for r in run.results if not r.passed), None) if run is not None else None
    if not split.detailed or not view.tests or failing is None:
        return GENERIC
    test = view.tests[failing.index].strip()
    text = f"The code failed this test:\n{test}\n{failing.status}: {failing.message}".strip()
    if len(text) > split.chars:
        text = text[:max(split.chars - 3, 0)] + "..."
    return text + "\nFix the code and answer again in the same form."
