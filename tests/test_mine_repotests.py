"""FAIL_TO_PASS mining and confined repository-test scoring on a tiny synthetic repository.

The history holds four fixes that touch tests: one whose new test fails before and passes
after (kept), one whose new test already passes before the fix, one with a flaky test and one
whose test needs the network (all three dropped, each for its reason)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlx_swe_rl.cli.app import main
from mlx_swe_rl.puzzles.format import load_puzzles
from mlx_swe_rl.puzzles.repotests import node_id, repo_tests, splice
from mlx_swe_rl.sandbox.scorer import Scorer
from test_confinement import UNPRIVILEGED, run_as_test_user
from test_mine import Repo

CORE = '''"""Tiny helpers."""
import random


def add(a, b):
    return a - b


def scale(x, k):
    return x * k


def coin():
    return random.random()


def host(name):
    return name
'''

TESTS = '''from pkg.core import add, scale, coin, host


def test_scale_one():
    assert scale(3, 1) == 3
'''


def build(root: Path) -> Repo:
    r = Repo(root)
    r.write("pkg/__init__.py", "")
    r.write("pkg/core.py", CORE)
    r.write("tests/test_core.py", TESTS)
    r.commit("initial", "Initial import")
    r.edit("pkg/core.py", "return a - b", "return a + b")
    r.edit("tests/test_core.py", "def test_scale_one", "def test_add():\n    assert add(2, 3) == 5\n\n\ndef test_scale_one")
    r.commit("kept", "Fix add: it subtracted")
    r.edit("pkg/core.py", "return x * k", "return k * x")
    r.edit("tests/test_core.py", "def test_scale_one", "def test_scale():\n    assert scale(2, 3) == 6\n\n\ndef test_scale_one")
    r.commit("passes_before", "Scale with k first")
    r.edit("pkg/core.py", "return random.random()", "return random.random() * 1.0")
    r.edit("tests/test_core.py", "def test_scale_one", "def test_coin():\n    assert coin() < 0.5\n\n\ndef test_scale_one")
    r.commit("flaky", "Make coin a float")
    r.edit("pkg/core.py", "return name", "return name.lower()")
    r.edit("tests/test_core.py", "def test_scale_one",
           "def test_host():\n    import socket\n    assert socket.gethostbyname(host('LOCALHOST'))\n\n\n"
           "def test_scale_one")
    r.commit("network", "Lower-case host names")
    return r


@pytest.fixture(scope="module")
def mined(tmp_path_factory):
    root = tmp_path_factory.mktemp("repotests")
    repo = build(root / "repo")
    out = root / "mined"
    result = CliRunner().invoke(main, ["puzzles", "mine", str(repo.root), "--out", str(out), "--repeats", "6",
                                       "--snapshots", str(root / "snapshots"), "--heldout-frac", "0"])
    assert result.exit_code == 0, result.output
    return repo, out, json.loads((out / "mine.json").read_text()), result.output


def test_mine_keeps_only_the_fail_to_pass_fix(mined):
    repo, out, summary, output = mined
    funnel = summary["repo_tests"]
    assert (funnel["candidates"], funnel["kept"]) == (4, 1), funnel
    assert (funnel["pass_on_buggy"], funnel["flaky"], funnel["network"], funnel["fail_on_fix"]) == (1, 1, 1, 0)
    assert "FAIL_TO_PASS" in output
    tasks = [p for p in load_puzzles(out) if repo_tests(p)]
    assert [p.source["sha"] for p in tasks] == [repo.shas["kept"]]
    task = tasks[0]
    assert repo_tests(task).fail_to_pass == ("tests/test_core.py::test_add",)
    assert repo_tests(task).pass_to_pass == ("tests/test_core.py::test_scale_one",)
    assert [node_id(t) for t in task.tests] == ["tests/test_core.py::test_add", "tests/test_core.py::test_scale_one"]


def test_snapshot_has_no_git_and_no_future(mined):
    repo, out, _, _ = mined
    task = next(p for p in load_puzzles(out) if repo_tests(p))
    snap = Path(repo_tests(task).snapshot)
    assert not (snap / ".git").exists()
    assert "return a + b" in (snap / "pkg/core.py").read_text()
    assert "test_coin" not in (snap / "tests/test_core.py").read_text()  # a later commit's test


def test_oracle_scores_1_buggy_0_and_attacks_0(mined):
    _, out, _, _ = mined
    task = next(p for p in load_puzzles(out) if repo_tests(p))
    escape = Path("/tmp") / f"repotests-escape-{task.source['sha'][:8]}"
    attacks = {
        # edits the test file from inside the function's module: only the copy changes, and the
        # test file a candidate could reach is not the one pytest collected already
        "edit_tests": "def add(a, b):\n    open('tests/test_core.py', 'w').write('def test_add(): pass\\n')\n"
                      "    return a - b\n",
        "write_outside": f"def add(a, b):\n    open({str(escape)!r}, 'w').write('x')\n    return a + b\n",
        "read_git_objects": "def add(a, b):\n    import subprocess\n"
                            "    return int(subprocess.check_output(['git', 'show', 'HEAD:pkg/core.py']) and 0)\n",
    }
    with Scorer(2) as scorer:
        runs = scorer.run_many([(task, task.oracle), (task, task.buggy)] + [(task, c) for c in attacks.values()])
    assert runs[0].all_passed, runs[0].output
    assert not runs[1].all_passed and runs[1].results[0].status == "failed"
    assert "assert -1 == 5" in runs[1].output  # the failing test's own output
    assert "assert -1 == 5" in runs[1].results[0].message  # per test: what watch and feedback show
    for name, run in zip(attacks, runs[2:]):
        assert not run.all_passed, (name, run.output)
    assert not escape.exists()


def test_splice_keeps_the_method_indentation():
    text = "class A:\n    @staticmethod\n    def f(x):\n        return x\n\n    def g(self):\n        return 1\n"
    new = splice(text, "A.f", "@staticmethod\ndef f(x):\n    return -x\n")
    assert new == "class A:\n    @staticmethod\n    def f(x):\n        return -x\n\n    def g(self):\n        return 1\n"
    assert splice(text, "A.h", "def h(): pass") is None


def test_check_verifies_repository_test_tasks(mined):
    _, out, _, _ = mined
    result = CliRunner().invoke(main, ["puzzles", "check", str(out)])
    assert result.exit_code == 0, result.output


@UNPRIVILEGED
def test_repository_tests_as_unprivileged_user(tmp_path):
    """Mining and scoring again as a normal user (no sandbox uid: only confinement holds)."""
    returncode, tail = run_as_test_user(tmp_path, "tests/test_mine_repotests.py -k 'not unprivileged'")
    assert returncode == 0 and " passed" in tail and "failed" not in tail, tail


def test_a_slow_test_file_is_dropped_after_one_run_of_each_side(tmp_path):
    """A fix whose test outlasts --test-timeout is too_slow after its first pair of runs: the
    other repeats would cost a time limit each and could not keep it."""
    r = Repo(tmp_path / "repo")
    r.write("pkg/__init__.py", "")
    r.write("pkg/core.py", CORE)
    r.write("tests/test_core.py", TESTS)
    r.commit("initial", "Initial import")
    r.edit("pkg/core.py", "return a - b", "return a + b")
    r.edit("tests/test_core.py", "def test_scale_one",
           "def test_add():\n    import time\n    time.sleep(60)\n    assert add(2, 3) == 5\n\n\ndef test_scale_one")
    r.commit("slow", "Fix add: it subtracted")
    out = tmp_path / "mined"
    result = CliRunner().invoke(main, ["puzzles", "mine", str(r.root), "--out", str(out), "--repeats", "3",
                                       "--test-timeout", "3", "--snapshots", str(tmp_path / "snapshots"),
                                       "--heldout-frac", "0"])
    assert result.exit_code == 0, result.output
    funnel = json.loads((out / "mine.json").read_text())["repo_tests"]
    assert (funnel["candidates"], funnel["too_slow"], funnel["kept"]) == (1, 1, 0), funnel
    assert funnel["runs"] == 2, funnel  # one of each side, not 2 x --repeats
