"""Tasks verified by a repository's own tests (SWE-bench's FAIL_TO_PASS and PASS_TO_PASS).

Such a task (mined by `forge.repotests`) keeps its pytest ids as its `tests`, each written as
`assert "tests/test_x.py::test_y"`: a test string every part of the project already handles
(the puzzle format, multi-turn repair's public/hidden split, the feedback that names a failing
test), that reads no name, so a public view never carries another test along. Its `source`
names the snapshot (the fixed commit's files, no `.git`), the file and the function the
candidate replaces; `sandbox.scorer.Scorer` runs those ids with pytest instead of the probes.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from .format import Puzzle, parse_python

PREFIX = 'assert "'


@dataclass(frozen=True)
class RepoTests:
    """What scores a repository-test task: the snapshot, the file and function a candidate
    replaces, and the test ids (FAIL_TO_PASS first, then PASS_TO_PASS)."""

    snapshot: str
    path: str
    qualname: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...] = ()

    @property
    def ids(self) -> list[str]:
        return list(self.fail_to_pass + self.pass_to_pass)

    def command(self) -> str:
        """The run command, for the record (pytest in a copy of the snapshot)."""
        return "python -m pytest -q -p no:cacheprovider " + " ".join(self.ids)

    def source_fields(self) -> dict[str, str]:
        """What a task's `source` records of them (plain strings)."""
        return {"snapshot": self.snapshot, "fail_to_pass": " ".join(self.fail_to_pass),
                "pass_to_pass": " ".join(self.pass_to_pass), "run": self.command()}

    def tests(self) -> tuple[str, ...]:
        return tuple(test_source(i) for i in self.ids)


def test_source(node_id: str) -> str:
    return f"{PREFIX}{node_id}\""


def node_id(test: str) -> str | None:
    """The pytest id a test string names, None for an ordinary test."""
    test = test.strip()
    if not test.startswith(PREFIX):
        return None
    try:
        value = ast.literal_eval(test[len("assert "):])
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) and "::" in value else None


def repo_tests(puzzle: Puzzle) -> RepoTests | None:
    """The repository tests of a task (its `source` names a snapshot), None for other puzzles."""
    source = puzzle.source or {}
    if not source.get("snapshot") or not source.get("fail_to_pass"):
        return None
    return RepoTests(str(source["snapshot"]), str(source["path"]), str(source["qualname"]),
                     tuple(str(source["fail_to_pass"]).split()), tuple(str(source.get("pass_to_pass", "")).split()))


def function_span(text: str, qualname: str) -> tuple[int, int] | None:
    """(first line with decorators, last line), 1-based, of function `qualname` in module text."""
    try:
        tree = parse_python(text)
    except (SyntaxError, ValueError):
        return None

    def visit(body: list[ast.stmt], prefix: str) -> tuple[int, int] | None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and prefix + node.name == qualname:
                return min([node.lineno] + [d.lineno for d in node.decorator_list]), node.end_lineno
            if isinstance(node, ast.ClassDef):
                found = visit(node.body, f"{prefix}{node.name}.")
                if found:
                    return found
        return None

    return visit(tree.body, "")


def splice(text: str, qualname: str, code: str) -> str | None:
    """Module `text` with function `qualname` replaced by `code` (a function standing alone),
    indented to the original's depth; None if the module lacks it."""
    span = function_span(text, qualname)
    if span is None:
        return None
    lines = text.splitlines()
    first = lines[span[0] - 1]
    indent = first[:len(first) - len(first.lstrip())]
    body = [indent + line if line.strip() else line for line in code.strip("\n").splitlines()]
    return "\n".join(lines[:span[0] - 1] + body + lines[span[1]:]) + "\n"
