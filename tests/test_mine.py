"""`puzzles mine`: bug-fix tasks from a git history, on a small repository built here."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlx_swe_rl.cli.app import main
from mlx_swe_rl.forge.checks import check_puzzles
from mlx_swe_rl.forge.doctests import doctest_tests, needed_imports
from mlx_swe_rl.forge.licence import licence_id
from mlx_swe_rl.forge.mine import (REASONS, MineSettings, description, is_test_path, mine, sanitize,
                                   split, summary)
from mlx_swe_rl.forge.units import parse_module
from mlx_swe_rl.puzzles.format import NAME, load_puzzles

MIT = """MIT License

Copyright (c) 2024 Example

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction.
"""

CORE = '''"""Core helpers."""
import functools

LIMIT = 10


def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > lo:
        return hi
    return x


def head_of(items):
    """The first item.

    >>> head_of([7, 7])
    7
    """
    return items[1]


def describe(x):
    """Describe x."""
    return f"value {x}"


def first(xs):
    return xs[0]


def last(xs):
    return xs[1]


def fmt(x):
    return str(x)


@functools.lru_cache(maxsize=1)
def cached_total(n):
    return sum(range(n))


class Stack:
    def __init__(self):
        self.items = []

    def push(self, x):
        self.items.append(x)

    def pop(self):
        return self.items.pop(0)


def old_name(x):
    return x * 2
'''

STATS = '''import math


def mean_of(xs):
    """The arithmetic mean.

    >>> mean_of([1, 2])
    1.5
    >>> mean_of([4])
    4.0
    """
    return math.fsum(xs) // len(xs)
'''

TEXTUTIL = '''def shout(s):
    return s.lower() + "!"
'''

TESTS = '''from lib.core import clamp


def test_clamp():
    assert clamp(5, 0, 10) == 5
'''


class Repo:
    """A git repository whose commits get fixed, increasing dates."""

    def __init__(self, root: Path):
        self.root = root
        self.day = 0
        self.shas: dict[str, str] = {}
        root.mkdir(parents=True)
        self.git("init", "-q", "-b", "main")

    def env(self, author: str) -> dict[str, str]:
        name, email = author.split(" <")
        date = f"2024-01-{1 + self.day:02d}T12:00:00+01:00"
        return {**os.environ, "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email.rstrip(">"),
                "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email.rstrip(">"),
                "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date,
                "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}

    def git(self, *args: str, author: str = "Ann <ann@example.com>") -> str:
        return subprocess.run(["git", "-C", str(self.root), *args], env=self.env(author), check=True,
                              capture_output=True, text=True).stdout

    def write(self, path: str, text: str) -> None:
        (self.root / path).parent.mkdir(parents=True, exist_ok=True)
        (self.root / path).write_text(text)

    def edit(self, path: str, old: str, new: str) -> None:
        text = (self.root / path).read_text()
        assert old in text, (path, old)
        self.write(path, text.replace(old, new, 1))

    def commit(self, key: str, message: str, author: str = "Ann <ann@example.com>") -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty-message", "-m", message, author=author)
        self.day += 1
        self.shas[key] = self.git("rev-parse", "HEAD").strip()
        return self.shas[key]


def build_history(root: Path) -> Repo:
    """One commit per rule of the funnel, and seven that must be kept (K1-K7)."""
    r = Repo(root)
    r.write("LICENSE", MIT)
    r.write("README.md", "# lib\n")
    r.write("lib/core.py", CORE)
    r.write("lib/stats.py", STATS)
    r.write("lib/textutil.py", TEXTUTIL)
    r.write("tests/test_core.py", TESTS)
    r.commit("initial", "Initial import")  # file_added_deleted
    r.edit("lib/core.py", "if x > lo:", "if x > hi:")
    r.edit("tests/test_core.py", "== 5\n", "== 5\n    assert clamp(11, 0, 10) == 10\n")
    r.commit("K1", "Fix clamp upper bound\n\nValues above lo were clamped to hi.\n\n"
                   "Signed-off-by: Ann <ann@example.com>\nCo-authored-by: Bob <bob@example.com>")
    r.edit("lib/core.py", '"""Describe x."""', '"""Describe x, for people."""')
    r.commit("docstring", "Document describe better")  # cosmetic
    r.edit("lib/core.py", "def fmt(x):\n    return str(x)", "def fmt( x ):\n    # formatted\n    return str( x )")
    r.commit("formatter", "Run the formatter")  # cosmetic
    r.edit("lib/core.py", "def old_name(x):", "def double(x):")
    r.commit("rename", "Rename old_name to double")  # functions_added_removed
    r.edit("lib/core.py", "return xs[0]", "return xs[0] if xs else None")
    r.edit("lib/core.py", "return xs[1]", "return xs[-1]")
    r.commit("two_functions", "Fix first and last")  # several_functions
    r.edit("lib/stats.py", "math.fsum(xs) // len(xs)", "math.fsum(xs) / len(xs)")
    r.commit("K2", "Fix mean_of flooring")  # kept, with tests from its doctest
    r.git("checkout", "-q", "-b", "feature")
    r.edit("lib/textutil.py", "s.lower()", "s.upper()")
    r.commit("K3", "Make shout shout")  # kept: a fix on a branch, merged below
    r.git("checkout", "-q", "main")
    r.edit("README.md", "# lib\n", "# lib\n\nHelpers.\n")
    r.commit("readme", "Update README")  # no_python
    r.git("merge", "-q", "--no-ff", "-m", "Merge branch 'feature'", "feature")
    r.day += 1
    r.shas["merge"] = r.git("rev-parse", "HEAD").strip()  # merge
    r.edit("lib/core.py", 'return f"value {x}"', 'return f"value: {x}"')
    r.commit("bot", "Bump describe", author="dependabot[bot] <support@github.com>")  # bot
    r.edit("tests/test_core.py", "== 10\n", "== 10\n    assert clamp(-1, 0, 10) == 0\n")
    r.commit("tests_only", "Test clamp below")  # tests_only
    r.edit("lib/core.py", "LIMIT = 10", "LIMIT = 20")
    r.commit("outside", "Raise LIMIT")  # outside_function
    r.edit("lib/core.py", "lru_cache(maxsize=1)", "lru_cache(maxsize=None)")
    r.commit("K4", "Cache every total")  # kept: the decorator is part of the function
    r.edit("lib/core.py", "self.items.pop(0)", "self.items.pop()")
    r.commit("K5", "Fix Stack.pop order")  # kept: a method
    r.edit("lib/core.py", "return items[1]", "return items[0]")
    r.commit("K6", "Fix head_of index")  # kept; its doctest does not catch the bug
    r.edit("lib/core.py", "return items[0]", "return items[1]")
    r.commit("revert", f'Revert "Fix head_of index"\n\nThis reverts commit {r.shas["K6"]}.')  # revert
    r.edit("lib/core.py", "return items[1]", "return items[0]")
    r.commit("duplicate", "Fix head_of index again")  # duplicate of K6
    r.edit("lib/core.py", '    return f"value: {x}"\n',
           "".join(f"    y{i} = {i}\n" for i in range(35)) + '    return f"value: {x}"\n')
    r.commit("too_large", "Rewrite describe")  # too_large
    r.edit("lib/textutil.py", 'return s.upper() + "!"', 'return s.upper( + "!"')
    r.commit("broken", "Break shout")  # parse_error
    r.edit("lib/textutil.py", 'return s.upper( + "!"', 'return s.upper() + "!"')
    r.commit("repair", "Repair shout")  # parse_error (its parent does not parse)
    r.edit("lib/core.py", "return str( x )", "return repr( x )")
    r.edit("lib/stats.py", "/ len(xs)", "/ max(len(xs), 1)")
    r.commit("two_files", "Touch two modules")  # several_files
    r.edit("lib/textutil.py", '+ "!"', '+ "!!"')
    r.commit("no_message", "Signed-off-by: Ann <ann@example.com>")  # no_message
    r.git("rm", "-q", "lib/textutil.py")
    r.commit("deleted", "Delete textutil")  # file_added_deleted
    r.edit("lib/core.py", "    if x < lo:\n", "    if lo > hi:\n        lo, hi = hi, lo\n    if x < lo:\n")
    r.commit("K7", "Clamp handles lo > hi")  # kept, the newest
    return r


EXPECTED_FUNNEL = {
    "commits": 25, "merge": 1, "bot": 1, "revert": 1, "no_python": 1, "tests_only": 1, "file_added_deleted": 2,
    "several_files": 1, "too_large": 1, "parse_error": 2, "functions_added_removed": 1, "outside_function": 1,
    "several_functions": 1, "cosmetic": 2, "no_message": 1, "duplicate": 1, "kept": 7,
}


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Repo:
    return build_history(tmp_path_factory.mktemp("hist") / "My.Lib")


@pytest.fixture(scope="module")
def mined(history, scorer):
    # the doctest and no-test paths; FAIL_TO_PASS tasks from the tests a fix changed: test_mine_repotests.py
    return mine(history.root, MineSettings(repo_tests=False), scorer)


def by_key(history: Repo, puzzles) -> dict:
    keys = {sha: key for key, sha in history.shas.items()}
    return {keys[p.source["sha"]]: p for p in puzzles}


def test_keeps_exactly_the_one_function_changes(history, mined):
    result, puzzles = mined
    assert sorted(by_key(history, puzzles)) == ["K1", "K2", "K3", "K4", "K5", "K6", "K7"]
    assert [p.source["sha"] for p in puzzles] == [history.shas[k] for k in ("K1", "K2", "K3", "K4", "K5", "K6", "K7")]
    assert summary(result, puzzles)["funnel"] == EXPECTED_FUNNEL
    assert list(EXPECTED_FUNNEL)[1:-1] == list(REASONS)


def test_task_fields(history, mined):
    _, puzzles = mined
    tasks = by_key(history, puzzles)
    k1 = tasks["K1"]
    sha = history.shas["K1"]
    assert k1.id == f"clamp-{sha[:7]}" and NAME.match(k1.id)
    assert k1.tier == "my_lib" and k1.entry_point == "clamp"
    assert k1.description == "Fix clamp upper bound\n\nValues above lo were clamped to hi."
    assert k1.buggy == "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > lo:\n        return hi\n    return x\n"
    assert k1.oracle == k1.buggy.replace("x > lo", "x > hi")
    assert k1.tests == ()
    parent = history.git("rev-parse", f"{sha}^").strip()
    assert k1.source == {"repo": "My.Lib", "sha": sha, "parent": parent, "path": "lib/core.py", "qualname": "clamp",
                         "date": "2024-01-02T12:00:00+01:00", "subject": "Fix clamp upper bound", "licence": "MIT",
                         "test_files": "tests/test_core.py"}
    k4, k5 = tasks["K4"], tasks["K5"]
    assert k4.buggy == "@functools.lru_cache(maxsize=1)\ndef cached_total(n):\n    return sum(range(n))\n"
    assert k5.buggy == "def pop(self):\n    return self.items.pop(0)\n"
    assert (k5.entry_point, k5.source["qualname"], k5.id) == ("pop", "Stack.pop", f"stack_pop-{history.shas['K5'][:7]}")
    assert "test_files" not in k5.source


def test_doctest_becomes_validated_tests(history, mined, scorer):
    result, puzzles = mined
    tasks = by_key(history, puzzles)
    k2 = tasks["K2"]
    assert k2.tests == ("assert mean_of([1, 2]) == 1.5", "assert mean_of([4]) == 4.0")
    assert k2.buggy.startswith("import math\n\n\ndef mean_of(xs):") and k2.oracle.startswith("import math\n\n\n")
    buggy, oracle = scorer.run(k2, k2.buggy), scorer.run(k2, k2.oracle)
    assert oracle.all_passed and not buggy.all_passed
    # head_of's doctest does not catch its bug: tried, rejected, the task keeps no tests
    assert tasks["K6"].tests == () and tasks["K6"].buggy.startswith("def head_of")
    counts = summary(result, puzzles)["tasks"]
    assert (counts["with_tests"], counts["without_tests"]) == (1, 6)
    assert (counts["doctest_candidates"], counts["doctest_rejected"]) == (2, 1)
    assert all(r.ok for r in check_puzzles(puzzles, scorer))


def test_split_by_time_and_by_function(history, mined):
    result, puzzles = mined
    tasks = by_key(history, puzzles)
    # the newest (K7) is held out, and so is K1: the same function (clamp) on the other side
    assert {k for k, p in tasks.items() if p.split == "heldout"} == {"K1", "K7"}
    counts = summary(result, puzzles)["tasks"]
    assert (counts["train"], counts["heldout"], counts["heldout_newest"], counts["heldout_same_function"]) == (5, 2, 1, 1)
    changes = result.changes
    assert split(changes, 0.0) == ["train"] * 7
    assert split(changes, 1.0) == ["heldout"] * 7
    # half: the four newest (K4-K7), and K1 for clamp
    assert split(changes, 0.5) == ["heldout", "train", "train", "heldout", "heldout", "heldout", "heldout"]


def test_max_commits_and_since(history):
    result, puzzles = mine(history.root, MineSettings(max_commits=3, tests=False))
    assert result.commits == 3 and [p.source["sha"] for p in puzzles] == [history.shas["K7"]]
    result, _ = mine(history.root, MineSettings(since="2024-01-20T00:00:00+01:00", tests=False))
    assert result.commits == 6  # the commits of days 20-25


def test_cli_writes_a_byte_identical_checkable_set(history, tmp_path):
    runner = CliRunner()
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        result = runner.invoke(main, ["puzzles", "mine", str(history.root), "--out", str(out), "--workers", "2",
                                     "--no-repo-tests"])  # the repository-test path: test_mine_repotests.py
        assert result.exit_code == 0, result.output
    assert "kept" in result.output and "7 tasks: 1 with tests" in result.output
    files = sorted(p.relative_to(outs[0]) for p in outs[0].rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(outs[1]) for p in outs[1].rglob("*") if p.is_file())
    assert sorted(f.parent.name for f in files if f.suffix == ".yaml") == ["my_lib"] * 7
    for f in files:
        a, b = (outs[0] / f).read_bytes(), (outs[1] / f).read_bytes()
        if f.name == "mine.json":  # the same but for the time it took
            a, b = (dict(json.loads(x), timing=None) for x in (a, b))
        assert a == b, f
    assert json.loads((outs[0] / "mine.json").read_text())["funnel"] == EXPECTED_FUNNEL
    check = runner.invoke(main, ["puzzles", "check", str(outs[0]), "--workers", "2"])
    assert check.exit_code == 0, check.output
    assert "7/7 puzzles OK" in check.output and "6 without tests" in check.output
    listed = runner.invoke(main, ["puzzles", "list", str(outs[0]), "--split", "heldout"])
    assert listed.exit_code == 0 and listed.output.strip().endswith("2 puzzles")
    assert len(load_puzzles(outs[0], split="train")) == 5
    again = runner.invoke(main, ["puzzles", "mine", str(history.root), "--out", str(outs[0]), "--overwrite",
                                 "--no-tests"])
    assert again.exit_code == 0 and "7 tasks: 0 with tests" in again.output


def test_a_url_is_cloned_once_and_mined_up_to_the_commit(history, tmp_path):
    """REPO as a URL (here file://): cloned into --clone-dir with its history, checked out at
    --commit (mined up to it), and reused by the next command."""
    url, clone_dir = f"file://{history.root}", tmp_path / "repos" / "lib"
    args = ["puzzles", "mine", url, "--clone-dir", str(clone_dir), "--no-tests"]
    at_k6 = CliRunner().invoke(main, [*args, "--commit", history.shas["K6"], "--out", str(tmp_path / "k6")])
    assert at_k6.exit_code == 0, at_k6.output
    assert "6 tasks: 0 with tests" in at_k6.output  # K7 is newer than the commit
    assert (clone_dir / ".git").is_dir()
    (clone_dir / "marker").write_text("the same clone")
    newest = CliRunner().invoke(main, [*args, "--commit", history.shas["K7"], "--out", str(tmp_path / "k7")])
    assert newest.exit_code == 0 and "7 tasks: 0 with tests" in newest.output
    assert (clone_dir / "marker").read_text() == "the same clone"
    assert json.loads((tmp_path / "k7" / "mine.json").read_text())["funnel"] == EXPECTED_FUNNEL
    assert "--commit: only with a URL" in one_line_error(
        ["puzzles", "mine", str(history.root), "--commit", history.shas["K6"], "--out", str(tmp_path / "x")])
    assert "git clone file:///nowhere" in one_line_error(
        ["puzzles", "mine", "file:///nowhere", "--clone-dir", str(tmp_path / "n"), "--out", str(tmp_path / "y")])


def one_line_error(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.strip().splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def test_cli_errors_are_one_line(history, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    assert one_line_error(["puzzles", "mine", str(plain), "--out", str(tmp_path / "o")]) \
        == f"Error: {plain}: not a git repository"
    no_python = Repo(tmp_path / "docs")
    no_python.write("README.md", "# docs\n")
    no_python.commit("readme", "Docs only")
    assert "no Python history" in one_line_error(["puzzles", "mine", str(no_python.root), "--out", str(tmp_path / "o")])
    empty = Repo(tmp_path / "empty")
    assert "no Python history" in one_line_error(["puzzles", "mine", str(empty.root), "--out", str(tmp_path / "o")])
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("keep")
    assert "not empty" in one_line_error(["puzzles", "mine", str(history.root), "--out", str(taken)])
    assert "not a mined set" in one_line_error(["puzzles", "mine", str(history.root), "--out", str(taken),
                                                "--overwrite", "--no-tests"])
    assert (taken / "notes.txt").read_text() == "keep" and not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------- the pieces
def test_description_drops_trailers():
    message = ("Fix parsing (#12)\n\nThe parser skipped the last token.\n\nSigned-off-by: A <a@x>\n"
               "Reviewed-by: B <b@x>\nFixes: #12\n")
    assert description(message) == "Fix parsing (#12)\n\nThe parser skipped the last token."
    assert description("Fix it\n\nCo-authored-by: C <c@x>\n(cherry picked from commit abc123)\n") == "Fix it"
    assert description("Note: a subject that looks like a trailer") == "Note: a subject that looks like a trailer"
    assert description("Signed-off-by: A <a@x>") == ""


@pytest.mark.parametrize("path, is_test", [
    ("tests/test_core.py", True), ("pkg/testing/util.py", True), ("pkg/test_x.py", True), ("pkg/x_test.py", True),
    ("pkg/tests.py", True), ("pkg/core.py", False), ("pkg/contest.py", False), ("pkg/attest/x.py", False),
    ("pkg/testament.py", False),
])
def test_test_file_rule(path, is_test):
    assert is_test_path(path) is is_test


def test_sanitize_gives_valid_names():
    for raw, name in [("Stack.pop", "stack_pop"), ("My.Lib", "my_lib"), ("more-itertools", "more-itertools"),
                      ("__init__", "__init__"), ("-x-", "x"), ("", "_"), ("Ünïcode", "_n_code")]:
        assert sanitize(raw) == name and NAME.match(name)


def test_units_span_decorators_and_repeated_names():
    module = parse_module(b"class A:\n    @property\n    def x(self):\n        return 1\n\n"
                          b"    @x.setter\n    def x(self, v):\n        pass\n\n\n@dec\n@dec2(1)\ndef f():\n    pass\n")
    units = module.units
    assert list(units) == ["A.x", "A.x#2", "f"]
    assert (units["A.x"].start, units["A.x#2"].start, units["f"].start, units["f"].end) == (2, 6, 11, 14)
    assert module.code("A.x#2") == "@x.setter\ndef x(self, v):\n    pass\n"
    assert parse_module(b"def f(:\n") is None and parse_module(b"\xff\xfe") is None


def test_licence_detection():
    assert licence_id(MIT) == "MIT"
    assert licence_id("Apache License\nVersion 2.0, January 2004\n...") == "Apache-2.0"
    assert licence_id("GNU GENERAL PUBLIC LICENSE\nVersion 3, 29 June 2007\n... GNU Affero ...") == "GPL-3.0"
    assert licence_id("Redistribution and use in source and binary forms ... Neither the name of") == "BSD-3-Clause"
    assert licence_id("All rights reserved.") == "unknown"


def test_doctest_examples_become_asserts():
    doc = """Examples.

    >>> from itertools import count
    >>> it = iter([1, 2, 3])
    >>> next(it)
    1
    >>> print(f('ab'))
    AB
    >>> f(None)
    Traceback (most recent call last):
    ...
    TypeError: no
    >>> f(x)  # doctest: +SKIP
    'z'
    >>> take(2, f('a'))
    ['A']
    >>> Fraction(1, 2)
    Fraction(1, 2)
    >>> f('...')  # doctest: +ELLIPSIS
    '...'
    >>> f('q') == 'Q'
    True
    >>> f('w')
    'W'
    """
    tests = doctest_tests(doc, "f", set())
    assert tests[0] == "from itertools import count\nit = iter([1, 2, 3])\nassert next(it) == 1"
    assert tests[1] == "assert str(f('ab')) == 'AB'"
    assert tests[2].startswith("try:\n    f(None)\n") and tests[2].endswith("assert _doctest_raised == 'TypeError'")
    # take: not available; Fraction: never imported; ELLIPSIS and a comparison: setup only
    assert tests[3] == "f('...')\nf('q') == 'Q'\nassert f('w') == 'W'" and len(tests) == 4
    assert needed_imports("def g(x):\n    return math.floor(x) + len(ch)\n",
                          {"math": "import math", "ch": "from itertools import chain as ch"}) \
        == ["from itertools import chain as ch", "import math"]
    assert needed_imports("def g(x):\n    return helper(x)\n", {}) is None
    assert needed_imports("def g(x):\n    import os\n    return os.sep\n", {}) is None
    assert needed_imports("def g(x):\n    global y\n    return x\n", {}) is None
