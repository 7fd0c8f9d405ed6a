"""Finding seed candidates in someone else's code: public module-level functions that run on
their own.

A function is a candidate when it is:

- public and module-level: a `def` at the top of a module (not in a class, an `if` or a
  `try`), its name not starting with '_', not async, without decorators (a decorator may
  change what the name is bound to);
- 5 to 40 lines long (from `def` to its last line, docstring included);
- self-contained: every name it reads is a builtin, one it binds itself, or a name the
  module imports from a standard-library module the sandbox lets candidates import
  (`sandbox_importable`: not one it refuses, such as socket or subprocess, nor a private or
  GUI one; `doctests.needed_imports`: those imports travel with the code); no
  `global`/`nonlocal`, no import of another module (third-party or the package's own);
- free of what reads the world or the process: builtins such as `open`, `input`, `print`,
  `eval`, `id`, `hash`; modules such as `sys`, `time`, `shutil`, `tempfile`, `pathlib`; and `os`
  beyond its pure path helpers (`os.path`, `os.sep`, `os.fspath`...). A result that depends on
  the machine's files, clock or process says nothing a test could pin down, and would differ
  on the machine that trains.

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
from .doctests import module_imports, needed_imports
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
MAX_LITERALS = 12  # of each kind, per candidate
STAGES = ("functions", "sized", "self_contained")


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


def reads_the_world(node: ast.AST, needed: list[str]) -> bool:
    """Whether a function (its tree, the import lines it needs) uses an unfit builtin, a world
    module, or `os` beyond its pure helpers."""
    if any(isinstance(n, ast.Name) and n.id in UNFIT_BUILTINS for n in ast.walk(node)):
        return True
    os_names: set[str] = set()
    for line in needed:
        statement = ast.parse(line).body[0]
        modules = [a.name for a in statement.names] if isinstance(statement, ast.Import) else [statement.module or ""]
        if any(m.split(".")[0] in WORLD_MODULES for m in modules):
            return True
        if isinstance(statement, ast.ImportFrom) and statement.module == "os":
            if any(a.name not in OS_PURE for a in statement.names):
                return True
        elif isinstance(statement, ast.Import):
            os_names |= {a.asname or "os" for a in statement.names if a.name == "os" or a.name.startswith("os.")}
    return any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in os_names
               and n.attr not in OS_PURE for n in ast.walk(node))


def scan_file(path: Path, root: Path, source: str) -> FileScan:
    """The candidates of one file (none when it is not UTF-8 Python that parses)."""
    scan = FileScan()
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError, MemoryError, RecursionError):
        return scan
    relative = path.relative_to(root)
    future, imports = module_imports(tree, sandbox_importable)
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
        function = "\n".join(lines[node.lineno - 1:node.end_lineno]) + "\n"
        needed = needed_imports(function, imports, sandbox_importable)
        if needed is None or reads_the_world(node, needed):
            continue
        scan.counts["self_contained"] += 1
        if module_literals is None:
            module_literals = _literals(tree)
        prefix = "\n".join(future + needed)
        code = f"{prefix}\n\n\n{function}" if prefix else function
        own = _literals(node)
        scan.candidates.append(Candidate(source, str(relative), module_name(relative), node.name, node.lineno, code,
                                         tuple(future + needed), imports,
                                         _choose(own + [v for v in module_literals if v not in own])))
    return scan
