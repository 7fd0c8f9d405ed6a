"""Verdict: what the environment decides about one answer, as one typed record.

`CodeFixEnv.score` makes every verdict (env.codefix); training, rollouts, calibration and
evaluation read its fields, and only the JSON writers (`rl.rollouts.Turn.record`,
`Episode.record`, `Episode.summary`) turn it into the keys the run files keep.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..sandbox.verdict import TestResult


@dataclass(frozen=True)
class Verdict:
    """One scored answer. `solved`: every test passed (a task without tests: the code equals
    the oracle once normalised). `parts`: the reward's parts before weighting (env.rewards).
    `error`: why the puzzle could not be scored (then reward 0, not solved, every part 0).

    The `public_*` fields and `feedback` exist only with a test split (multi-turn repair): did
    the answer pass the public tests, and what the model is told when it did not. Without a
    split they stay None, which the JSON records keep as null, as before."""

    puzzle_id: str
    reward: float
    solved: bool
    code: str | None  # the extracted answer; None: no code could be read (a format failure)
    format_error: str | None
    parts: dict[str, float]
    passed: int  # tests passed, of `total`
    total: int
    tests: list[TestResult] = field(default_factory=list)  # per test, in order; empty when not run
    output: str = ""  # what the candidate printed
    error: str | None = None
    public_tests: list[int] | None = None  # indices of the public tests (split only)
    public_passed: int | None = None
    public_ok: bool | None = None
    feedback: str | None = None

    @property
    def format_ok(self) -> bool:
        """An answer could be read from the response (the tests could run on it)."""
        return self.code is not None

    def test_records(self) -> list[dict[str, Any]]:
        """The per-test outcomes as JSON objects (index, status, message), as reports keep them."""
        return [asdict(t) for t in self.tests]
