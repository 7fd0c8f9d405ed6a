"""Public and hidden tests, and the feedback a model reads between turns of multi-turn repair.

Each puzzle's tests split deterministically into public tests, whose failures may be shown to
the model, and hidden tests, which are never shown. The feedback comes from a sandbox run that
holds the public tests alone: a candidate can read its own process's memory and return any
string as its "actual" value, so a hidden test must never be in a process whose output can
reach a prompt. The reward comes from a separate run (env.codefix).

The split itself (which tests are public, and the set-up a public test carries) is
`puzzles.split`.
"""

from __future__ import annotations

from ..puzzles.format import Puzzle
from ..puzzles.split import TestSplit, public_sources, public_view
from ..sandbox.scorer import TestRun

__all__ = ["GENERIC", "NO_CODE", "TestSplit", "feedback_message", "public_sources", "public_view"]

GENERIC = "The tests failed. Fix the code and answer again in the same form."
NO_CODE = "Your reply held no code that could be run. Answer again in the form asked for."


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
