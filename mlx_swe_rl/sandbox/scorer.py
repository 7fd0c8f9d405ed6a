"""The one scorer: run candidate code against a puzzle's tests and judge the results.

Training, rollouts, evaluation and `puzzles check` all go through `Scorer`, so a
completion gets the same verdict wherever it is scored.

A puzzle whose expected values cannot be computed (its oracle fails its own tests, say under
load) cannot judge anything: its items come back as error runs (`TestRun.error`), logged once
per puzzle, and the rest of the batch is scored. `expectations` raises instead, for callers
that want to stop at a broken puzzle.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from ..puzzles.format import Puzzle, PuzzleError
from ..puzzles.repotests import node_id, repo_tests, splice
from .pool import Execution, Limits, Sandbox, pytest_job
from .verdict import Expectation, TestResult, judge, oracle_expectations

REPO_TIMEOUT = 30.0  # seconds for a repository-test run without its own timeout (pytest starts in ~0.3 s)
REPO_MEMORY_MB = 2048


@dataclass(frozen=True)
class TestRun:
    """A candidate's per-test results on one puzzle."""

    results: list[TestResult]
    output: str = ""
    seconds: float = 0.0
    error: str | None = None  # why the puzzle could not be scored (never run: no results)

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def total(self) -> int:
        return len(self.results)

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total


log = logging.getLogger(__name__)


def _key(puzzle: Puzzle) -> tuple:
    """Expected values depend on the oracle and the tests, not only on the id."""
    return puzzle.id, puzzle.oracle, puzzle.tests


def repo_verdict(puzzle: Puzzle, run: Execution | None) -> TestRun:
    """Per-test results of a pytest run: passed only when pytest reports the id passed (a
    missing run, code that does not fit the file, or a run cut short fail every test)."""
    results = []
    for index, test in enumerate(puzzle.tests):
        line = run.tests.get(index) if run is not None and run.done else None
        outcome = str(line["values"][0]) if line and line.get("values") else "failed"
        status = "passed" if outcome == "passed" else ("timeout" if run is not None and run.stop == "timeout"
                                                       else "failed")
        detail = str(line.get("error") or "") if line else ""
        results.append(TestResult(index, status, "" if status == "passed" else detail or f"{node_id(test)}: {outcome}"))
    if run is None:
        return TestRun(results, "the code does not replace the task's function")
    return TestRun(results, run.output, run.seconds)


