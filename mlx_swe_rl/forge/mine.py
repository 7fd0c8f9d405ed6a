"""The miner: bug-fix tasks from a git history (`mlx-swe-rl puzzles mine REPO --out DIR`).

SWE-RL's data pipeline in miniature. Every commit reachable from HEAD passes a funnel of
rules, in this order (the first that applies drops it):

  merge                 a merge commit
  bot                   author or committer is a bot (dependabot, pre-commit-ci, ...[bot])
  revert                the subject says `Revert "..."` (it undoes a change: its "fix" is
                        the older code)
  no_python             no .py file changed
  tests_only            only test files changed (a path part test/tests/testing, or
                        test_*.py / *_test.py, as R2E-Gym and SWE-bench tell them)
  file_added_deleted    a non-test .py file was added, deleted or renamed (git shows a
                        rename as both)
  several_files         more than one non-test .py file changed
  too_large             more than `max_lines` lines of it changed
  parse_error           either version does not parse (or is not UTF-8)
  functions_added_removed  a function or method was added, removed or renamed
  outside_function      a line outside every function changed (imports, constants, class
                        bodies, comments between functions; a function moved)
  several_functions     more than one function changed
  cosmetic              the function changed only in docstrings, comments or formatting
  no_message            the commit message is empty once trailers are removed
  duplicate             the same change (normalised) was kept from an older commit

What is left is a task: the commit message without trailers as the description, the
function at the parent as buggy code and at the commit as the oracle. Where the function is
self-contained and its docstring has doctest examples (`doctests`), they become tests,
validated like any puzzle (`checks.check_puzzles`); the others have no tests and train on
rewards that need none. The newest `heldout_frac` of the tasks are held out, and so is
every task of a function (path and qualified name) that has tasks on both sides of that cut.
"""

from __future__ import annotations

import re
import time
from collections import Counter, OrderedDict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from ..puzzles.format import Puzzle, normal_form
from ..sandbox.pool import Limits
from ..sandbox.scorer import Scorer
from . import history
from .checks import check_puzzles, keep_split_sound
from .doctests import docstring_of, doctest_tests, module_imports, needed_imports, with_test_imports
from .licence import is_licence_file, licence_id
from .puzzleset import write_puzzle_set
from .repotests import REASONS as REPO_REASONS, RepoTestFunnel, find_repo_tests
from ..puzzles.repotests import RepoTests, repo_tests
from ..puzzles.trainset import write_train_set
from .units import Module, parse_module

REASONS = ("merge", "bot", "revert", "no_python", "tests_only", "file_added_deleted", "several_files", "too_large",
           "parse_error", "functions_added_removed", "outside_function", "several_functions", "cosmetic",
           "no_message", "duplicate")
SUMMARY_FILE = "mine.json"
REPO_TEST_SETS = {"train": "repo-tests-train.json", "heldout": "repo-tests-heldout.json"}
BOT = re.compile(r"\[bot\]|dependabot|pre-commit-ci|renovate|github-actions|greenkeeper|mergify|snyk-bot|"
                 r"allcontributors|imgbot|pyup-bot|\bbot@", re.IGNORECASE)
TEST_PARTS = {"test", "tests", "testing"}
# Trailers git and forges add; dropped wherever they stand in the message.
KNOWN_TRAILER = re.compile(r"^\s*(signed-off-by|co-authored-by|reviewed-by|acked-by|tested-by|reported-by|"
                           r"suggested-by|helped-by|cc|change-id|reviewed-on)\s*:", re.IGNORECASE)
TRAILER_LINE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*:\s+\S")  # git's "Token: value"
REVERT = re.compile(r'^Revert "')
CHERRY_PICK = re.compile(r"^\s*\(cherry picked from commit [0-9a-f]+\)\s*$")
MODULE_CACHE = 16  # parsed file versions kept: a commit's old side is usually the newer commit's new side


