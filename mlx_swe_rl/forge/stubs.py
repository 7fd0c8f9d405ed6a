"""Writing tasks made from repair puzzles: the function's signature and description, its body left
to write.

Issue 53's capability gate asks whether RL on repair costs the model its skill at writing code
from a specification. The question needs functions the model has never been trained on, with
tests that already tell right from wrong: the held-out repair puzzles have both. A stub keeps
what a specification says (the module's imports, the signature, the decorators, the docstring,
a class's attributes) and replaces every function body of the entry point with `...`; the
puzzle's tests and oracle stay, so the scorer, the reports and the paired comparisons work on
it as on any puzzle. Several mutants of one function make one stub: the gate counts functions.
"""

from __future__ import annotations

import ast
import copy
import hashlib
from dataclasses import replace

from ..puzzles.format import Puzzle, parse_python

FAMILY = "spec"  # the family of a stub puzzle: not a mutation, the whole body is missing
SYMPTOM = "Symptom:"


def stub_code(oracle: str, entry_point: str) -> str:
    """The oracle's top-level imports and its `entry_point` definition, with the body of that
    function (or of each method of that class) replaced by its docstring, if any, and `...`.
    Other top-level code (helpers, constants) is left out: the writer is asked for the entry
    point alone, as the repair prompt asks for it."""
    module = parse_python(oracle)
    kept: list[ast.stmt] = []
    for node in module.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            kept.append(node)
        elif getattr(node, "name", None) == entry_point:
            kept.append(_stubbed(copy.deepcopy(node)))
    if not any(getattr(node, "name", None) == entry_point for node in kept):
        raise ValueError(f"the oracle does not define '{entry_point}' at top level")
    return ast.unparse(ast.Module(body=kept, type_ignores=[])) + "\n"


def _stubbed(node: ast.stmt) -> ast.stmt:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        doc = ast.get_docstring(node, clean=False)
        node.body = ([ast.Expr(ast.Constant(doc))] if doc is not None else []) + [ast.Expr(ast.Constant(...))]
    elif isinstance(node, ast.ClassDef):
        node.body = [_stubbed(child) for child in node.body]
    return node


def specification(description: str) -> str:
    """What a function must do, from a repair puzzle's description: the hand-written puzzles (and
    those forged from them) end with "Symptom: ..." on how their bug shows, which is no part of a
    specification (and, for a forged mutant, names another bug than its own)."""
    return description.split(SYMPTOM)[0].strip() or description


def stub_puzzle(p: Puzzle) -> Puzzle:
    """The writing task of `p`'s function: its stub to complete, with `p`'s specification, tests,
    oracle, tier and split. Its id names the function and a digest of the oracle, so every
    mutant of one function gives the same stub."""
    # the oracle as the AST gives it back: the same function whatever its layout and comments
    digest = hashlib.sha256(ast.unparse(parse_python(p.oracle)).encode()).hexdigest()[:8]
    source = {**(p.source or {}), "spec_of": p.id}
    return replace(p, id=f"spec-{p.entry_point.lower()}-{digest}", description=specification(p.description),
                   buggy=stub_code(p.oracle, p.entry_point), family=FAMILY, mutation=None, source=source, path=None)


def stub_puzzles(puzzles: list[Puzzle]) -> list[Puzzle]:
    """One writing task per distinct function: the stub of the first of its puzzles, in order."""
    stubs: dict[str, Puzzle] = {}
    for p in puzzles:
        stub = stub_puzzle(p)
        stubs.setdefault(stub.id, stub)
    return list(stubs.values())
