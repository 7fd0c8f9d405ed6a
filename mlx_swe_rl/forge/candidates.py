"""Finding seed candidates in someone else's code: public module-level functions that run on
their own.

A function is a candidate when it is:

- public and module-level: a `def` at the top of a module (not in a class, an `if` or a
  `try`), its name not starting with '_', not async, without decorators (a decorator may
  change what the name is bound to);
- 5 to 40 lines long (from `def` to its last line, docstring included);
- self-contained: every name it reads is a builtin, one it binds itself, a name the module
  imports from a standard-library module the sandbox lets candidates import
  (`sandbox_importable`: not one it refuses, such as socket or subprocess, nor a private or
  GUI one; those imports travel with the code), or a helper of
  its module that is self-contained in the same sense: a function, class or constant the
  module binds once at its top level (`module_definitions`). The helpers travel with it, in
  their module's order, up to `max_helper_lines` lines together: most real functions call a
  private helper or read a module constant, and without them only one in five would count.
  No `global`/`nonlocal`, no import of another module (third-party or the package's own);
- free of what reads the world or the process: builtins such as `open`, `input`, `print`,
  `eval`, `id`, `hash`; modules such as `sys`, `time`, `shutil`, `tempfile`, `pathlib`; `os`
  beyond its pure path helpers (`os.path`, `os.sep`, `os.fspath`...); and `random` beyond
  `Random` (its module-level functions draw from the process's generator). A result that
  depends on the machine's files, clock or process says nothing a test could pin down, and
  would differ on the machine that trains, or from one run to the next.

Each candidate carries the literals of its body and its module (small ints, floats and short
strings), from which `recorded` chooses inputs.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..sandbox.worker import NO_PRELOAD, REFUSED, listed
from .doctests import free_names, module_imports
from .sources import slug

MIN_LINES, MAX_LINES = 5, 40
UNFIT_BUILTINS = frozenset(("open", "input", "print", "exec", "eval", "compile", "__import__", "globals", "locals",
                            "vars", "id", "hash", "breakpoint", "help", "exit", "quit", "memoryview", "super"))
WORLD_MODULES = frozenset(("sys", "time", "platform", "getpass", "pwd", "grp", "shutil", "glob", "tempfile", "locale",
                           "resource", "signal", "threading", "site", "sysconfig", "importlib", "inspect", "gc",
                           "pathlib", "io", "mmap", "select", "fcntl", "termios", "tty", "pty", "uuid", "secrets",
                           "sched", "zoneinfo", "mimetypes", "netrc", "pkgutil", "runpy", "faulthandler", "tracemalloc"))
OS_PURE = frozenset(("path", "sep", "altsep", "curdir", "pardir", "extsep", "pathsep", "linesep", "devnull", "name",
                     "fspath", "fsencode", "fsdecode", "PathLike"))
# Modules only part of which is fit: the names of each that do not read the world. `random`'s
# module-level functions draw from the process's generator (a recorded output would not repeat);
# a `Random(seed)` the function makes or is given does repeat.
PURE_PARTS = {"os": OS_PURE, "random": frozenset(("Random",))}
MAX_LITERALS = 12  # of each kind, per candidate
MAX_HELPER_LINES = 40  # the carried helpers' lines, all together: the puzzle stays readable
STAGES = ("functions", "sized", "self_contained", "with_helpers")  # with_helpers: of self_contained


@dataclass(frozen=True)
class Candidate:
    source: str  # the source's name
    path: str  # the file, relative to the source's root
    module: str  # dotted module name ("email.utils")
    name: str
    line: int  # where the def starts in the file
    code: str  # the imports it needs, then the function
    carried: tuple[str, ...]  # those import lines (and the module's `from __future__` lines)
    imports: dict[str, str]  # every allowed import of its module: {bound name: import line}
    literals: tuple = ()  # ints, floats and strings from its body first, then its module
    helpers: tuple[str, ...] = ()  # the module's functions, classes and constants carried along

    @property
    def seed_id(self) -> str:
        return f"{self.source}__{slug(self.module)}__{slug(self.name)}"


@dataclass
class FileScan:
    """What one file gave: its candidates, and how many functions passed each stage."""

    candidates: list[Candidate] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)


def sandbox_importable(module: str) -> bool:
    """A standard-library module every sandboxed run can import (the worker preloads it)."""
    top = module.split(".")[0]
    return (top in sys.stdlib_module_names and not top.startswith("_") and top not in NO_PRELOAD
            and listed(module, REFUSED) is None)


def module_name(relative: Path) -> str:
    parts = list(relative.with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) or relative.stem


def _literals(tree: ast.AST) -> list:
    """Small literals in source order, without repeats: ints (|n| <= 1000), finite floats and
    printable strings of 1 to 20 characters (never docstrings: they hold prose)."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found: list = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in docstrings:
            continue
        value = node.value
        fits = ((type(value) is int and abs(value) <= 1000) or (type(value) is float and abs(value) < 1e6)
                or (type(value) is str and 0 < len(value) <= 20 and value.isprintable()))
        if fits and not any(type(v) is type(value) and v == value for v in found):
            found.append(value)
    return found


def _choose(values: list) -> tuple:
    """At most MAX_LITERALS of each type, in order."""
    kept: list = []
    for kind in (int, float, str):
        kept += [v for v in values if type(v) is kind][:MAX_LITERALS]
    return tuple(kept)


