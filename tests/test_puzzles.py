"""Puzzle loading, schema validation and `check_puzzles` on bundled and user-supplied sets."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from mlx_swe_rl.forge.checks import check_puzzles
from mlx_swe_rl.puzzles.format import (FIELDS, REQUIRED, TIERS, Puzzle, PuzzleError, default_puzzle_dir, load_puzzle, load_puzzles, puzzle_files)
from mlx_swe_rl.puzzles.testplan import EQUAL


def puzzle_data(**overrides) -> dict:
    """A valid puzzle document; keyword arguments replace (or, with None, drop) fields."""
    pid = overrides.get("id", "add_one")
    data = {
        "id": pid,
        "tier": "easy",
        "split": "train",
        "entry_point": "add_one",
        "description": "Return x plus one.",
        "buggy": "def add_one(x):\n    return x - 1\n",
        "oracle": "def add_one(x):\n    return x + 1\n",
        "tests": ["assert add_one(1) == 2", "assert add_one(-1) == 0"],
    }
    for key, value in overrides.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def write_puzzle(root: Path, data: dict, folder: str | None = None, stem: str | None = None) -> Path:
    """Write `data` as root/<folder>/<stem>.yaml (folder and stem default to its tier and id)."""
    folder = folder or str(data.get("tier", "easy"))
    stem = stem or str(data.get("id", "puzzle"))
    path = root / folder / f"{stem}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def load_error(root: Path) -> str:
    with pytest.raises(PuzzleError) as info:
        load_puzzles(root)
    return str(info.value)


# ------------------------------------------------------------------------- bundled set
@pytest.fixture(scope="module")
def bundled() -> list[Puzzle]:
    return load_puzzles()


def test_bundled_set_size_and_tiers(bundled):
    assert len(bundled) >= 45
    per_tier = Counter(p.tier for p in bundled)
    assert set(per_tier) == set(TIERS)
    for tier in TIERS:
        assert per_tier[tier] >= 15, f"{tier} has only {per_tier[tier]} puzzles"


def test_bundled_heldout_is_about_a_third_of_each_tier(bundled):
    for tier in TIERS:
        in_tier = [p for p in bundled if p.tier == tier]
        heldout = sum(p.split == "heldout" for p in in_tier)
        assert 0.25 <= heldout / len(in_tier) <= 0.42, f"{tier}: {heldout}/{len(in_tier)} heldout"


def test_bundled_ids_unique_and_match_files(bundled):
    ids = [p.id for p in bundled]
    assert len(ids) == len(set(ids))
    for p in bundled:
        assert p.path is not None and p.path.stem == p.id and p.path.parent.name == p.tier
        assert p.path.parent.parent == default_puzzle_dir()
        assert p.plans and len(p.plans) == len(p.tests)


def test_bundled_order_and_filters(bundled):
    tiers = [p.tier for p in bundled]
    assert tiers == sorted(tiers, key=TIERS.index)
    for tier in TIERS:
        ids = [p.id for p in bundled if p.tier == tier]
        assert ids == sorted(ids)
    hard_heldout = load_puzzles(tiers=["hard"], split="heldout")
    assert hard_heldout == [p for p in bundled if p.tier == "hard" and p.split == "heldout"]
    assert len(load_puzzles(split="train")) + len(load_puzzles(split="heldout")) == len(bundled)
    with pytest.raises(PuzzleError, match="split"):
        load_puzzles(split="validation")


# ------------------------------------------------------------------------ schema errors
def test_valid_puzzle_loads(tmp_path):
    path = write_puzzle(tmp_path, puzzle_data(timeout=2))
    [p] = load_puzzles(tmp_path)
    assert (p.id, p.tier, p.split, p.entry_point) == ("add_one", "easy", "train", "add_one")
    assert p.tests == ("assert add_one(1) == 2", "assert add_one(-1) == 0")
    assert p.timeout == 2.0 and isinstance(p.timeout, float)
    assert p.path == path
    assert p.plans[0].checks == [EQUAL]
    assert load_puzzle(path) == p
    assert puzzle_files(path) == [path]  # a single file is a set of one


def test_unknown_key_names_it_and_suggests_closest(tmp_path):
    data = puzzle_data()
    data["test"] = data.pop("tests")
    path = write_puzzle(tmp_path, data)
    message = load_error(tmp_path)
    assert str(path) in message
    assert "test" in message and "unknown field" in message
    assert "did you mean 'tests'?" in message


def test_unknown_key_without_close_match_lists_valid_fields(tmp_path):
    path = write_puzzle(tmp_path, puzzle_data(zzz_qqq=1))
    message = load_error(tmp_path)
    assert str(path) in message and "zzz_qqq" in message
    assert all(f in message for f in FIELDS)


@pytest.mark.parametrize("field", REQUIRED)
def test_missing_field(tmp_path, field):
    data = puzzle_data(**{field: None})
    path = write_puzzle(tmp_path, data, folder="easy", stem="add_one")
    message = load_error(tmp_path)
    assert str(path) in message
    assert f": {field}: missing" in message


@pytest.mark.parametrize("field", ["description", "buggy", "entry_point"])
def test_empty_string_field(tmp_path, field):
    path = write_puzzle(tmp_path, puzzle_data(**{field: "   "}))
    message = load_error(tmp_path)
    assert str(path) in message and f": {field}: " in message and "non-empty string" in message


def test_id_must_match_file_stem(tmp_path):
    path = write_puzzle(tmp_path, puzzle_data(), stem="something_else")
    message = load_error(tmp_path)
    assert str(path) in message and ": id: " in message and "something_else" in message


def test_id_must_be_a_safe_name(tmp_path):
    path = write_puzzle(tmp_path, puzzle_data(id="Add One"), stem="Add One")
    message = load_error(tmp_path)
    assert str(path) in message and ": id: " in message


def test_tier_must_match_folder(tmp_path):
    path = write_puzzle(tmp_path, puzzle_data(tier="hard"), folder="easy")
    message = load_error(tmp_path)
    assert str(path) in message and ": tier: " in message and "'hard'" in message and "'easy'" in message


def test_bad_split(tmp_path):
    path = write_puzzle(tmp_path, puzzle_data(split="test"))
    message = load_error(tmp_path)
    assert str(path) in message and ": split: " in message and "train" in message and "heldout" in message


@pytest.mark.parametrize("which", ["buggy", "oracle"])
def test_entry_point_not_defined(tmp_path, which):
    path = write_puzzle(tmp_path, puzzle_data(**{which: "def other(x):\n    return x + 1\n"}))
    message = load_error(tmp_path)
    assert str(path) in message and f": {which}: " in message and "add_one" in message


def test_entry_point_not_a_python_name(tmp_path):
    path = write_puzzle(tmp_path, puzzle_data(entry_point="add-one"))
    message = load_error(tmp_path)
    assert str(path) in message and ": entry_point: " in message


def test_class_entry_point_and_assigned_name_count_as_defined(tmp_path):
    write_puzzle(tmp_path, puzzle_data(
        id="counter", entry_point="Counter",
        buggy="class Counter:\n    def __init__(self):\n        self.n = 1\n",
        oracle="class Counter:\n    def __init__(self):\n        self.n = 0\n",
        tests=["assert Counter().n == 0"]))
    write_puzzle(tmp_path, puzzle_data(
        id="alias", entry_point="double",
        buggy="double = lambda x: x + x + 1\n", oracle="double = lambda x: x + x\n",
        tests=["assert double(2) == 4"]))
    assert [p.entry_point for p in load_puzzles(tmp_path)] == ["double", "Counter"]


def test_unparsable_buggy_code(tmp_path):
    path = write_puzzle(tmp_path, puzzle_data(buggy="def add_one(x)\n    return x - 1\n"))
    message = load_error(tmp_path)
    assert str(path) in message and ": buggy: " in message and "line 1" in message


@pytest.mark.parametrize("tests", ["assert add_one(1) == 2", [""], [3], {}])
def test_tests_must_be_list_of_code(tmp_path, tests):
    path = write_puzzle(tmp_path, puzzle_data(tests=tests))
    message = load_error(tmp_path)
    assert str(path) in message and ": tests: " in message


def test_task_without_tests_loads(tmp_path):
    """`tests: []` is a task without tests (mined ones); the key itself stays required."""
    write_puzzle(tmp_path, puzzle_data(tests=[]))
    [p] = load_puzzles(tmp_path)
    assert p.tests == () and p.plans == []
    write_puzzle(tmp_path, puzzle_data(tests=None))
    assert "tests: missing" in load_error(tmp_path)


def test_seed_still_needs_tests(tmp_path):
    from mlx_swe_rl.forge.seeds import load_seeds

    path = tmp_path / "topic" / "s.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump({"id": "s", "entry_point": "f", "description": "d",
                                    "code": "def f():\n    return 1\n", "tests": []}))
    with pytest.raises(PuzzleError, match="tests: must be a non-empty list"):
        load_seeds([tmp_path])


def test_source_provenance_loads_and_stays_out_of_the_prompt(tmp_path):
    from mlx_swe_rl.env.prompts import build_messages

    source = {"repo": "lib", "sha": "0123abc", "path": "lib/core.py", "line": 12, "licence": "MIT"}
    write_puzzle(tmp_path, puzzle_data(source=source))
    [p] = load_puzzles(tmp_path)
    assert p.source == source
    prompt = "".join(m["content"] for m in build_messages(p))
    assert "0123abc" not in prompt and "lib/core.py" not in prompt


@pytest.mark.parametrize("source, detail", [
    (["repo"], "source: must be a mapping"),
    ({"sha": 1.5}, "source.sha: float value"),
    ({"sha": True}, "source.sha: bool value"),
    ({"files": ["a.py"]}, "source.files: list value"),
    ({"": "x"}, "source: key '' must be a non-empty string"),
])
def test_source_must_be_a_mapping_of_strings_and_ints(tmp_path, source, detail):
    path = write_puzzle(tmp_path, puzzle_data(source=source))
    message = load_error(tmp_path)
    assert message.startswith(str(path)) and detail in message


@pytest.mark.parametrize("bad_test, detail", [
    ("assert add_one(1) != 3", "only 'assert X == Y'"),
    ("assert 1 < add_one(1)", "only 'assert X == Y'"),
    ("for i in range(3):\n    assert add_one(i) == i + 1", "top-level"),
    ("x = add_one(1)", "no assert"),
    ("assert add_one(1) ==", "line 1"),
])
def test_unsupported_test_forms(tmp_path, bad_test, detail):
    path = write_puzzle(tmp_path, puzzle_data(tests=["assert add_one(1) == 2", bad_test]))
    message = load_error(tmp_path)
    assert str(path) in message and ": tests[1]: " in message and detail in message


@pytest.mark.parametrize("timeout", [0, -1, 61, "fast", True, [1]])
def test_bad_timeout(tmp_path, timeout):
    path = write_puzzle(tmp_path, puzzle_data(timeout=timeout))
    message = load_error(tmp_path)
    assert str(path) in message and ": timeout: " in message


def test_not_a_mapping_and_invalid_yaml(tmp_path):
    path = tmp_path / "easy" / "add_one.yaml"
    path.parent.mkdir()
    path.write_text("- just\n- a list\n")
    message = load_error(tmp_path)
    assert str(path) in message and "mapping" in message
    path.write_text("id: [unclosed\n")
    message = load_error(tmp_path)
    assert str(path) in message and "not valid YAML" in message


def test_duplicate_ids_across_tiers(tmp_path):
    first = write_puzzle(tmp_path, puzzle_data(tier="easy"))
    second = write_puzzle(tmp_path, puzzle_data(tier="hard"))
    message = load_error(tmp_path)
    assert ": id: 'add_one'" in message
    assert str(first) in message and str(second) in message


def test_missing_and_empty_directories(tmp_path):
    message = load_error(tmp_path / "nope")
    assert str(tmp_path / "nope") in message and "no such puzzle directory" in message
    (tmp_path / "empty").mkdir()
    assert "no puzzle files" in load_error(tmp_path / "empty")


# ------------------------------------------------------------ user sets and check_puzzles
GOOD_CLASS = puzzle_data(
    id="user_stack", tier="custom", entry_point="Stack",
    description="A stack: push(x) adds x, pop() removes and returns the most recent item.",
    buggy=("class Stack:\n    def __init__(self):\n        self.items = []\n"
           "    def push(self, x):\n        self.items.append(x)\n"
           "    def pop(self):\n        return self.items.pop(0)\n"),
    oracle=("class Stack:\n    def __init__(self):\n        self.items = []\n"
            "    def push(self, x):\n        self.items.append(x)\n"
            "    def pop(self):\n        return self.items.pop()\n"),
    tests=["s = Stack()\ns.push(1)\ns.push(2)\nassert s.pop() == 2", "assert s.pop() == 1",
           "assert not s.items"],
)
GOOD_FUNC = puzzle_data(
    id="user_mean", tier="custom", split="heldout", entry_point="mean", timeout=3,
    description="Return the arithmetic mean of a non-empty list of numbers.",
    buggy="def mean(xs):\n    return sum(xs) // len(xs)\n",
    oracle="def mean(xs):\n    return sum(xs) / len(xs)\n",
    tests=["assert mean([1, 2]) == 1.5", "assert mean([4]) == 4", "assert mean([0.1, 0.2]) == 0.15"],
)


def test_user_directory_loads_and_passes_check(tmp_path, scorer):
    for data in (GOOD_CLASS, GOOD_FUNC):
        write_puzzle(tmp_path, data)
    puzzles = load_puzzles(tmp_path)
    assert [p.id for p in puzzles] == ["user_mean", "user_stack"]
    assert {p.tier for p in puzzles} == {"custom"}
    reports = check_puzzles(puzzles, scorer)
    assert [r.puzzle.id for r in reports] == ["user_mean", "user_stack"]
    for report in reports:
        assert report.ok, report.problems
        assert any(s != "passed" for s in report.buggy_statuses)
        assert report.seconds > 0


def test_check_reports_bad_behaviour(tmp_path, scorer):
    buggy_passes = puzzle_data(id="chk_buggy_passes", buggy="def add_one(x):\n    return 1 + x\n")
    oracle_fails = puzzle_data(id="chk_oracle_fails", tests=["assert add_one(1) == 3"])
    oracle_crashes = puzzle_data(id="chk_oracle_crashes",
                                 oracle="def add_one(x):\n    raise RuntimeError('boom')\n")
    flaky = puzzle_data(
        id="chk_flaky", description="Always return 0.",
        buggy="def add_one(x):\n    return x\n", oracle="def add_one(x):\n    return 0\n",
        tests=["import random\ncoin = int(random.random() < 0.5)\nassert add_one(coin) == 0"] * 24)
    good = puzzle_data(id="chk_good")
    for data in (buggy_passes, oracle_fails, oracle_crashes, flaky, good):
        write_puzzle(tmp_path, data)
    reports = {r.puzzle.id: r for r in check_puzzles(load_puzzles(tmp_path), scorer)}

    assert reports["chk_good"].ok, reports["chk_good"].problems
    assert reports["chk_buggy_passes"].problems == [
        "buggy code passes every test: the tests do not catch the bug"]
    [problem] = reports["chk_oracle_fails"].problems
    assert problem == "test 0: oracle gives 2, test expects 3"
    problems = reports["chk_oracle_crashes"].problems
    assert problems and all("oracle did not finish" in p and "RuntimeError: boom" in p for p in problems)
    assert any("non-deterministic" in p for p in reports["chk_flaky"].problems), reports["chk_flaky"].problems


def test_check_reports_oracle_load_error(tmp_path, scorer):
    write_puzzle(tmp_path, puzzle_data(id="chk_oracle_load",
                                       oracle="import no_such_module_xyz\ndef add_one(x):\n    return x + 1\n"))
    [report] = check_puzzles(load_puzzles(tmp_path), scorer)
    assert not report.ok
    assert report.problems[0].startswith("oracle failed to load: ")
    assert "no_such_module_xyz" in report.problems[0]


@pytest.mark.parametrize("hidden, detail", [
    ("1", "hidden_tests: must be a list of test indices"),
    ([0, "1"], "hidden_tests: must be a list of test indices"),
    ([2], "hidden_tests: 2 is not the index of a test (0 to 1)"),
    ([1, 1], "hidden_tests: an index is listed twice"),
])
def test_hidden_tests_must_be_distinct_test_indices(tmp_path, hidden, detail):
    write_puzzle(tmp_path, puzzle_data(hidden_tests=hidden))
    assert load_error(tmp_path).endswith(detail)


def test_hidden_tests_load_sorted(tmp_path):
    write_puzzle(tmp_path, puzzle_data(tests=["assert add_one(1) == 2", "assert add_one(2) == 3",
                                              "assert add_one(3) == 4"], hidden_tests=[2, 0]))
    assert load_puzzles(tmp_path)[0].hidden_tests == (0, 2)


def test_check_reports_a_split_that_does_not_hold(tmp_path, scorer):
    """With one public test: a public test that is the only one to catch the bug (the buggy
    code would earn the full reward on the hidden ones), and one that reads state a hidden
    assert leaves (its public run cannot rebuild it). `hidden_tests` pins which test is public."""
    only_public_catches = puzzle_data(id="split_only_public", buggy="def add_one(x):\n    return x + 1 if x >= 0 else x\n",
                                      tests=["assert add_one(1) == 2", "assert add_one(-1) == 0"], hidden_tests=[0])
    public_catches_too = puzzle_data(id="split_fine", buggy="def add_one(x):\n    return x + 1 if x >= 0 else x\n",
                                     tests=["assert add_one(1) == 2", "assert add_one(-1) == 0"], hidden_tests=[1])
    needs_assert = puzzle_data(id="split_state", tests=["items = [1]\nassert add_one(items.pop()) == 2",
                                                        "assert items == []"], hidden_tests=[0])
    for data in (only_public_catches, public_catches_too, needs_assert):
        write_puzzle(tmp_path, data)
    reports = {r.puzzle.id: r for r in check_puzzles(load_puzzles(tmp_path), scorer)}
    assert reports["split_only_public"].problems == [
        "split (public test 1): buggy code passes every hidden test (only the public tests catch the bug): "
        "it would score 1; list the catching test in hidden_tests or add a test that catches it"]
    assert reports["split_fine"].ok, reports["split_fine"].problems
    assert reports["split_state"].problems == [
        "split (public test 1): public view: test 0: oracle gives [1], test expects []"]
    # without the split check all three are sound single-turn puzzles
    assert all(r.ok for r in check_puzzles(load_puzzles(tmp_path), scorer, split=None))


def test_check_command_reports_the_split(tmp_path):
    from click.testing import CliRunner

    from mlx_swe_rl.cli.app import main

    write_puzzle(tmp_path, puzzle_data(id="split_state", tests=["items = [1]\nassert add_one(items.pop()) == 2",
                                                                "assert items == []"], hidden_tests=[0]))
    write_puzzle(tmp_path, puzzle_data(id="split_fine"))
    result = CliRunner().invoke(main, ["puzzles", "check", str(tmp_path), "--workers", "2"])
    assert result.exit_code == 1
    assert "split_state.yaml: split (public test 1): public view: test 0: oracle gives [1], test expects []" in result.output
    assert "1/2 puzzles OK" in result.output and "2 split with 1 public test" in result.output
    result = CliRunner().invoke(main, ["puzzles", "check", str(tmp_path), "--workers", "2", "--public-tests", "0"])
    assert result.exit_code == 0 and "2/2 puzzles OK" in result.output and "split" not in result.output


# ------------------------------------------------------------------- tasks without tests
def untested(**overrides) -> dict:
    return puzzle_data(tests=[], **overrides)


class NoRunScorer:
    """A scorer stand-in that fails the test if a task without tests is ever run."""

    def prepare(self, puzzles):
        assert not puzzles, [p.id for p in puzzles]
        return {}

    def run_many(self, items):
        assert not items, [p.id for p, _ in items]
        return []


def test_check_rules_for_tasks_without_tests(tmp_path):
    """Static rules only: the code parses, defines the entry point, and the fix changes more
    than docstrings, comments and formatting."""
    fix = untested(id="nt_fix", description="Fix the sign.")
    doc_only = untested(id="nt_doc_only", buggy='def add_one(x):\n    """Add one."""\n    return x + 1\n')
    cosmetic = untested(id="nt_cosmetic", buggy="def add_one( x ):\n    # one more\n    return (x+1)\n")
    for data in (fix, doc_only, cosmetic):
        write_puzzle(tmp_path, data)
    reports = {r.puzzle.id: r for r in check_puzzles(load_puzzles(tmp_path), NoRunScorer())}
    assert reports["nt_fix"].ok, reports["nt_fix"].problems
    for pid in ("nt_doc_only", "nt_cosmetic"):
        assert reports[pid].problems == [
            "buggy and oracle differ only in docstrings, comments or formatting: nothing to fix"], pid


def test_check_static_rules_catch_hand_built_puzzles():
    """Puzzles built in code skip the loader's checks; check_puzzles still refuses them."""
    base = dict(id="nt_x", tier="t", split="train", entry_point="f", description="d", tests=())
    wrong_name = Puzzle(buggy="def g():\n    return 1\n", oracle="def f():\n    return 2\n", **base)
    broken = Puzzle(buggy="def f(:\n", oracle="def f():\n    return 2\n", **base)
    [r1, r2] = check_puzzles([wrong_name, broken], NoRunScorer())
    assert r1.problems == ["buggy: does not parse or does not define entry_point 'f'"]
    assert r2.problems == ["buggy: does not parse or does not define entry_point 'f'"]


def test_run_without_tests_never_counts_as_passed(scorer):
    p = Puzzle(id="nt_run", tier="t", split="train", entry_point="f", description="d",
               buggy="def f():\n    return 1\n", oracle="def f():\n    return 2\n", tests=())
    run = scorer.run(p, p.oracle)
    assert run.results == [] and run.total == 0 and not run.all_passed
