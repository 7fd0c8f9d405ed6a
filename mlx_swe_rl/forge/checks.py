"""`puzzles check`: every puzzle's buggy code fails, its oracle passes, verdicts are stable,
and every run stays within its time budget."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..puzzles.format import Puzzle
from ..sandbox.scorer import Scorer, TestRun
from ..sandbox.verdict import TIMEOUT

ORACLE_BUDGET_SHARE = 0.5  # an oracle must finish in half its timeout, leaving room for slower fixes


@dataclass
class CheckReport:
    puzzle: Puzzle
    problems: list[str] = field(default_factory=list)
    buggy_statuses: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def _statuses(run: TestRun) -> list[str]:
    return [r.status for r in run.results]


def check_puzzles(puzzles: list[Puzzle], scorer: Scorer) -> list[CheckReport]:
    """Validate the behaviour of each puzzle; returns one report per puzzle, in order."""
    reports = [CheckReport(p) for p in puzzles]
    oracle = scorer.prepare(puzzles)
    good: list[CheckReport] = []
    for report in reports:
        p = report.puzzle
        problems, seconds = oracle.get(p.id, ([], 0.0))
        report.problems += problems
        budget = scorer.limits_for(p).timeout
        if not problems and seconds > budget * ORACLE_BUDGET_SHARE:
            report.problems.append(f"oracle took {seconds:.2f}s, over half its {budget:g}s time budget")
        if not report.problems:
            good.append(report)
    items = [(r.puzzle, code) for r in good for code in (r.puzzle.oracle, r.puzzle.oracle, r.puzzle.buggy, r.puzzle.buggy)]
    runs = scorer.run_many(items)
    for i, report in enumerate(good):
        oracle1, oracle2, buggy1, buggy2 = runs[4 * i: 4 * i + 4]
        budget = scorer.limits_for(report.puzzle).timeout
        report.buggy_statuses = _statuses(buggy1)
        report.seconds = max(r.seconds for r in (oracle1, oracle2, buggy1, buggy2))
        for name, run in (("oracle", oracle1), ("oracle", oracle2)):
            failing = [r for r in run.results if not r.passed]
            if failing:
                report.problems.append(f"{name} fails test {failing[0].index}: {failing[0].message}")
        if buggy1.all_passed:
            report.problems.append("buggy code passes every test: the tests do not catch the bug")
        if _statuses(oracle1) != _statuses(oracle2) or _statuses(buggy1) != _statuses(buggy2):
            report.problems.append("verdict changed between two identical runs (non-deterministic tests?)")
        slow = [run.seconds for run in (buggy1, buggy2) if TIMEOUT not in _statuses(run) and run.seconds > budget]
        if slow:
            report.problems.append(f"a run took {max(slow):.2f}s, over its {budget:g}s time budget")
    return reports
