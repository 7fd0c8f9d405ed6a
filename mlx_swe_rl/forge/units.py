"""A Python module seen as functions: each module-level function and method (qualified name,
line span with its decorators) and the text around them.

This is how the miner tells "one function changed" from everything else: two versions of a
file differ in exactly one function when they have the same functions, the same text outside
them, and exactly one function whose lines differ.
"""

from __future__ import annotations

import ast
import gc
from dataclasses import dataclass
from typing import Any, Callable

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass(frozen=True)
class Unit:
    key: str  # the qualified name, with "#2", "#3" for later definitions of the same name
    qualname: str  # "name" or "Class.method" (nested classes too: "Outer.Inner.method")
    name: str
    start: int  # first line (the first decorator's), 1-based
    end: int  # last line
    in_class: bool


@dataclass(frozen=True)
class Module:
    """One version of a file: its lines, its functions, and what `summarise` took from its
    tree (the tree itself is not kept: a large file's tree is hundreds of thousands of
    objects)."""

    lines: list[str]
    units: dict[str, Unit]
    extra: Any = None

    def segment(self, key: str) -> list[str]:
        unit = self.units[key]
        return self.lines[unit.start - 1:unit.end]

    def outside(self) -> list[str]:
        """The lines outside every function, each function's span standing as one marker line
        (so adding, removing, moving or editing code between functions shows)."""
        spans = sorted(self.units.values(), key=lambda u: u.start)
        out, line = [], 1
        for unit in spans:
            out += self.lines[line - 1:unit.start - 1]
            out.append(f"\x00{unit.key}")
            line = unit.end + 1
        return out + self.lines[line - 1:]

    def code(self, key: str) -> str:
        """The function's source alone, dedented by its own indentation (a method reads as a
        module-level function)."""
        lines = self.segment(key)
        indent = lines[0][:len(lines[0]) - len(lines[0].lstrip())]
        # Only lines that carry the indentation lose it: the others are blank or inside a
        # multi-line string, whose text must not change.
        body = [line[len(indent):] if line.startswith(indent) else line for line in lines]
        return "\n".join(body).rstrip() + "\n"


def source_lines(text: str) -> list[str]:
    """Lines as the parser counts them (\\n, \\r\\n and \\r end a line; form feeds do not)."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def parse_module(source: bytes, summarise: Callable[[ast.Module], Any] | None = None) -> Module | None:
    """The module of a file's bytes, or None when it is not UTF-8 Python that parses.
    `summarise(tree)` is kept as `extra`."""
    try:
        text = source.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        return None
    lines = source_lines(text)
    # The parser makes many objects and no reference cycles: with the collector running,
    # it would scan them over and over (parsing a 5,000-line file took 4x as long).
    enabled = gc.isenabled()
    gc.disable()
    try:
        tree = ast.parse("\n".join(lines))
        return Module(lines, find_units(tree), summarise(tree) if summarise else None)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    finally:
        if enabled:
            gc.enable()


def find_units(tree: ast.Module) -> dict[str, Unit]:
    """Module-level functions and the methods of module-level classes (nested classes
    included), by key. Functions inside functions belong to the outer function; functions
    inside `if`/`try` blocks are module code, not units."""
    found: dict[str, Unit] = {}

    def visit(body: list[ast.stmt], prefix: str, in_class: bool) -> None:
        for node in body:
            if isinstance(node, FUNCTIONS):
                qualname = prefix + node.name
                key, n = qualname, 1
                while key in found:
                    n += 1
                    key = f"{qualname}#{n}"
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                found[key] = Unit(key, qualname, node.name, start, node.end_lineno or node.lineno, in_class)
            elif isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.", True)

    visit(tree.body, "", False)
    return found