def _top_level_bindings(node: ast.stmt) -> list[str]:
    """The module-level names one top-level statement binds (a compound statement's nested
    bindings count: a name bound under an `if` or `try` has a binding that depends on the run)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    names = []
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and not isinstance(child.ctx, ast.Load):
            names.append(child.id)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(child.name)
        elif isinstance(child, (ast.Import, ast.ImportFrom)):
            names += [a.asname or a.name.split(".")[0] for a in child.names]
    return names


def module_definitions(tree: ast.Module) -> dict[str, ast.stmt]:
    """{name: statement} for the names the module binds exactly once, at its top level, by a
    `def`, a `class` or a plain assignment (`NAME = ...`, `NAME: T = ...`). A name bound twice,
    or also imported, is left out: which binding a function sees would depend on the order."""
    counts: Counter = Counter()
    single: dict[str, ast.stmt] = {}
    for node in tree.body:
        names = _top_level_bindings(node)
        counts.update(names)
        simple = (isinstance(node, (ast.FunctionDef, ast.ClassDef))
                  or (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name))
                  or (isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name)))
        if simple:
            single[names[0]] = node
    return {name: node for name, node in single.items() if counts[name] == 1}


def first_line(node: ast.stmt) -> int:
    """Where a statement's text starts: its first decorator, else itself."""
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def carried(node: ast.FunctionDef, imports: dict[str, str], definitions: dict[str, ast.stmt],
            max_helper_lines: int) -> tuple[list[str], dict[str, ast.stmt]] | None:
    """The import lines and the module helpers (in module order) that `node` needs to run on
    its own, helpers' needs included; None when a name is none of builtins, its own, allowed
    imports or helpers, or the helpers are longer than `max_helper_lines` together."""
    needed: set[str] = set()
    helpers: dict[str, ast.stmt] = {}
    todo: list[ast.stmt] = [node]
    while todo:
        free = free_names(todo.pop(), sandbox_importable)
        if free is None:
            return None
        for name in sorted(free):
            if name in imports:
                needed.add(imports[name])
            elif name == node.name or name in helpers:
                continue  # recursion, or a helper already carried
            elif name in definitions and max_helper_lines > 0:
                helpers[name] = definitions[name]
                todo.append(definitions[name])
            else:
                return None
    if sum((h.end_lineno or h.lineno) - first_line(h) + 1 for h in helpers.values()) > max_helper_lines:
        return None
    return sorted(needed), dict(sorted(helpers.items(), key=lambda item: first_line(item[1])))


def reads_the_world(node: ast.AST, needed: list[str]) -> bool:
    """Whether a function (its tree, the import lines it needs) uses an unfit builtin, a world
    module, or a name of `os` or `random` beyond their pure parts (PURE_PARTS)."""
    if any(isinstance(n, ast.Name) and n.id in UNFIT_BUILTINS for n in ast.walk(node)):
        return True
    bound: dict[str, frozenset[str]] = {}  # a name the module binds to a partly fit module -> its fit names
    for line in needed:
        statement = ast.parse(line).body[0]
        modules = [a.name for a in statement.names] if isinstance(statement, ast.Import) else [statement.module or ""]
        if any(m.split(".")[0] in WORLD_MODULES for m in modules):
            return True
        if isinstance(statement, ast.ImportFrom) and statement.module in PURE_PARTS:
            if any(a.name not in PURE_PARTS[statement.module] for a in statement.names):
                return True
        elif isinstance(statement, ast.Import):
            for a in statement.names:
                top = a.name.split(".")[0]
                if top in PURE_PARTS:
                    bound[a.asname or top] = PURE_PARTS[top]
    return any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in bound
               and n.attr not in bound[n.value.id] for n in ast.walk(node))


def scan_file(path: Path, root: Path, source: str, max_helper_lines: int = MAX_HELPER_LINES) -> FileScan:
    """The candidates of one file (none when it is not UTF-8 Python that parses); each may
    carry helpers of its module up to `max_helper_lines` lines (0: none)."""
    scan = FileScan()
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError, MemoryError, RecursionError):
        return scan
    relative = path.relative_to(root)
    future, imports = module_imports(tree, sandbox_importable)
    definitions = module_definitions(tree)
    lines = text.splitlines()
    module_literals: list | None = None
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        scan.counts["functions"] += 1
        span = (node.end_lineno or node.lineno) - node.lineno + 1
        if node.decorator_list or not MIN_LINES <= span <= MAX_LINES:
            continue
        scan.counts["sized"] += 1
        found = carried(node, imports, definitions, max_helper_lines)
        if found is None or any(reads_the_world(n, found[0]) for n in (node, *found[1].values())):
            continue
        needed, helpers = found
        scan.counts["self_contained"] += 1
        scan.counts["with_helpers"] += bool(helpers)
        if module_literals is None:
            module_literals = _literals(tree)
        parts = ["\n".join(future + needed)] if future or needed else []
        parts += ["\n".join(lines[first_line(n) - 1:n.end_lineno]) for n in (*helpers.values(), node)]
        code = "\n\n\n".join(parts) + "\n"
        own = _literals(node)
        scan.candidates.append(Candidate(source, str(relative), module_name(relative), node.name, node.lineno, code,
                                         tuple(future + needed), imports,
                                         _choose(own + [v for v in module_literals if v not in own]),
                                         tuple(helpers)))
    return scan
