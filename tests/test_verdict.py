"""verdict: value comparison, decoding of untrusted data, and judging of sandbox runs."""

from __future__ import annotations

import json
import math

import pytest

from mlx_swe_rl.sandbox import verdict, worker
from mlx_swe_rl.sandbox.pool import Execution
from mlx_swe_rl.puzzles.testplan import EQUAL, FALSY, TRUTHY, plan_test
from mlx_swe_rl.sandbox.verdict import (CRASHED, ERROR, FAILED, PASSED, TIMEOUT, Expectation, Opaque, check_probe, decode, judge, oracle_expectations, same_value)

Result = verdict.TestResult  # not named Test* here, so pytest does not collect it


# --------------------------------------------------------------------------- same_value
@pytest.mark.parametrize("got, expected", [
    (0.1 + 0.2, 0.3),
    (1e20 * (1 + 1e-12), 1e20),
    (1, 1.0),
    (2.0, 2),
    (0.0, -0.0),
    (1e-13, 0.0),  # within the absolute tolerance
    (float("inf"), float("inf")),
    ("abc", "abc"),
    (None, None),
    (b"\x00\xff", b"\x00\xff"),
    ([1, [2.0, (3, "x")]], [1, [2, (3.0, "x")]]),
    ((0.1 + 0.2, 1), (0.3, 1)),
    ({"a": {"b": [0.1 + 0.2]}, "c": None}, {"c": None, "a": {"b": [0.3]}}),
    ({1, 2, 3}, {3, 2, 1}),
    (frozenset({"a"}), frozenset({"a"})),
    (True, True),
    ([], []),
])
def test_same_value_equal(got, expected):
    assert same_value(got, expected)
    assert same_value(expected, got)


@pytest.mark.parametrize("got, expected", [
    (0.3001, 0.3),
    (1, 2),
    (1.0, 1.5),
    (True, 1),
    (1, True),
    (False, 0),
    (0.0, False),
    ([True], [1]),
    ([1, 2], (1, 2)),
    ((1,), [1]),
    ([1, 2], [1, 2, 3]),
    ({"a": 1}, {"a": 1, "b": 2}),
    ({"a": {"b": 1}}, {"a": {"b": 2}}),
    ({"a": [1]}, {"a": (1,)}),
    ({1, 2}, {1, 2, 3}),
    ({1}, frozenset({1})),
    ("1", 1),
    (b"a", "a"),
    (None, 0),
    (None, []),
    (float("nan"), float("nan")),
])
def test_same_value_different(got, expected):
    assert not same_value(got, expected)
    assert not same_value(expected, got)


def test_opaque_equals_nothing():
    thing = Opaque("AlwaysEqual")
    for other in (thing, Opaque("AlwaysEqual"), 1, None, [], "AlwaysEqual"):
        assert not same_value(thing, other)
        assert not same_value(other, thing)
    assert not same_value([1, thing], [1, thing])
    assert not same_value({"k": thing}, {"k": thing})
    assert not same_value({thing}, {thing})
    assert not same_value(frozenset({thing}), frozenset({thing}))


def test_bool_and_int_distinct_inside_sets_and_dict_keys():
    assert not same_value({True}, {1})
    assert not same_value({1: "a"}, {True: "a"})


def test_huge_int_against_float_is_unequal_not_an_error():
    assert not same_value(10 ** 400, 1.5)
    assert not same_value(1.5, 10 ** 400)


