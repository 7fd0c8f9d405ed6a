"""`puzzles check`: every puzzle's buggy code fails, its oracle passes, verdicts are stable,
and every run stays within its time budget.

A task without tests (mined from a history, trained on rewards that need no tests) cannot
be run against anything: its rules are static. Buggy code and oracle parse, define the
entry point, and differ beyond docstrings, comments and formatting."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..puzzles.format import Puzzle, defines, normal_form
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


def static_problems(p: Puzzle) -> list[str]:
    """What is wrong with a puzzle without running it: code that does not parse or define
    the entry point, or a buggy version equal to the oracle but for docstrings, comments and
    formatting (nothing to fix)."""
    problems = [f"{key}: does not parse or does not define entry_point '{p.entry_point}'"
                for key, code in (("buggy", p.buggy), ("oracle", p.oracle)) if not defines(code, p.entry_point)]
    if not problems and normal_form(p.buggy) == normal_form(p.oracle):
        problems.append("buggy and oracle differ only in docstrings, comments or formatting: nothing to fix")
    return problems


def check_puzzles(puzzles: list[Puzzle], scorer: Scorer) -> list[CheckReport]:
    """Validate each puzzle: the static rules for all, then (for puzzles with tests and no
    static problem) their behaviour in the sandbox. One report per puzzle, in order."""
    reports = [CheckReport(p, static_problems(p)) for p in puzzles]
    tested = [r for r in reports if r.puzzle.tests and not r.problems]
    oracle = scorer.prepare([r.puzzle for r in tested])
    good: list[CheckReport] = []
    for report in tested:
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