@dataclass(frozen=True)
class MineSettings:
    max_lines: int = 30  # changed lines (added + deleted) in the one source file
    heldout_frac: float = 0.2  # newest share of the tasks held out
    max_commits: int | None = None  # only the newest N commits (for a quick look)
    since: str | None = None  # only commits after this date (anything `git log --since` takes)
    tests: bool = True  # turn doctest examples into tests (needs the sandbox)
    repo_tests: bool = True  # FAIL_TO_PASS tests from the commit's own test changes (`repotests`; needs the sandbox)
    snapshots: str | None = None  # where commit snapshots are cached (default: beside the repository)
    repeats: int = 3  # runs of each side of a FAIL_TO_PASS candidate; differing verdicts are flaky
    test_timeout: float = 60.0  # seconds a pytest run of a candidate's tests may take (then: too_slow)


@dataclass
class Change:
    """A commit that changed one function, in one non-test file: the makings of a task."""

    commit: history.Commit
    path: str
    qualname: str
    name: str
    in_class: bool
    buggy: str  # the function alone (dedented), at the parent
    oracle: str  # and at the commit
    description: str
    test_files: tuple[str, ...]  # test files the commit also changed
    imports: tuple[list[str], dict[str, str]] = ([], {})  # the module's future lines and allowed imports
    prefix: str = ""  # the import lines carried into the code (only when tests are attached)
    tests: tuple[str, ...] = ()
    repo: RepoTests | None = None  # the repository tests that verify it (FAIL_TO_PASS)


@dataclass
class Mined:
    """What a history gave: the kept changes (oldest first) and how many commits each rule
    dropped."""

    repo: Path
    name: str
    head: str | None
    licence: str | None
    settings: MineSettings
    changes: list[Change] = field(default_factory=list)
    funnel: Counter = field(default_factory=Counter)
    commits: int = 0
    python_commits: int = 0  # commits that change any .py file
    test_counts: Counter = field(default_factory=Counter)  # candidates / attached / rejected
    repo_funnel: RepoTestFunnel | None = None  # why changes got no FAIL_TO_PASS tests
    seconds: float = 0.0


class MineError(ValueError):
    """A repository the miner cannot use; the message names it."""


def sanitize(text: str) -> str:
    """A name that fits puzzle ids and folders: lowercase, [a-z0-9_-], never empty."""
    return re.sub(r"[^a-z0-9_-]", "_", text.lower()).strip("-") or "_"


def is_test_path(path: str) -> bool:
    """The test-file rule of R2E-Gym and SWE-bench: a path part test/tests/testing, or a
    file named test_*.py or *_test.py (test.py and tests.py too)."""
    parts = PurePosixPath(path).parts
    name = PurePosixPath(path).name
    stem = name[:-3] if name.endswith(".py") else name
    return bool(TEST_PARTS & set(parts[:-1])) or stem in TEST_PARTS or name.startswith("test_") \
        or stem.endswith("_test")


def is_bot(commit: history.Commit) -> bool:
    return bool(BOT.search(commit.author) or BOT.search(commit.committer))


def description(message: str) -> str:
    """The commit message without trailers (Signed-off-by:, Co-authored-by:, ...; a last
    paragraph made only of `Token: value` lines) and cherry-pick notes."""
    lines = [line.rstrip() for line in message.strip().splitlines()
             if not KNOWN_TRAILER.match(line) and not CHERRY_PICK.match(line)]
    paragraphs: list[list[str]] = [[]]
    for line in lines:
        if line.strip():
            paragraphs[-1].append(line)
        elif paragraphs[-1]:
            paragraphs.append([])
    paragraphs = [p for p in paragraphs if p]
    if len(paragraphs) > 1 and all(TRAILER_LINE.match(line) for line in paragraphs[-1]):
        paragraphs.pop()
    return "\n\n".join("\n".join(p) for p in paragraphs).strip()


