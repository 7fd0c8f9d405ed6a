"""Turn a puzzle's test snippets into probe plans for the sandbox.

A test is a snippet of Python: setup statements plus top-level asserts of the forms
`assert EXPR == EXPECTED`, `assert EXPR` and `assert not EXPR`. Each assert becomes a
*probe*: the sandbox evaluates EXPR and reports its value; the check against EXPECTED
happens outside the candidate's process (see `sandbox`). Candidate runs receive only the
probe expressions; oracle runs additionally evaluate EXPECTED, which is how expected
values are obtained without ever sending them to a candidate.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

EQUAL, TRUTHY, FALSY = "equal", "truthy", "falsy"


class TestSyntaxError(ValueError):
    """A test snippet that cannot be turned into probes."""

    __test__ = False  # not a pytest test class, despite the name


@dataclass(frozen=True)
class TestPlan:
    source: str
    candidate_steps: list[list[str]]  # ["exec", src] / ["probe", expr]; no expected values
    oracle_steps: list[list[str]]  # as above, with a probe of EXPECTED after each EQUAL probe
    checks: list[str]  # one of EQUAL / TRUTHY / FALSY per probe


# Builtins whose result a truthy probe would take on trust: `assert all(...)` computes its
# True inside the candidate's process, where the candidate can patch `all` or hand it
# objects whose __bool__ lies. Such checks must compare the value itself: `assert X == Y`.
TRUSTING_CALLS = {"all", "any", "bool", "callable", "hasattr", "isinstance", "issubclass", "len"}


def _check_probe(probe: ast.expr, mode: str, lineno: int) -> None:
    """Comparisons and logic in a probe would run in the candidate's process, where an
    AlwaysEqual object could answer them; they belong at the top of the assert."""
    for node in ast.walk(probe):
        if isinstance(node, (ast.Compare, ast.BoolOp)) or (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)):
            raise TestSyntaxError(
                f"line {lineno}: the checked expression may not contain comparisons or and/or/not "
                "(they would run inside the candidate's process); use 'assert X == Y'")
    if mode != EQUAL and isinstance(probe, ast.Call) and isinstance(probe.func, ast.Name) and probe.func.id in TRUSTING_CALLS:
        raise TestSyntaxError(
            f"line {lineno}: 'assert {probe.func.id}(...)' is decided inside the candidate's process; "
            "check the value itself with 'assert X == Y'")


def _assert_parts(node: ast.Assert) -> tuple[str, ast.expr, ast.expr | None]:
    test = node.test
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        return EQUAL, test.left, test.comparators[0]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return FALSY, test.operand, None
    if isinstance(test, ast.Compare):
        raise TestSyntaxError(
            f"line {node.lineno}: only 'assert X == Y', 'assert X' and 'assert not X' are supported")
    return TRUTHY, test, None


def plan_test(source: str) -> TestPlan:
    """Split one test snippet into setup and probe steps."""
    try:
        module = ast.parse(source)
    except SyntaxError as exc:
        raise TestSyntaxError(f"line {exc.lineno}: {exc.msg}") from None
    candidate: list[list[str]] = []
    oracle: list[list[str]] = []
    checks: list[str] = []

    def add_exec(src: str) -> None:
        for steps in (candidate, oracle):
            if steps and steps[-1][0] == "exec":
                steps[-1][1] += "\n" + src
            else:
                steps.append(["exec", src])

    for stmt in module.body:
        if isinstance(stmt, ast.Assert):
            mode, probe, expected = _assert_parts(stmt)
            _check_probe(probe, mode, stmt.lineno)
            checks.append(mode)
            candidate.append(["probe", ast.unparse(probe)])
            oracle.append(["probe", ast.unparse(probe)])
            if expected is not None:
                oracle.append(["probe", ast.unparse(expected)])
            continue
        if any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
            raise TestSyntaxError(f"line {stmt.lineno}: asserts must be top-level statements, not inside a block")
        add_exec(ast.unparse(stmt))
    if not checks:
        raise TestSyntaxError("the test has no assert")
    return TestPlan(source, candidate, oracle, checks)
