"""FAIL_TO_PASS tasks: a mined change verified by the tests its own commit added or changed.

SWE-bench's rule on one function. For a kept change whose commit also touched test files,
the test functions it added or changed are the FAIL_TO_PASS ids; the other tests of those
files are PASS_TO_PASS. Both run with pytest in the sandbox (`Sandbox.run_pytest`: a confined
copy of the commit's snapshot, no network, nothing written outside the job's directory),
once with the buggy file and twice with the fixed one and the buggy one (stability). A change
is kept when every FAIL_TO_PASS test fails on the buggy code and passes on the fix, and every
PASS_TO_PASS test passes on both. Every dropped change is counted under one reason
(`REASONS`), and the modules a repository's tests could not import are listed.

A snapshot is `git archive` of the commit: its files only, no `.git` (so no later commit and
no object a candidate could read the fix from), cached by sha and shared by the tasks of a commit.
"""

from __future__ import annotations

import io
import re
import tarfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..sandbox.pool import Execution, Limits, Sandbox, pytest_job
from . import history
from ..puzzles.repotests import RepoTests
from .units import Module, parse_module

REASONS = ("no_test_change", "pass_on_buggy", "fail_on_fix", "flaky", "network", "import_error", "too_slow")
NETWORK = re.compile(r"refused here \(no network\)|Operation not permitted.*socket|socket\.gaierror|"
                     r"Network is unreachable", re.IGNORECASE)
MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")
RUNS = 3  # runs of each side: a verdict that differs between them is flaky


@dataclass
class RepoTestFunnel:
    """Why each candidate was dropped, and which modules were missing."""

    candidates: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)
    missing_modules: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    score_seconds: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"candidates": self.candidates, **{r: self.dropped[r] for r in REASONS}, "kept": self.kept,
                "missing_modules": dict(sorted(self.missing_modules.items())),
                "seconds": round(self.seconds, 2), "runs": len(self.score_seconds),
                "seconds_per_run": round(sum(self.score_seconds) / len(self.score_seconds), 3)
                if self.score_seconds else None}