class _Modules:
    """Parsed file versions by blob id, a few kept (each commit's old side is, in a linear
    history, the next older commit's new side)."""

    def __init__(self, blobs: history.Blobs):
        self.blobs = blobs
        self.cache: OrderedDict[str, Module | None] = OrderedDict()

    def get(self, blob: str) -> Module | None:
        if blob in self.cache:
            self.cache.move_to_end(blob)
            return self.cache[blob]
        data = self.blobs.read(blob)
        module = parse_module(data, module_imports) if data is not None else None
        self.cache[blob] = module
        if len(self.cache) > MODULE_CACHE:
            self.cache.popitem(last=False)
        return module


def examine(commit: history.Commit, modules: _Modules, max_lines: int) -> tuple[str, Change | None]:
    """The first rule that drops `commit`, or ("kept", its change)."""
    if len(commit.parents) > 1:
        return "merge", None
    if is_bot(commit):
        return "bot", None
    if REVERT.match(commit.message):
        return "revert", None
    python = [f for f in commit.files if f.path.endswith(".py")]
    if not python:
        return "no_python", None
    sources = [f for f in python if not is_test_path(f.path)]
    if not sources:
        return "tests_only", None
    if any(f.status != "M" for f in sources):
        return "file_added_deleted", None
    if len(sources) > 1:
        return "several_files", None
    change = sources[0]
    if change.added is None or change.deleted is None or change.added + change.deleted > max_lines:
        return "too_large", None
    old, new = modules.get(change.old_blob), modules.get(change.new_blob)
    if old is None or new is None:
        return "parse_error", None
    if set(old.units) != set(new.units):
        return "functions_added_removed", None
    if old.outside() != new.outside():
        return "outside_function", None
    changed = [key for key in old.units if old.segment(key) != new.segment(key)]
    if not changed:  # e.g. only the file's mode changed
        return "outside_function", None
    if len(changed) > 1:
        return "several_functions", None
    key = changed[0]
    buggy, oracle = old.code(key), new.code(key)
    try:
        if normal_form(buggy) == normal_form(oracle):
            return "cosmetic", None
    except (SyntaxError, ValueError):  # a method whose dedented text does not stand alone
        return "parse_error", None
    text = description(commit.message)
    if not text:
        return "no_message", None
    unit = new.units[key]
    imports: tuple[list[str], dict[str, str]] = ([], {})
    if not unit.in_class and (">>>" in buggy or ">>>" in oracle):
        (future_a, names_a), (future_b, names_b) = old.extra, new.extra
        imports = (sorted(set(future_a) | set(future_b)), {**names_a, **names_b})
    tests = tuple(sorted(f.path for f in python if is_test_path(f.path)))
    return "kept", Change(commit, change.path, unit.qualname, unit.name, unit.in_class, buggy, oracle, text,
                          tests, imports)


def repository_licence(repo: Path, blobs: history.Blobs) -> str | None:
    """The licence identifier(s) of the files LICENSE, COPYING... at HEAD ("unknown" for a
    text not recognised), None without such a file."""
    found = []
    for name in history.top_level_files(repo):
        if is_licence_file(name):
            data = blobs.read(f"HEAD:{name}")
            if data is not None:
                found.append(licence_id(data.decode("utf-8", "replace")))
    known = sorted(set(found) - {"unknown"})
    return ", ".join(known) if known else ("unknown" if found else None)


