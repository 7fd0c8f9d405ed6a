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


@dataclass(frozen=True)
class TestPlan:
    source: str
    candidate_steps: list[list[str]]  # ["exec", src] / ["probe", expr]; no expected values
    oracle_steps: list[list[str]]  # as above, with a probe of EXPECTED after each EQUAL probe
    checks: list[str]  # one of EQUAL / TRUTHY / FALSY per probe


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
