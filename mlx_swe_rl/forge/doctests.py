"""Tests from docstring examples: a self-contained function's doctests as puzzle asserts.

A function is self-contained when every name it uses is a builtin, one of its parameters or
locals, or a name the module imports from a module the sandbox allows (those imports travel
with the code). Its doctest examples then become tests in the puzzle format
(`puzzles.testplan`), in order, in one shared namespace as doctest runs them:

- `>>> EXPR` showing a plain-data literal: `assert EXPR == LITERAL`;
- `>>> print(X)` showing text: `assert str(X) == 'text'`;
- `>>> EXPR` showing any other one-line repr: `assert repr(EXPR) == 'repr'`;
- `>>> EXPR` showing a traceback: the exception's class name must match;
- everything else (assignments, examples with `...` or whitespace options) runs as setup.

An example that uses a name the tests cannot have (another function of the module, a module
the sandbox does not allow) is left out, and so is every later one that needs what it made.
Whether the asserts are right (the oracle passes them, the buggy code fails one) is for the
scorer to say; this module only writes them.
"""

from __future__ import annotations

import ast
import builtins
import doctest
import re
import textwrap
from typing import Callable

from ..puzzles.testplan import TestSyntaxError, plan_test
from ..sandbox.worker import PRELOADED

ALLOWED_MODULES = frozenset(PRELOADED)
BUILTIN_NAMES = frozenset(dir(builtins))
RAISED = "_doctest_raised"  # the name a test stores the raised exception's class name in
PLAIN = (type(None), bool, int, float, str, bytes)
ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")


def allowed_module(name: str) -> bool:
    return name in ALLOWED_MODULES


Allowed = Callable[[str], bool]  # which modules code may import and stay self-contained


def module_imports(tree: ast.Module, allowed: Allowed = allowed_module) -> tuple[list[str], dict[str, str]]:
    """The module's `from __future__` lines, and {bound name: import line} for its top-level
    imports of allowed modules (`import x`, `import x as y`, `from x import a as b`)."""
    future: list[str] = []
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            future.append(ast.unparse(node))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if allowed(alias.name):  # `import a.b` binds `a`
                    names[alias.asname or alias.name.split(".")[0]] = ast.unparse(ast.Import([alias]))
        elif isinstance(node, ast.ImportFrom) and not node.level and allowed(node.module or ""):
            for alias in node.names:
                if alias.name != "*":
                    names[alias.asname or alias.name] = ast.unparse(ast.ImportFrom(node.module, [alias], 0))
    return future, names


def _arguments(args: ast.arguments) -> set[str]:
    every = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
    return {a.arg for a in every}


def free_names(tree: ast.AST, allowed: Allowed = allowed_module) -> set[str] | None:
    """Names `tree` reads and does not bind itself (scopes flattened: any binding anywhere
    in it counts). None when it declares `global`/`nonlocal` or imports a module the
    sandbox does not allow: such code depends on more than itself."""
    bound: set[str] = set()
    loaded: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            return None
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            if not isinstance(node, ast.ClassDef):
                bound |= _arguments(node.args)
        elif isinstance(node, ast.Lambda):
            bound |= _arguments(node.args)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
        elif isinstance(node, ast.Import):
            if not all(allowed(a.name) for a in node.names):
                return None
            bound |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level or not allowed(node.module or "") or any(a.name == "*" for a in node.names):
                return None
            bound |= {a.asname or a.name for a in node.names}
    return loaded - bound - BUILTIN_NAMES


def needed_imports(code: str, imports: dict[str, str], allowed: Allowed = allowed_module) -> list[str] | None:
    """The import lines `code` (one function) needs to run on its own, or None when it uses
    a name that neither builtins, its own bindings nor allowed imports provide."""
    try:
        free = free_names(ast.parse(code), allowed)
    except (SyntaxError, ValueError):
        return None
    if free is None or not free <= imports.keys():
        return None
    return sorted({imports[name] for name in free})


def is_plain(value: object) -> bool:
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(is_plain(k) and is_plain(v) for k, v in value.items())
    return type(value) in PLAIN