def collect(repo: Path, settings: MineSettings = MineSettings(),
            progress: Callable[[int], None] | None = None) -> Mined:
    """Walk the history and keep the commits that pass every rule, oldest first, deduplicated."""
    start = time.monotonic()
    repo = Path(repo)
    if not history.is_repository(repo):
        raise MineError(f"{repo}: not a git repository")
    head = history.head(repo)
    if head is None:
        raise MineError(f"{repo}: no Python history (the repository has no commits)")
    with history.Blobs(repo) as blobs:
        mined = Mined(repo, history.repository_name(repo), head, repository_licence(repo, blobs), settings)
        modules = _Modules(blobs)
        found: list[Change] = []
        for commit in history.commits(repo, settings.max_commits, settings.since):
            mined.commits += 1
            mined.python_commits += any(f.path.endswith(".py") for f in commit.files)
            reason, change = examine(commit, modules, settings.max_lines)
            if change is None:
                mined.funnel[reason] += 1
            else:
                found.append(change)
            if progress:
                progress(1)
    if not mined.python_commits:
        raise MineError(f"{repo}: no Python history (no commit{' in range' if settings.since or settings.max_commits else ''} "
                        "changes a .py file)")
    seen: set[tuple[str, str]] = set()
    for change in sorted(found, key=lambda c: (c.commit.timestamp, c.commit.sha)):
        pair = (normal_form(change.buggy), normal_form(change.oracle))
        if pair in seen:
            mined.funnel["duplicate"] += 1
            continue
        seen.add(pair)
        mined.changes.append(change)
    mined.funnel["kept"] = len(mined.changes)
    mined.seconds += time.monotonic() - start
    return mined


def test_candidates(change: Change) -> list[tuple[str, tuple[str, ...]]]:
    """(import prefix, tests) to try for a change, best first: from the oracle's docstring,
    then from the buggy one's. Empty when the function is a method, is not self-contained,
    or its docstrings give no assert."""
    future, imports = change.imports
    if change.in_class or ">>>" not in change.buggy + change.oracle:
        return []
    needed = [needed_imports(code, imports) for code in (change.buggy, change.oracle)]
    if None in needed:
        return []
    carried = future + sorted(set(needed[0]) | set(needed[1]))
    out: list[tuple[str, tuple[str, ...]]] = []
    for code in (change.oracle, change.buggy):
        tests = doctest_tests(docstring_of(code) or "", change.name, set(imports))
        if tests:
            candidate = ("\n".join(carried), tuple(with_test_imports(tests, imports, carried)))
            if candidate not in out:
                out.append(candidate)
    return out


def _with_prefix(prefix: str, code: str) -> str:
    return f"{prefix}\n\n\n{code}" if prefix else code


def attach_tests(mined: Mined, scorer: Scorer) -> None:
    """Give each change the first of its test candidates that passes `puzzles check` (buggy
    fails one, oracle passes all, stable, within time); the others keep no tests."""
    start = time.monotonic()
    todo = {i: test_candidates(c) for i, c in enumerate(mined.changes)}
    todo = {i: cands for i, cands in todo.items() if cands}
    mined.test_counts["candidates"] = len(todo)
    while todo:
        trial = {i: cands.pop(0) for i, cands in todo.items()}
        puzzles = [Puzzle(f"candidate_{i}", "mined", "train", mined.changes[i].name, mined.changes[i].description,
                          _with_prefix(prefix, mined.changes[i].buggy), _with_prefix(prefix, mined.changes[i].oracle),
                          tests) for i, (prefix, tests) in trial.items()]
        # Without the split check: which doctests a task keeps stays as it was; its split is made
        # to hold once the task has its id (build_puzzles).
        for (i, (prefix, tests)), report in zip(trial.items(), check_puzzles(puzzles, scorer, split=None)):
            if report.ok:
                mined.changes[i] = replace(mined.changes[i], prefix=prefix, tests=tests)
                del todo[i]
            elif not todo[i]:
                del todo[i]
    mined.test_counts["attached"] = sum(bool(c.tests) for c in mined.changes)
    mined.test_counts["rejected"] = mined.test_counts["candidates"] - mined.test_counts["attached"]
    mined.seconds += time.monotonic() - start


def snapshot_dir(mined: Mined) -> Path:
    """Where the commits' snapshots are cached: `settings.snapshots`, else beside the repository."""
    if mined.settings.snapshots:
        return Path(mined.settings.snapshots).resolve()
    return mined.repo.resolve().parent / f".{mined.repo.resolve().name}-snapshots"