# ------------------------------------------------------------------------------- decode
VALUES = [
    None, True, False, 0, -7, 2 ** 100, 1.5, -0.0, float("inf"), "text", "", b"\x00bytes",
    [1, "a", None], (1, (2, 3)), {1, 2}, frozenset({"x"}), {"k": [1, {"n": (1.5,)}], 3: None},
    {(1, 2): "tuple key"}, [[[]]], (),
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_decode_inverts_the_worker_encoding(value):
    data = json.loads(json.dumps(worker.encode(value)))
    back = decode(data)
    assert same_value(back, value)
    assert type(back) is type(value)


def test_decode_nan_round_trip():
    back = decode(json.loads(json.dumps(worker.encode(float("nan")))))
    assert type(back) is float and math.isnan(back)


def test_non_builtin_values_encode_as_opaque():
    class AlwaysEqual:
        def __eq__(self, other):
            return True

    class MyInt(int):
        pass

    for value in (AlwaysEqual(), MyInt(3), [1, AlwaysEqual()], {"k": MyInt(1)}):
        back = decode(json.loads(json.dumps(worker.encode(value))))
        assert verdict.contains_opaque(back)
        assert not same_value(back, back)
    assert decode({"o": "AlwaysEqual"}) == Opaque("AlwaysEqual")


@pytest.mark.parametrize("data", [
    1.5,  # a bare float: the encoding always tags floats
    [1, 2],  # a bare list
    {"l": [1], "t": [2]},  # two tags
    {"q": [1]},  # unknown tag
    {"l": "abc"},  # body not a list
    {"f": "not a number"},
    {"f": [1]},
    {"b": "zz"},
    {"b": 5},
    {"d": [[1]]},  # pair too short
    {"d": [[{"l": [1]}, 2]]},  # unhashable key
    {"s": [{"l": []}]},  # unhashable member
    {"d": "nope"},
    {"l": [1, {"f": None}]},  # malformed deep inside
])
def test_malformed_data_decodes_as_opaque(data):
    value = decode(data)
    assert isinstance(value, Opaque)
    assert not same_value(value, value)


def test_very_deep_data_decodes_as_opaque():
    data = 1
    for _ in range(5000):
        data = {"l": [data]}
    assert isinstance(decode(data), Opaque)


# -------------------------------------------------------------------------------- judge
EXPECT = [[Expectation(EQUAL, 2)], [Expectation(TRUTHY)], [Expectation(FALSY)]]


def test_judge_all_passed():
    run = Execution(tests={0: {"test": 0, "values": [2]}, 1: {"test": 1, "values": [{"l": [0]}]},
                           2: {"test": 2, "values": [""]}}, done=True)
    assert judge(run, EXPECT) == [Result(0, PASSED), Result(1, PASSED), Result(2, PASSED)]


def test_judge_failures_and_errors():
    run = Execution(tests={
        0: {"test": 0, "values": [{"f": 2.5}]},
        1: {"test": 1, "values": [], "error": "ZeroDivisionError: division by zero"},
        2: {"test": 2, "values": [{"l": [1]}]},
    }, done=True)
    results = judge(run, EXPECT)
    assert [r.status for r in results] == [FAILED, ERROR, FAILED]
    assert results[0].message == "expected 2, got 2.5"
    assert results[1].message == "ZeroDivisionError: division by zero"
    assert results[2].message == "expected a false value, got [1]"
    assert not any(r.passed for r in results)


def test_judge_wrong_value_before_error_is_a_failure():
    expects = [[Expectation(EQUAL, 1), Expectation(EQUAL, 2)]]
    run = Execution(tests={0: {"test": 0, "values": [5], "error": "KeyError: 3"}})
    [result] = judge(run, expects)
    assert result.status == FAILED and "expected 1, got 5" in result.message
    run = Execution(tests={0: {"test": 0, "values": [1]}})  # probe missing, no error text
    [result] = judge(run, expects)
    assert result.status == ERROR and result.message == "probe missing"


def test_judge_opaque_value_fails_even_truthy_checks():
    run = Execution(tests={0: {"test": 0, "values": [{"o": "AlwaysEqual"}]},
                           1: {"test": 1, "values": [{"o": "AlwaysEqual"}]},
                           2: {"test": 2, "values": [{"l": [{"o": "Falsy"}]}]}})
    results = judge(run, EXPECT)
    assert [r.status for r in results] == [FAILED, FAILED, FAILED]
    assert all("not plain data" in r.message for r in results)


def test_judge_malformed_value_fails():
    run = Execution(tests={0: {"test": 0, "values": [{"weird": 1, "x": 2}]}})
    assert judge(run, EXPECT[:1])[0].status == FAILED


def test_judge_missing_tests_after_timeout():
    run = Execution(tests={0: {"test": 0, "values": [2]}}, stop="timeout", exit="SIGKILL")
    results = judge(run, EXPECT)
    assert [r.status for r in results] == [PASSED, TIMEOUT, TIMEOUT]
    assert results[1].message == "timed out"
    assert results[2].message == "not run: an earlier test timed out"


@pytest.mark.parametrize("stop, exit_, reason", [
    (None, "SIGKILL", "SIGKILL"),
    (None, "exit 0", "exit 0"),
    ("memory", "SIGKILL", "memory limit exceeded"),
    ("oversize", "SIGKILL", "result output too large"),
])
def test_judge_missing_tests_after_crash(stop, exit_, reason):
    run = Execution(tests={0: {"test": 0, "values": [2]}}, stop=stop, exit=exit_)
    results = judge(run, EXPECT)
    assert [r.status for r in results] == [PASSED, CRASHED, CRASHED]
    assert results[1].message == f"process ended ({reason})"
    assert results[2].message == f"not run ({reason})"


def test_judge_load_error_fails_every_test():
    run = Execution(load_error="SyntaxError: invalid syntax (<candidate>, line 1)", done=True)
    results = judge(run, EXPECT)
    assert len(results) == 3
    assert all(r.status == ERROR for r in results)
    assert all(r.message == "code failed to load: SyntaxError: invalid syntax (<candidate>, line 1)"
               for r in results)
    assert [r.index for r in results] == [0, 1, 2]


def test_check_probe_modes():
    assert check_probe(2, Expectation(EQUAL, 2.0)) is None
    assert check_probe(True, Expectation(EQUAL, 1)) == "expected 1, got True"
    assert check_probe([0], Expectation(TRUTHY)) is None
    assert check_probe([], Expectation(TRUTHY)) == "expected a true value, got []"
    assert check_probe(None, Expectation(FALSY)) is None
    assert check_probe("x" * 500, Expectation(EQUAL, "y")).endswith("...")
    assert len(check_probe("x" * 500, Expectation(EQUAL, "y"))) < 300


# ------------------------------------------------------------------ oracle_expectations
PLANS = [plan_test("assert f(1) == 2"), plan_test("assert g()\nassert not h()")]


def test_oracle_expectations_collects_expected_values():
    run = Execution(tests={0: {"test": 0, "values": [2, 2]}, 1: {"test": 1, "values": [True, 0]}}, done=True)
    expects, problems = oracle_expectations(run, PLANS)
    assert problems == []
    assert expects == [[Expectation(EQUAL, 2)], [Expectation(TRUTHY), Expectation(FALSY)]]


def test_oracle_expectations_reports_problems():
    run = Execution(tests={0: {"test": 0, "values": [3, 2]}, 1: {"test": 1, "values": [False, 1]}})
    _, problems = oracle_expectations(run, PLANS)
    assert problems == [
        "test 0: oracle gives 3, test expects 2",
        "test 1: oracle fails 'assert ...'",
        "test 1: oracle fails 'assert not ...'",
    ]
    run = Execution(tests={0: {"test": 0, "values": [{"o": "X"}, {"o": "X"}]}, 1: {"test": 1, "values": [1, 0]}})
    _, problems = oracle_expectations(run, PLANS)
    assert any("not plain data" in p for p in problems)


def test_oracle_expectations_unfinished_and_load_error():
    run = Execution(tests={0: {"test": 0, "values": [], "error": "NameError: f"}}, stop=None, exit="exit 0")
    expects, problems = oracle_expectations(run, PLANS)
    assert expects == [[], []]
    assert problems == ["test 0: oracle did not finish: NameError: f",
                        "test 1: oracle did not finish: process ended (exit 0)"]
    run = Execution(load_error="ImportError: nope")
    _, problems = oracle_expectations(run, PLANS)
    assert problems[0] == "oracle failed to load: ImportError: nope"
