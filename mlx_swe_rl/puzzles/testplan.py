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


# --- the names a test statement reads and binds (for a public test's set-up) ---------------------

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
          ast.DictComp, ast.GeneratorExp)


@dataclass(frozen=True)
class StatementNames:
    """What top-level test code does with module-level names: `loaded` it reads before binding
    them itself (or changes in place: `chart["x"] = 1` reads `chart`), `bound` it (re)binds."""

    loaded: frozenset[str]
    bound: frozenset[str]


def _free_inside(scope: ast.AST) -> set[str]:
    """Names a nested scope (a def, a class, a lambda, a comprehension) reads from outside it:
    what it loads less what it binds itself (its parameters and local assignments). Loads in a
    def's body count, though they happen only when it is called: a test that calls it later
    needs them."""
    loads, local = set(), set()
    for node in ast.walk(scope):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else local).add(node.id)
        elif isinstance(node, ast.arg):
            local.add(node.arg)
    return loads - local


class _Names:
    """Reads and binds in execution order, so that a name bound before it is read (a loop
    variable, an earlier assignment) is not counted as read from outside."""

    def __init__(self) -> None:
        self.loaded: set[str] = set()
        self.bound: set[str] = set()

    def read(self, name: str) -> None:
        if name not in self.bound:
            self.loaded.add(name)

    def expr(self, node: ast.AST | None) -> None:
        """An expression, or an assignment target (a Name in Store context binds; `del x` and
        `x.attr = ...` / `x[k] = ...` read x)."""
        if node is None:
            return
        if isinstance(node, SCOPES):
            for name in _free_inside(node):
                self.read(name)
            return
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store):
                self.bound.add(node.id)
            else:
                self.read(node.id)
            return
        if isinstance(node, ast.NamedExpr):
            self.expr(node.value)
            self.expr(node.target)
            return
        for child in ast.iter_child_nodes(node):
            self.expr(child)

    def block(self, stmts: list[ast.stmt]) -> None:
        for stmt in stmts:
            self.stmt(stmt)

    def stmt(self, stmt: ast.stmt) -> None:
        """One statement; a branch's bindings count as made (a test rarely binds conditionally)."""
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.bound.add(stmt.name)  # first: its body runs later, and may call it (recursion)
            self.expr(stmt)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            self.bound.update((a.asname or a.name).split(".")[0] for a in stmt.names if a.name != "*")
        elif isinstance(stmt, ast.Assign):
            self.expr(stmt.value)
            for target in stmt.targets:
                self.expr(target)
        elif isinstance(stmt, ast.AnnAssign):
            self.expr(stmt.value)
            self.expr(stmt.target)
        elif isinstance(stmt, ast.AugAssign):  # reads the name before it writes it: never a fresh binding
            self.expr(stmt.value)
            if isinstance(stmt.target, ast.Name):
                self.read(stmt.target.id)
            else:
                self.expr(stmt.target)
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            self.expr(stmt.iter)
            self.expr(stmt.target)
            self.block(stmt.body + stmt.orelse)
        elif isinstance(stmt, (ast.While, ast.If)):
            self.expr(stmt.test)
            self.block(stmt.body + stmt.orelse)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                self.expr(item.context_expr)
                self.expr(item.optional_vars)
            self.block(stmt.body)
        elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            self.block(stmt.body)
            for handler in stmt.handlers:
                self.expr(handler.type)
                if handler.name:
                    self.bound.add(handler.name)
                self.block(handler.body)
            self.block(stmt.orelse + stmt.finalbody)
        else:
            self.expr(stmt)


def statement_names(stmt: ast.stmt) -> StatementNames:
    """The module-level names one top-level statement reads (before binding them) and binds.
    An augmented assignment (`n += 1`) and `del` read a name that must exist already: loads,
    never bindings."""
    names = _Names()
    names.stmt(stmt)
    return StatementNames(frozenset(names.loaded), frozenset(names.bound))


def free_names(source: str) -> set[str]:
    """The names a test snippet reads before binding them itself: those it needs from the tests
    before it, or from the code under test."""
    names = _Names()
    names.block(ast.parse(source).body)
    return names.loaded