def attach_repo_tests(mined: Mined, scorer: Scorer, progress: Callable[[int], None] | None = None) -> None:
    """Give each change whose commit changed tests the FAIL_TO_PASS tests that verify it
    (`repotests.find_repo_tests`); counts why the others got none in `mined.repo_funnel`."""
    start = time.monotonic()
    found, mined.repo_funnel = find_repo_tests(mined.repo, mined.changes, scorer.sandbox, snapshot_dir(mined),
                                               Limits(timeout=mined.settings.test_timeout, memory_mb=2048),
                                               repeats=mined.settings.repeats, progress=progress)
    for i, tests in found.items():
        mined.changes[i] = replace(mined.changes[i], repo=tests)
    mined.seconds += time.monotonic() - start


def split(changes: list[Change], heldout_frac: float) -> list[str]:
    """The split of each change (oldest first): the newest `heldout_frac` held out, and every
    change of a function that also changed on the other side of that cut."""
    cut = len(changes) - round(heldout_frac * len(changes))
    late = {(c.path, c.qualname) for c in changes[cut:]}
    return ["heldout" if i >= cut or (c.path, c.qualname) in late else "train" for i, c in enumerate(changes)]


def build_puzzles(mined: Mined, scorer: Scorer | None = None) -> list[Puzzle]:
    """The tasks, oldest first, with ids `<qualname>-<sha7>` (longer shas where two collide).
    With a scorer, tasks with tests get the `hidden_tests` multi-turn repair's split needs
    (`checks.keep_split_sound`)."""
    tier = sanitize(mined.name)
    ids: set[str] = set()
    puzzles = []
    for change, which in zip(mined.changes, split(mined.changes, mined.settings.heldout_frac)):
        commit = change.commit
        width = 7
        while (pid := f"{sanitize(change.qualname)}-{commit.sha[:width]}") in ids:
            width += 1
        ids.add(pid)
        source: dict[str, str | int] = {
            "repo": mined.name, "sha": commit.sha, "parent": commit.parents[0], "path": change.path,
            "qualname": change.qualname, "date": commit.date, "subject": change.description.splitlines()[0]}
        if mined.licence:
            source["licence"] = mined.licence
        if change.test_files:
            source["test_files"] = " ".join(change.test_files)
        prefix, tests = change.prefix, change.tests
        if change.repo is not None:  # the repository's tests judge it: the function alone, as it sits in its file
            prefix, tests = "", change.repo.tests()
            source.update(change.repo.source_fields())
        puzzles.append(Puzzle(pid, tier, which, change.name, change.description,
                              _with_prefix(prefix, change.buggy), _with_prefix(prefix, change.oracle),
                              tests, source=source))
    if scorer is not None and any(p.tests for p in puzzles):
        puzzles = keep_split_sound(puzzles, scorer)
    return puzzles


def summary(mined: Mined, puzzles: list[Puzzle]) -> dict[str, Any]:
    """What `mine.json` records. Everything but `timing` is the same for the same arguments
    and history."""
    splits = Counter(p.split for p in puzzles)
    newest = round(mined.settings.heldout_frac * len(puzzles))
    return {
        "repository": {"path": str(mined.repo), "name": mined.name, "head": mined.head, "licence": mined.licence},
        "settings": asdict(mined.settings),
        "funnel": {"commits": mined.commits, **{r: mined.funnel[r] for r in REASONS}, "kept": mined.funnel["kept"]},
        "python_commits": mined.python_commits,
        "tasks": {
            "total": len(puzzles),
            "with_tests": sum(bool(p.tests) for p in puzzles),
            "with_repo_tests": sum(c.repo is not None for c in mined.changes),
            "without_tests": sum(not p.tests for p in puzzles),
            "doctest_candidates": mined.test_counts["candidates"],
            "doctest_rejected": mined.test_counts["rejected"],
            "train": splits["train"],
            "heldout": splits["heldout"],
            "heldout_newest": newest,
            "heldout_same_function": splits["heldout"] - newest,
            "train_functions": len({(c.path, c.qualname) for c, p in zip(mined.changes, puzzles) if p.split == "train"}),
            "heldout_functions": len({(c.path, c.qualname) for c, p in zip(mined.changes, puzzles)
                                      if p.split == "heldout"}),
        },
        "repo_tests": mined.repo_funnel.as_dict() if mined.repo_funnel else None,
        "timing": {"seconds": round(mined.seconds, 2),
                   "commits_per_second": round(mined.commits / mined.seconds, 1) if mined.seconds else None},
    }