def _literal(want: str) -> str | None:
    """The source of `want` when it is a plain-data literal (the form doctest shows for
    lists, numbers, strings...), as one line."""
    try:
        tree = ast.parse(want.strip(), mode="eval")
        value = ast.literal_eval(tree)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None
    return ast.unparse(tree.body) if is_plain(value) else None


def _exception_name(exc_msg: str) -> str | None:
    """The class name of the exception a traceback ends with ("ValueError" for
    "module.ValueError: message")."""
    first = exc_msg.strip().splitlines()[0] if exc_msg.strip() else ""
    name = first.split(":", 1)[0].strip().rsplit(".", 1)[-1]
    return name if name.isidentifier() else None


def _assert_line(example: doctest.Example, source: str) -> str | None:
    """The test for one example that shows output, or None when it can only run as setup."""
    if example.exc_msg is not None:
        name = _exception_name(example.exc_msg)
        if name is None:
            return None
        return (f"try:\n{textwrap.indent(source, '    ')}\n    {RAISED} = None\n"
                f"except Exception as _doctest_error:\n    {RAISED} = type(_doctest_error).__name__\n"
                f"assert {RAISED} == {name!r}")
    try:
        expr = ast.parse(source, mode="eval").body
    except SyntaxError:
        return None
    want, options = example.want, example.options
    if options.get(doctest.ELLIPSIS) or options.get(doctest.NORMALIZE_WHITESPACE) or "..." in want:
        return None
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "print" \
            and len(expr.args) == 1 and not expr.keywords and not isinstance(expr.args[0], ast.Starred):
        return f"assert str({ast.unparse(expr.args[0])}) == {want.removesuffix(chr(10))!r}"
    literal = _literal(want)
    if literal is not None:
        return f"assert {ast.unparse(expr)} == {literal}"
    text = want.strip()
    if "\n" in text or ADDRESS.search(text):
        return None  # multi-line reprs and object addresses do not survive as one string
    return f"assert repr({ast.unparse(expr)}) == {text!r}"


def doctest_tests(docstring: str, entry_point: str, known: set[str]) -> list[str]:
    """Puzzle tests from the doctest examples of `docstring`, in order: one test per example
    that shows output, each led by the setup examples before it. `known` holds the names the
    tests may use besides builtins and the entry point (the carried imports)."""
    try:
        examples = doctest.DocTestParser().get_examples(docstring)
    except ValueError:  # malformed examples (bad indentation of a continuation line)
        return []
    names = set(known) | {entry_point}
    tests: list[str] = []
    setup: list[str] = []
    for example in examples:
        if example.options.get(doctest.SKIP):
            continue
        source = example.source.rstrip("\n")
        try:
            free = free_names(ast.parse(source))
        except (SyntaxError, ValueError):
            continue
        if free is None or not free <= names:
            continue  # needs a name the tests do not have; so does what depends on it
        line = _assert_line(example, source) if example.want else None
        if line is not None:
            test = "\n".join(setup + [line])
            try:
                plan_test(test)
            except TestSyntaxError:
                line = None  # e.g. a comparison inside the checked expression: run it as setup
            else:
                tests.append(test)
                setup = []
        if line is None and example.exc_msg is None:
            setup.append(ast.unparse(ast.parse(source)))  # without doctest directives
        names |= _bindings(source)
    return tests


def with_test_imports(tests: list[str], imports: dict[str, str], carried: list[str]) -> list[str]:
    """`tests` with the import lines they use and the code does not carry (`carried`) put
    before the first: tests share one namespace, so the later ones have them too."""
    used = set().union(*(free_names(ast.parse(t)) or set() for t in tests))
    extra = sorted({imports[n] for n in used if n in imports} - set(carried))
    return ["\n".join(extra + [tests[0]])] + tests[1:] if tests else []


def _bindings(source: str) -> set[str]:
    """Names an example binds (for the examples after it)."""
    bound: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {a.asname or a.name.split(".")[0] for a in node.names}
    return bound


def docstring_of(code: str) -> str | None:
    """The docstring of the one function `code` defines."""
    try:
        node = ast.parse(code).body[0]
    except (SyntaxError, ValueError, IndexError):
        return None
    return ast.get_docstring(node, clean=True) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
