"""`puzzles check`: every puzzle's buggy code fails, its oracle passes, verdicts are stable,
and every run stays within its time budget.

A puzzle with two tests or more must also hold under multi-turn repair's split (puzzles.split,
by default one public test): its public tests, run alone with their set-up, pass with the
oracle, and the buggy code fails a hidden test, so that with the reward on the hidden tests the
oracle scores 1 and the buggy code 0. The forge and the miner make their puzzles hold
(`keep_split_sound`).

A task without tests (mined from a history, trained on rewards that need no tests) cannot
be run against anything: its rules are static. Buggy code and oracle parse, define the
entry point, and differ beyond docstrings, comments and formatting."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..puzzles.split import TestSplit, public_view
from ..puzzles.format import Puzzle, defines, normal_form
from ..sandbox.scorer import Scorer, TestRun
from ..sandbox.verdict import PASSED, TIMEOUT

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


def split_label(split: TestSplit, puzzle: Puzzle) -> str:
    """How a split problem names the split: "split (public test 2)"."""
    public = split.public_indices(puzzle)
    return f"split (public test{'s' if len(public) > 1 else ''} {', '.join(map(str, public))})"


def split_problems(puzzle: Puzzle, split: TestSplit, view_run: TestRun, buggy_run: TestRun) -> list[str]:
    """What breaks a puzzle under `split`: the oracle failing its public view (`view_run`), or
    buggy code that passes every hidden test (only a public one catches the bug, so it would
    earn the full reward). The oracle passing the hidden tests is the main check's: it passes
    every test."""
    label = split_label(split, puzzle)
    problems = []
    failing = next((r for r in view_run.results if not r.passed), None)
    if failing is not None:
        problems.append(f"{label}: oracle fails the public view's test {failing.index}: {failing.message}")
    hidden = set(split.hidden_indices(puzzle))
    if not buggy_run.all_passed and all(r.passed for r in buggy_run.results if r.index in hidden):
        problems.append(f"{label}: buggy code passes every hidden test (only the public tests catch the bug): "
                        "it would score 1; list the catching test in hidden_tests or add a test that catches it")
    return problems


def check_puzzles(puzzles: list[Puzzle], scorer: Scorer, split: TestSplit | None = TestSplit()) -> list[CheckReport]:
    """Validate each puzzle: the static rules for all, then (for puzzles with tests and no
    static problem) their behaviour in the sandbox, and under `split` for those with a public
    test (None: no split check). One report per puzzle, in order."""
    reports = [CheckReport(p, static_problems(p)) for p in puzzles]
    tested = [r for r in reports if r.puzzle.tests and not r.problems]
    views = {id(r): public_view(r.puzzle, split.public_indices(r.puzzle)) for r in tested
             if split is not None and split.public_indices(r.puzzle)}
    oracle = scorer.prepare([r.puzzle for r in tested] + list(views.values()))
    good: list[CheckReport] = []
    for report in tested:
        p = report.puzzle
        problems, seconds = oracle.get(p.id, ([], 0.0))
        report.problems += problems
        budget = scorer.limits_for(p).timeout
        if not problems and seconds > budget * ORACLE_BUDGET_SHARE:
            report.problems.append(f"oracle took {seconds:.2f}s, over half its {budget:g}s time budget")
        view_problems = oracle.get(views[id(report)].id, ([], 0.0))[0] if id(report) in views else []
        if not report.problems:
            good.append(report)
        if view_problems:  # its expected values are unknown: the view cannot be run
            report.problems.append(f"{split_label(split, p)}: public view: {view_problems[0]}")
            del views[id(report)]
    items = [(r.puzzle, code) for r in good for code in (r.puzzle.oracle, r.puzzle.oracle, r.puzzle.buggy, r.puzzle.buggy)]
    viewed = [r for r in good if id(r) in views]
    runs = scorer.run_many(items + [(views[id(r)], r.puzzle.oracle) for r in viewed])
    view_runs = dict(zip(map(id, viewed), runs[len(items):]))
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
        if id(report) in view_runs and not report.problems:
            report.problems += split_problems(report.puzzle, split, view_runs[id(report)], buggy1)
    return reports


def keep_split_sound(puzzles: list[Puzzle], scorer: Scorer, statuses: list[list[str]] | None = None,
                     split: TestSplit = TestSplit()) -> list[Puzzle]:
    """The puzzles, each with the `hidden_tests` that make `split` hold for it. `statuses`: each
    buggy code's verdict per test (None: run them). While a puzzle's public test is the only one
    that catches the bug (the buggy code would pass every hidden test and earn the full reward),
    or the oracle cannot run it with its set-up (it reads state a hidden assert leaves), that test
    is kept hidden and the split's next choice is tried. A puzzle whose first choice holds (or
    whose buggy code could not be run) comes back unchanged; one with no test left to show has
    no public test (generic feedback)."""
    out = list(puzzles)
    if statuses is None:
        runs = iter(scorer.run_many([(p, p.buggy) for p in out if p.tests]))
        statuses = [_statuses(next(runs)) if p.tests else [] for p in out]
    todo = [i for i in range(len(out)) if statuses[i]]  # a puzzle that could not be run stays as it is
    while todo:
        views = {i: public_view(out[i], split.public_indices(out[i])) for i in todo if split.public_indices(out[i])}
        broken = _broken_views(list(views.values()), scorer)
        again = []
        for i, view in views.items():
            caught = any(statuses[i][k] != PASSED for k in split.hidden_indices(out[i]))
            if caught and (view.oracle, view.tests) not in broken:
                continue
            out[i] = replace(out[i], hidden_tests=tuple(sorted({*out[i].hidden_tests, *split.public_indices(out[i])})))
            again.append(i)
        todo = again
    return out


def _broken_views(views: list[Puzzle], scorer: Scorer) -> set[tuple[str, tuple[str, ...]]]:
    """The (oracle, tests) of the public views whose expected values the oracle cannot give.
    Puzzles that share a view (mutants of one seed) run it once."""
    unique = {(v.oracle, v.tests): v for v in views}
    problems = scorer.prepare(list(unique.values()))
    return {key for key, v in unique.items() if problems.get(v.id, ([], 0.0))[0]}
