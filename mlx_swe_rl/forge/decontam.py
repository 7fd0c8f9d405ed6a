"""Decontamination: no harvested function may be one of the public code benchmarks' solutions.

A function is compared by two fingerprints:

- its name, lowercased;
- its normalised body: the function's syntax tree (`ast.dump`, no line numbers) with its
  docstring removed (comments and formatting never reach the tree), its own name replaced by
  `f` and every name it binds (parameters, locals, loop and comprehension variables) renamed
  `v0`, `v1`... in order of first appearance, so that a renamed or reformatted copy matches.
  The dump is hashed (SHA-256, first 16 hex digits).

A harvested function is contaminated when its normalised body matches a benchmark's
(whatever its name), or when both its name and its body's size in nodes do (a copy with one
token changed still has the benchmark's name and length). The benchmarks' fingerprints are a
committed JSON file (`FINGERPRINTS`) built by `scripts/benchmark_fingerprints.py`; it holds
names and hashes only, never benchmark code.
"""

from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..puzzles.format import parse_python

FINGERPRINTS = Path(__file__).with_name("data") / "benchmark_fingerprints.json"
DIGITS = 16


class _Renamer(ast.NodeTransformer):
    """Renames the function and the names it binds; other names (builtins, imports) stay."""

    def __init__(self, bound: list[str], own: str) -> None:
        self.names = {own: "f", **{name: f"v{i}" for i, name in enumerate(bound)}}

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = self.names.get(node.id, node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.arg = self.names.get(node.arg, node.arg)
        node.annotation = None  # type hints say nothing about behaviour
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.name = self.names.get(node.name, node.name)
        node.returns = None
        self.generic_visit(node)
        return node


def _bound_names(function: ast.FunctionDef) -> list[str]:
    """Names the function binds, in order of first appearance (parameters first)."""
    order: dict[str, None] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.arg):
            order[node.arg] = None
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            order[node.id] = None
    return list(order)


def _strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]


@dataclass(frozen=True)
class Fingerprint:
    name: str
    body: str  # hash of the normalised body
    size: int  # nodes in the normalised body


def fingerprints(code: str) -> list[Fingerprint]:
    """The fingerprint of every module-level function `code` defines (none if it does not parse)."""
    try:
        tree = parse_python(code)
    except (SyntaxError, ValueError):
        return []
    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = node.name.lower()  # before the renamer makes it `f`
            _strip_docstrings(node)
            _Renamer(_bound_names(node), node.name).visit(node)
            dump = ast.dump(node, include_attributes=False)
            digest = hashlib.sha256(dump.encode()).hexdigest()[:DIGITS]
            found.append(Fingerprint(name, digest, sum(1 for _ in ast.walk(node))))
    return found


@dataclass
class Benchmarks:
    """The benchmarks' fingerprints: body hashes, and (name, size) pairs."""

    bodies: set[str] = field(default_factory=set)
    named_sizes: set[tuple[str, int]] = field(default_factory=set)
    about: dict = field(default_factory=dict)  # benchmark -> functions, where it came from

    def add(self, prints: list[Fingerprint]) -> None:
        for p in prints:
            self.bodies.add(p.body)
            self.named_sizes.add((p.name, p.size))

    def match(self, code: str) -> str | None:
        """Why `code` (a harvested function) is contaminated, or None."""
        for p in fingerprints(code):
            if p.body in self.bodies:
                return f"{p.name}: its normalised body is a benchmark's"
            if (p.name, p.size) in self.named_sizes:
                return f"{p.name}: a benchmark function has its name and size"
        return None

    def to_json(self) -> dict:
        return {**self.about, "bodies": sorted(self.bodies),
                "names": sorted(f"{name}:{size}" for name, size in self.named_sizes)}


def load_benchmarks(path: Path = FINGERPRINTS) -> Benchmarks:
    """The committed fingerprints; a missing or malformed file is a one-line error naming it."""
    try:
        data = json.loads(Path(path).read_text())
        named = {(entry.rsplit(":", 1)[0], int(entry.rsplit(":", 1)[1])) for entry in data["names"]}
        return Benchmarks(set(data["bodies"]), named, {k: v for k, v in data.items() if k not in ("bodies", "names")})
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the benchmark fingerprints ({exc.strerror}); "
                         "rebuild them with scripts/benchmark_fingerprints.py") from None
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        raise ValueError(f"{path}: not a benchmark fingerprint file (bodies, names)") from None
