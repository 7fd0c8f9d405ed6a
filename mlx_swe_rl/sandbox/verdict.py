"""Judge a sandbox execution: decode the reported values and compare them, outside the
candidate's process, with the expected values from the oracle run."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .pool import Execution
from ..puzzles.testplan import EQUAL, FALSY, TRUTHY, TestPlan

PASSED, FAILED, ERROR, TIMEOUT, CRASHED = "passed", "failed", "error", "timeout", "crashed"


@dataclass(frozen=True)
class Opaque:
    """A value the candidate returned that is not plain builtin data; it equals nothing."""

    type_name: str

    def __repr__(self) -> str:
        return f"<{self.type_name} object>"


@dataclass(frozen=True)
class TestResult:
    index: int
    status: str  # passed / failed / error / timeout / crashed
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.status == PASSED


def decode(data: Any) -> Any:
    """Rebuild a value from the sandbox's tagged encoding into fresh builtin objects.
    Anything malformed (the candidate may have written to the pipe) decodes as Opaque."""
    try:
        return _decode(data)
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError):
        return Opaque("malformed")


def _decode(data: Any) -> Any:
    if data is None or type(data) in (bool, int, str):
        return data
    if type(data) is not dict or len(data) != 1:
        raise ValueError("bad tag")
    (tag, body), = data.items()
    if tag == "f":
        return float(body)
    if tag == "b":
        return bytes.fromhex(body)
    if tag == "o":
        return Opaque(str(body))
    if type(body) is not list:
        raise ValueError("bad body")
    if tag == "l":
        return [_decode(v) for v in body]
    if tag == "t":
        return tuple(_decode(v) for v in body)
    if tag == "s":
        return {_decode(v) for v in body}
    if tag == "z":
        return frozenset(_decode(v) for v in body)
    if tag == "d":
        return {_decode(k): _decode(v) for k, v in body}
    raise ValueError("bad tag")


def contains_opaque(value: Any) -> bool:
    if isinstance(value, Opaque):
        return True
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(contains_opaque(v) for v in value)
    if isinstance(value, dict):
        return any(contains_opaque(k) or contains_opaque(v) for k, v in value.items())
    return False


def same_value(got: Any, expected: Any) -> bool:
    """Python `==` on plain data, except: floats within rel 1e-9 (ints and floats compare
    numerically), bools equal only bools, and an Opaque value equals nothing."""
    if isinstance(got, Opaque) or isinstance(expected, Opaque):
        return False
    numbers = (int, float)
    if type(got) is bool or type(expected) is bool:
        return type(got) is type(expected) and got == expected
    if type(got) in numbers and type(expected) in numbers:
        if type(got) is int and type(expected) is int:
            return got == expected
        try:
            return got == expected or math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12)
        except OverflowError:  # an int beyond float range: == above already said no
            return False
    if type(got) is not type(expected):
        return False
    if isinstance(got, (list, tuple)):
        return len(got) == len(expected) and all(same_value(a, b) for a, b in zip(got, expected))
    if contains_opaque(got) or contains_opaque(expected):
        return False
    if isinstance(got, dict):
        have = {_typed_key(k): v for k, v in got.items()}
        want = {_typed_key(k): v for k, v in expected.items()}
        return have.keys() == want.keys() and all(same_value(have[k], want[k]) for k in have)
    if isinstance(got, (set, frozenset)):
        return {_typed_key(v) for v in got} == {_typed_key(v) for v in expected}
    return got == expected  # str, bytes, None


def _typed_key(value: Any) -> Any:
    """A hashable stand-in under which True and 1 (or 1.0) differ, for set members and dict keys."""
    if type(value) is bool:
        return ("bool", value)
    if type(value) is tuple:
        return ("tuple", tuple(_typed_key(v) for v in value))
    if type(value) is frozenset:
        return ("frozenset", frozenset(_typed_key(v) for v in value))
    return value


def short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Expectation:
    """What one probe of the oracle run says: the mode and, for EQUAL, the expected value."""

    mode: str
    value: Any = None


def _missing(index: int, run: Execution, first_missing: bool) -> TestResult:
    if run.stop == "timeout":
        return TestResult(index, TIMEOUT, "timed out" if first_missing else "not run: an earlier test timed out")
    reason = {"memory": "memory limit exceeded", "oversize": "result output too large"}.get(run.stop or "", run.exit)
    return TestResult(index, CRASHED, f"process ended ({reason})" if first_missing else f"not run ({reason})")


def check_probe(got: Any, expect: Expectation) -> str | None:
    """None when the probe value meets the expectation, else a failure message."""
    if contains_opaque(got):
        return f"got {short(got)}, which is not plain data"
    if expect.mode == EQUAL:
        return None if same_value(got, expect.value) else f"expected {short(expect.value)}, got {short(got)}"
    wanted = expect.mode == TRUTHY
    return None if bool(got) == wanted else f"expected a {'true' if wanted else 'false'} value, got {short(got)}"


def judge(run: Execution, expectations: list[list[Expectation]]) -> list[TestResult]:
    """Per-test results for a candidate run, given each test's probe expectations."""
    if run.load_error is not None:
        return [TestResult(i, ERROR, f"code failed to load: {run.load_error}") for i in range(len(expectations))]
    results: list[TestResult] = []
    first_missing = True
    for index, expects in enumerate(expectations):
        line = run.tests.get(index)
        if line is None:
            results.append(_missing(index, run, first_missing))
            first_missing = False
            continue
        values = [decode(v) for v in line["values"]]
        message = next((m for m in (check_probe(v, e) for v, e in zip(values, expects)) if m), None)
        if message is not None:
            results.append(TestResult(index, FAILED, message))
        elif len(values) < len(expects):
            error = line.get("error")
            results.append(TestResult(index, ERROR, str(error)[:500] if error else "probe missing"))
        else:
            results.append(TestResult(index, PASSED))
    return results


def oracle_expectations(run: Execution, plans: list[TestPlan]) -> tuple[list[list[Expectation]], list[str]]:
    """Expected values from an oracle run (probe A then EXPECTED for each `A == EXPECTED`),
    and the problems found: any test whose oracle run did not pass its own asserts."""
    expectations: list[list[Expectation]] = []
    problems: list[str] = []
    if run.load_error is not None:
        problems.append(f"oracle failed to load: {run.load_error}")
    for index, plan in enumerate(plans):
        line = run.tests.get(index) or {}
        values = [decode(v) for v in line.get("values", [])]
        expects: list[Expectation] = []
        pos = 0
        for mode in plan.checks:
            width = 2 if mode == EQUAL else 1  # an EQUAL probe is followed by its EXPECTED
            if pos + width > len(values):
                break
            got, want = values[pos], values[pos + width - 1]
            pos += width
            if mode == EQUAL:
                if not same_value(got, want):
                    problems.append(f"test {index}: oracle gives {short(got)}, test expects {short(want)}")
                if contains_opaque(want):
                    problems.append(f"test {index}: expected value {short(want)} is not plain data")
                expects.append(Expectation(EQUAL, want))
            else:
                expects.append(Expectation(mode))
                if check_probe(got, expects[-1]):
                    problems.append(f"test {index}: oracle fails 'assert {'not ' if mode == FALSY else ''}...'")
        if len(expects) < len(plan.checks):
            detail = line.get("error") or (_missing(index, run, True).message if not line else "probe missing")
            problems.append(f"test {index}: oracle did not finish: {detail}")
        expectations.append(expects)
    return expectations, problems