class Scorer:
    """Scores code for puzzles in a pool of sandbox workers.

    Expected values come from running each puzzle's oracle once, in a sandbox pool of its
    own, so no candidate process ever holds them (see `sandbox`)."""

    def __init__(self, workers: int | None = None, limits: Limits = Limits(), drop_privileges: bool | None = None,
                 confinement: str = "auto", require_confinement: bool = False):
        self.limits = limits
        self.sandbox = Sandbox(workers, limits, drop_privileges, confinement, require_confinement)
        self._confinement_mode = confinement
        self._oracle_box: Sandbox | None = None
        self._expected: dict[tuple, list[list[Expectation]]] = {}
        self._lock = threading.Lock()
        self._logged: set[str] = set()  # puzzle ids whose error was logged

    @property
    def confinement(self) -> str:
        """What confines candidate processes, in words (see `sandbox.confine`)."""
        return self.sandbox.confinement

    def limits_for(self, puzzle: Puzzle) -> Limits:
        return replace(self.limits, timeout=puzzle.timeout) if puzzle.timeout else self.limits

    def prepare(self, puzzles: list[Puzzle]) -> dict[str, tuple[list[str], float]]:
        """Run the oracle (with the expected-value probes) of each puzzle not seen yet and
        cache the expected values of those whose oracle passes its own tests. Returns
        {puzzle id: (problems, oracle seconds)} for the puzzles it ran."""
        todo = list({_key(p): p for p in puzzles if _key(p) not in self._expected and repo_tests(p) is None}.values())
        if not todo:
            return {}
        with self._lock:
            if self._oracle_box is None:
                self._oracle_box = Sandbox(min(2, self.sandbox.size), self.limits, confinement=self._confinement_mode)
        jobs = [(p.oracle, [plan.oracle_steps for plan in p.plans], self.limits_for(p)) for p in todo]
        found = {}
        for puzzle, run in zip(todo, self._oracle_box.run_many(jobs)):
            expects, problems = oracle_expectations(run, puzzle.plans)
            if not problems:
                self._expected[_key(puzzle)] = expects
            found[puzzle.id] = (problems, run.seconds)
        return found

    def expectations(self, puzzles: list[Puzzle]) -> None:
        """Make sure the expected values of `puzzles` are known; a puzzle whose oracle fails
        its own tests raises PuzzleError."""
        by_id = {p.id: p for p in puzzles}
        for pid, (problems, _) in self.prepare(puzzles).items():
            if problems:
                raise PuzzleError(f"{by_id[pid].path or pid}: oracle: {problems[0]}")

    def errors(self, puzzles: list[Puzzle]) -> dict[str, str]:
        """{puzzle id: why it cannot be scored} for those of `puzzles` whose expected values
        cannot be computed (the oracle's first problem); each is logged once per puzzle id.
        A puzzle that failed is tried again on the next call (a failure under load may pass)."""
        found = {pid: problems[0] for pid, (problems, _) in self.prepare(puzzles).items() if problems}
        for pid, error in found.items():
            if pid not in self._logged:
                self._logged.add(pid)
                log.warning("puzzle %s cannot be scored, its answers get an error verdict: %s", pid, error)
        return found

    def run_many(self, items: list[tuple[Puzzle, str]]) -> list[TestRun]:
        """Score (puzzle, code) pairs in parallel; results in input order. An item whose puzzle
        cannot be scored gets an error run (`errors`), the others their verdicts."""
        errors = self.errors([p for p, _ in items])
        repo = {i: self._repo_job(p, code) for i, (p, code) in enumerate(items) if repo_tests(p) is not None}
        good = [i for i, (p, _) in enumerate(items) if _key(p) in self._expected and i not in repo]
        jobs = [({"code": code, "tests": [plan.candidate_steps for plan in p.plans]}, self.limits_for(p))
                for p, code in (items[i] for i in good)]
        jobs += [job for job in repo.values() if job[0] is not None]
        ran = good + [i for i, job in repo.items() if job[0] is not None]
        runs = dict(zip(ran, self.sandbox.run_jobs(jobs)))
        out = []
        for i, (p, _) in enumerate(items):
            if i in repo:
                out.append(repo_verdict(p, runs.get(i)))
            elif i in runs:
                out.append(TestRun(judge(runs[i], self._expected[_key(p)]), runs[i].output, runs[i].seconds))
            else:
                out.append(TestRun([], error=errors.get(p.id, "expected values unknown")))
        return out

    def _repo_job(self, puzzle: Puzzle, code: str) -> tuple[dict | None, Limits]:
        """The pytest job of a repository-test task: the candidate's function spliced into the
        fixed file of the snapshot (only that file: a candidate cannot edit a test), the task's
        own test ids (a public view's only the public ones). No job when the code does not fit."""
        tests = repo_tests(puzzle)
        limits = replace(self.limits, timeout=puzzle.timeout or REPO_TIMEOUT,
                         memory_mb=max(self.limits.memory_mb, REPO_MEMORY_MB))
        try:
            fixed = (Path(tests.snapshot) / tests.path).read_text(encoding="utf-8")
        except OSError as exc:
            raise PuzzleError(f"{puzzle.path or puzzle.id}: snapshot: {exc.strerror}: {tests.snapshot}") from None
        text = splice(fixed, tests.qualname, code)
        if text is None:
            return None, limits
        ids = [node_id(t) or "" for t in puzzle.tests]
        return pytest_job(tests.snapshot, {tests.path: text}, ids), limits

    def run(self, puzzle: Puzzle, code: str) -> TestRun:
        return self.run_many([(puzzle, code)])[0]

    def close(self) -> None:
        self.sandbox.close()
        if self._oracle_box is not None:
            self._oracle_box.close()

    def __enter__(self) -> "Scorer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
