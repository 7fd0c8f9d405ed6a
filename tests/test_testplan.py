"""plan_test: test snippets become setup steps and probes, expected values only for the oracle."""

from __future__ import annotations

import pytest

from mlx_swe_rl.puzzles import testplan
from mlx_swe_rl.puzzles.testplan import EQUAL, FALSY, TRUTHY, TestSyntaxError, plan_test

SyntaxProblem = testplan.TestSyntaxError  # not named Test* here, so pytest does not collect it


def test_single_equal_assert():
    plan = plan_test("assert f(1) == 2")
    assert plan.candidate_steps == [["probe", "f(1)"]]
    assert plan.oracle_steps == [["probe", "f(1)"], ["probe", "2"]]
    assert plan.checks == [EQUAL]
    assert plan.source == "assert f(1) == 2"


def test_setup_is_merged_and_kept_in_order():
    source = (
        "import math\n"
        "cache = Cache(2)\n"
        "cache.put(1, 10)\n"
        "assert cache.get(1) == 10\n"
        "cache.put(2, 20)\n"
        "assert cache.get(2)\n"
        "assert not cache.get(3)\n"
    )
    plan = plan_test(source)
    assert plan.candidate_steps == [
        ["exec", "import math\ncache = Cache(2)\ncache.put(1, 10)"],
        ["probe", "cache.get(1)"],
        ["exec", "cache.put(2, 20)"],
        ["probe", "cache.get(2)"],
        ["probe", "cache.get(3)"],
    ]
    assert plan.oracle_steps == [
        ["exec", "import math\ncache = Cache(2)\ncache.put(1, 10)"],
        ["probe", "cache.get(1)"],
        ["probe", "10"],
        ["exec", "cache.put(2, 20)"],
        ["probe", "cache.get(2)"],
        ["probe", "cache.get(3)"],
    ]
    assert plan.checks == [EQUAL, TRUTHY, FALSY]


def test_compound_setup_statements_are_allowed():
    source = "try:\n    f(-1)\n    raised = False\nexcept ValueError:\n    raised = True\nassert raised"
    plan = plan_test(source)
    assert [kind for kind, _ in plan.candidate_steps] == ["exec", "probe"]
    assert "except ValueError" in plan.candidate_steps[0][1]
    assert plan.candidate_steps[1] == ["probe", "raised"]
    assert plan.checks == [TRUTHY]


def test_expected_values_never_reach_the_candidate():
    plan = plan_test("xs = make()\nassert f(xs) == {'secret': [4242, 'EXPECTED']}\nassert g() == 'HIDDEN'")
    candidate_text = repr(plan.candidate_steps)
    for token in ("4242", "EXPECTED", "HIDDEN", "secret"):
        assert token not in candidate_text
        assert token in repr(plan.oracle_steps)
    # each EQUAL probe is followed by its expected side in the oracle steps
    probes = [src for kind, src in plan.oracle_steps if kind == "probe"]
    assert probes == ["f(xs)", "{'secret': [4242, 'EXPECTED']}", "g()", "'HIDDEN'"]


def test_assert_message_is_ignored():
    plan = plan_test("assert f(1) == 2, 'f(1) should be two'")
    assert plan.oracle_steps == [["probe", "f(1)"], ["probe", "2"]]


@pytest.mark.parametrize("source, detail", [
    ("assert f(1) != 2", "only 'assert X == Y'"),
    ("assert f(1) < 2", "only 'assert X == Y'"),
    ("assert f(1) is None", "only 'assert X == Y'"),
    ("assert 1 == f(1) == 1", "only 'assert X == Y'"),
    ("for i in range(3):\n    assert f(i) == i", "top-level"),
    ("if True:\n    assert f(1) == 2", "top-level"),
    ("def helper():\n    assert f(1) == 2\nassert helper() is None or True", "top-level"),
    ("x = f(1)", "no assert"),
    ("assert f(1) ==", "line 1"),
])
def test_errors(source, detail):
    with pytest.raises(SyntaxProblem) as info:
        plan_test(source)
    assert detail in str(info.value)


def test_error_names_the_offending_line():
    with pytest.raises(SyntaxProblem, match="line 3"):
        plan_test("x = 1\nassert f(x) == 2\nassert f(x) != 3")


@pytest.mark.parametrize("source", [
    "assert all(f(i) == i for i in range(3))",
    "assert f(1) > 0 == True",
    "assert (f(1) == 2) == True",
    "assert f(1) and f(2)",
    "assert not (f(1) or f(2))",
    "assert isinstance(f(1), int)",
    "assert not any(f(3))",
    "assert not (f(1) == 2)",  # a candidate whose __eq__ always says False would pass it
])
def test_probes_that_the_candidate_process_would_decide_are_rejected(source):
    """Comparisons, and/or/not, or trusting builtins inside the checked expression would be
    evaluated in the candidate's process, where an AlwaysEqual or a patched builtin decides."""
    with pytest.raises(TestSyntaxError):
        plan_test(source)


def test_plain_probes_are_accepted():
    plan = plan_test("assert f([1, 2])[0] == 1\nassert g.search('x')\nassert not h(1)")
    assert plan.checks == ["equal", "truthy", "falsy"]


# ------------------------------------------------------------------ names read and bound (for the split's set-up)
@pytest.mark.parametrize("source, free", [
    ("chart = {'a': []}\nassert f(chart) == 1", {"f"}),  # bound before it is read
    ("assert f(chart, 'cfo') == 1", {"f", "chart"}),
    ("x = x + 1", {"x"}),  # the value is read before the name is bound
    ("for n in range(3):\n    xs.append(f(n))", {"range", "xs", "f"}),  # a loop variable is bound first
    ("total = 0\nfor v in vals:\n    total += v\nassert total == 3", {"vals"}),
    ("assert [c(5) for c in checks] == [True]", {"checks"}),  # a comprehension's own variable is not read
    ("def helper():\n    return chart['a']\nassert helper() == 1", {"chart"}),  # read when it is called
    ("def fact(n):\n    return 1 if n < 2 else n * fact(n - 1)\nassert fact(3) == 6", set()),
    ("with open(p) as fh:\n    data = fh.read()\nassert data", {"open", "p"}),
    ("import math\nassert math.floor(x) == 1", {"x"}),
])
def test_free_names_follow_execution_order(source, free):
    assert testplan.free_names(source) == free


def test_changes_in_place_read_a_name_and_only_fresh_bindings_bind():
    import ast

    def names(source):
        found = testplan.statement_names(ast.parse(source).body[0])
        return set(found.loaded), set(found.bound)

    assert names("chart['x'] = 1") == ({"chart"}, set())  # a change in place needs chart to exist
    assert names("road.add('song')") == ({"road"}, set())
    assert names("n += 1") == ({"n"}, set())  # not a fresh binding: an earlier one must exist
    assert names("del cache") == ({"cache"}, set())
    assert names("chart = dict(chart, x=1)") == ({"dict", "chart"}, {"chart"})
    assert names("a, (b, c) = 1, (2, 3)") == (set(), {"a", "b", "c"})