def snapshot(repo: Path, sha: str, cache: Path) -> Path:
    """The files of commit `sha` (no `.git`) under `cache/<sha>`, extracted once."""
    target = Path(cache) / sha
    if target.is_dir():
        return target
    data = history.git_bytes(repo, "archive", "--format=tar", sha)
    partial = target.with_name(sha + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(partial, filter="data")
    partial.rename(target)
    return target


def test_id(path: str, qualname: str) -> str:
    """pytest's id of a test function (methods as path::Class::name)."""
    return f"{path}::{qualname.replace('.', '::')}"


def is_test_function(name: str) -> bool:
    return name.startswith("test")


def changed_tests(old: Module | None, new: Module) -> tuple[list[str], list[str]]:
    """(added or changed, unchanged) test function keys of one test file."""
    changed, same = [], []
    for key, unit in new.units.items():
        if not is_test_function(unit.name) or "#" in key:
            continue
        if old is None or key not in old.units or old.segment(key) != new.segment(key):
            changed.append(unit.qualname)
        else:
            same.append(unit.qualname)
    return changed, same


def outcomes(run: Execution, count: int) -> list[str]:
    return [str((run.tests.get(i) or {}).get("values", ["missing"])[0]) for i in range(count)]


def stable(sides: list[list[list[str]]]) -> list[bool]:
    """Per test id: whether every run of every side gave it the same outcome as that side's first."""
    count = len(sides[0][0])
    return [all(run[i] == side[0][i] for side in sides for run in side) for i in range(count)]


def _drop_reason(buggy: list[str], fixed: list[str], runs: list[Execution], f2p: int, steady: list[bool]) -> str | None:
    """Why a candidate is dropped (None to keep it), from the first run of each side; the
    first `f2p` ids are the changed tests. An unsteady changed test makes it flaky; an unsteady
    older test is only left out of PASS_TO_PASS (SWE-bench drops flaky PASS_TO_PASS too)."""
    text = "\n".join(r.output + (r.load_error or "") for r in runs)
    if any(r.stop == "timeout" for r in runs):
        return "too_slow"
    if not all(steady[:f2p]):
        return "flaky"
    if any(o != "passed" for o, ok in zip(fixed, steady) if ok):
        if NETWORK.search(text):
            return "network"
        if MISSING_MODULE.search(text) or "ImportError" in text:
            return "import_error"
        return "fail_on_fix"
    if all(o == "passed" for o in buggy[:f2p]):
        return "pass_on_buggy"
    return None


def find(repo: Path, change, blobs: history.Blobs, sandbox: Sandbox, cache: Path, limits: Limits,
         funnel: RepoTestFunnel, repeats: int = RUNS) -> RepoTests | None:
    """The FAIL_TO_PASS tests of one mined change (a `mine.Change`), or None with the reason counted."""
    if not change.test_files:
        funnel.dropped["no_test_change"] += 1
        return None
    commit = change.commit
    f2p, p2p = [], []
    for path in change.test_files:
        new = blobs.read(f"{commit.sha}:{path}")
        module = parse_module(new) if new is not None else None
        if module is None:
            continue
        old = blobs.read(f"{commit.parents[0]}:{path}")
        changed, same = changed_tests(parse_module(old) if old is not None else None, module)
        f2p += [test_id(path, q) for q in changed]
        p2p += [test_id(path, q) for q in same]
    if not f2p:
        funnel.dropped["no_test_change"] += 1
        return None
    funnel.candidates += 1
    buggy_file = blobs.read(f"{commit.parents[0]}:{change.path}")
    snap = snapshot(repo, commit.sha, cache)
    ids = f2p + p2p
    sides = [{}, {change.path: buggy_file.decode("utf-8", "replace")}]  # the fix, then the fix with the bug put back
    jobs = [(pytest_job(str(snap), files, ids), limits) for _ in range(repeats) for files in sides]
    # One run of each side first: a run that hits the time limit drops the candidate whatever
    # the others say, so a slow test file costs one limit instead of `repeats` of them.
    runs = sandbox.run_jobs(jobs[:2])  # in parallel across the workers
    if not any(r.stop == "timeout" for r in runs):
        runs += sandbox.run_jobs(jobs[2:])
    funnel.score_seconds += [r.seconds for r in runs]
    fixed = [outcomes(r, len(ids)) for r in runs[0::2]]
    buggy = [outcomes(r, len(ids)) for r in runs[1::2]]
    for name in MISSING_MODULE.findall("\n".join(r.output for r in runs)):
        funnel.missing_modules[name.split(".")[0]] += 1
    steady = stable([fixed, buggy])
    reason = _drop_reason(buggy[0], fixed[0], runs, len(f2p), steady)
    if reason is not None:
        funnel.dropped[reason] += 1
        return None
    # FAIL_TO_PASS: the steady tests the buggy code fails (the changed ones, and any older test
    # the bug breaks); PASS_TO_PASS: the steady rest, which pass on both sides.
    funnel.kept += 1
    kept = [(i, o) for i, o, ok in zip(ids, buggy[0], steady) if ok]
    return RepoTests(str(snap), change.path, change.qualname, tuple(i for i, o in kept if o != "passed"),
                     tuple(i for i, o in kept if o == "passed"))


def find_repo_tests(repo: Path, changes: list, sandbox: Sandbox, cache: Path,
                    limits: Limits = Limits(timeout=60.0, memory_mb=2048), repeats: int = RUNS,
                    progress: Callable[[int], None] | None = None) -> tuple[dict[int, RepoTests], RepoTestFunnel]:
    """FAIL_TO_PASS tests for each of `changes` (`mine.Change`s) that has them, by index, and the funnel."""
    start = time.monotonic()
    funnel = RepoTestFunnel()
    found: dict[int, RepoTests] = {}
    with history.Blobs(repo) as blobs:
        for i, change in enumerate(changes):
            tests = find(repo, change, blobs, sandbox, cache, limits, funnel, repeats)
            if tests is not None:
                found[i] = tests
            if progress:
                progress(1)
    funnel.seconds = time.monotonic() - start
    return found, funnel