def write_mined(mined: Mined, puzzles: list[Puzzle], out: Path, overwrite: bool = False) -> dict[str, Any]:
    """Write `<out>/<tier>/<id>.yaml` and `<out>/mine.json` at once; returns the summary."""
    data = summary(mined, puzzles)
    write_puzzle_set(puzzles, out, SUMMARY_FILE, data, overwrite, kind="mined set")
    for which in ("train", "heldout"):  # the FAIL_TO_PASS tasks alone, for --puzzles and puzzles.dir
        chosen = [p for p in puzzles if p.split == which and repo_tests(p) is not None]
        if chosen:
            write_train_set(Path(out) / REPO_TEST_SETS[which], chosen, Path(out),
                            {"kind": "repository tests (FAIL_TO_PASS)", "split": which})
    return data


def mine(repo: Path, settings: MineSettings = MineSettings(), scorer: Scorer | None = None,
         progress: Callable[[int], None] | None = None) -> tuple[Mined, list[Puzzle]]:
    """Collect, attach tests (when `settings.tests` and a scorer is given) and build the tasks."""
    mined = collect(repo, settings, progress)
    if settings.tests and scorer is not None:
        attach_tests(mined, scorer)
    if settings.repo_tests and scorer is not None:
        attach_repo_tests(mined, scorer)
    return mined, build_puzzles(mined, scorer if settings.tests or settings.repo_tests else None)


def format_funnel(data: dict[str, Any]) -> str:
    """The funnel table the command prints: each rule, how many commits it dropped, how many
    were left; then the tasks."""
    funnel = data["funnel"]
    left = funnel["commits"]
    rows = [("commits", "", str(left))]
    for reason in REASONS:
        left -= funnel[reason]
        rows.append((reason, str(funnel[reason]), str(left)))
    rows.append(("kept", "", str(funnel["kept"])))
    widths = [max(len(r[i]) for r in rows + [("rule", "dropped", "left")]) for i in range(3)]
    lines = [f"{'rule':<{widths[0]}}  {'dropped':>{widths[1]}}  {'left':>{widths[2]}}"]
    lines += [f"{a:<{widths[0]}}  {b:>{widths[1]}}  {c:>{widths[2]}}" for a, b, c in rows]
    t = data["tasks"]
    # A task with FAIL_TO_PASS tests is judged by them alone, so with_tests counts it once.
    from_repo = t.get("with_repo_tests", 0)
    lines.append(f"{t['total']} tasks: {t['with_tests']} with tests ({from_repo} from the repository's own tests, "
                 f"{t['with_tests'] - from_repo} from doctests: {t['doctest_candidates']} tried, "
                 f"{t['doctest_rejected']} rejected), {t['without_tests']} without; "
                 f"{t['train']} train, {t['heldout']} heldout ({t['heldout_newest']} newest, "
                 f"{t['heldout_same_function']} sharing a function with them)")
    repo = data.get("repo_tests")
    if repo:
        dropped = ", ".join(f"{r} {repo[r]}" for r in REPO_REASONS)
        missing = ", ".join(f"{m} ({n})" for m, n in repo["missing_modules"].items()) or "none"
        lines.append(f"repository tests: {repo['kept']} FAIL_TO_PASS tasks of {repo['candidates']} candidates "
                     f"(dropped: {dropped}); missing modules: {missing}")
    return "\n".join(lines)
