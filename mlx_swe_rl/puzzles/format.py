"""Puzzles as data: one YAML file per puzzle under `<root>/<tier>/<id>.yaml`.

Loading validates the schema and raises `PuzzleError` naming the file and the field.
Whether the code behaves (buggy fails, oracle passes) is checked by `checks.check_puzzles`,
which needs the sandbox.
"""

from __future__ import annotations

import ast
import difflib
import re
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import yaml

from .testplan import TestPlan, TestSyntaxError, plan_test

SPLITS = ("train", "heldout")
TIERS = ("easy", "medium", "hard")  # the bundled tiers; other sets may name their own
FIELDS = ("id", "tier", "split", "entry_point", "description", "buggy", "oracle", "tests", "timeout",
          "family", "mutation", "source", "hidden_tests")
# optional: timeout, the forge's family and mutation, the miner's source, and the split's hidden_tests
REQUIRED = FIELDS[:-5]
NAME = re.compile(r"^[a-z0-9_][a-z0-9_-]*$")
MAX_TIMEOUT = 60.0
BUNDLED_DIR = Path(__file__).resolve().parents[2] / "puzzles"


class PuzzleError(ValueError):
    """A puzzle file that does not follow the format; the message names file and field."""


@dataclass(frozen=True)
class Puzzle:
    id: str
    tier: str
    split: str
    entry_point: str
    description: str
    buggy: str
    oracle: str
    tests: tuple[str, ...]
    timeout: float | None = None
    family: str | None = None  # the forge's mutator family, for puzzles it made
    mutation: str | None = None  # the forge's one-line description of the change (never shown to a model)
    # Tests multi-turn repair's split never makes public (env.feedback.TestSplit): the only test that
    # catches the bug, or one whose public run cannot rebuild the state earlier tests leave.
    hidden_tests: tuple[int, ...] = ()
    # Provenance of a mined task (repository, commit, path, ...): plain strings and ints,
    # never shown to a model; not part of the puzzle's identity.
    source: dict[str, str | int] | None = field(default=None, compare=False)
    path: Path | None = field(default=None, compare=False)

    @cached_property
    def plans(self) -> list[TestPlan]:
        return [plan_test(t) for t in self.tests]


def code_lines(code: str) -> int:
    """Non-blank lines of a piece of code: the size a puzzle's prompt and its answer scale with."""
    return sum(1 for line in code.splitlines() if line.strip())


def default_puzzle_dir() -> Path:
    """The puzzles shipped with the project (next to the package in a source checkout)."""
    if BUNDLED_DIR.is_dir():
        return BUNDLED_DIR
    return Path.cwd() / "puzzles"


def parse_python(code: str) -> ast.Module:
    """`ast.parse` without the warnings it gives about the code: code a model or an old repository
    wrote ("1if x", an unknown escape such as "\\d": SyntaxWarning, or DeprecationWarning before
    Python 3.12) would print one per odd line. Raises SyntaxError or ValueError as `ast.parse` does."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return ast.parse(code)


def _top_level_names(code: str) -> set[str]:
    names: set[str] = set()
    for node in parse_python(code).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def defines(code: str, name: str) -> bool:
    """True when `code` parses and defines `name` at top level."""
    try:
        return name in _top_level_names(code)
    except (SyntaxError, ValueError):
        return False


def normal_form(code: str) -> str:
    """The code's syntax tree without docstrings, as text: two sources that differ only in
    docstrings, comments or formatting have the same normal form. Raises SyntaxError (or
    ValueError) when the code does not parse."""
    tree = parse_python(code)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree)


def check_fields(data: object, path: Path, fields: tuple[str, ...], required: tuple[str, ...]) -> dict:
    """The mapping of one YAML document, with no unknown key and every required one present."""
    if not isinstance(data, dict):
        raise PuzzleError(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (valid: {', '.join(fields)})"
            raise PuzzleError(f"{path}: {key}: unknown field{hint}")
    for key in required:
        if key not in data:
            raise PuzzleError(f"{path}: {key}: missing")
    return data


def check_strings(data: dict, path: Path, keys: tuple[str, ...]) -> None:
    for key in keys:
        if key in data and (not isinstance(data[key], str) or not data[key].strip()):
            raise PuzzleError(f"{path}: {key}: must be a non-empty string")


def check_id(data: dict, path: Path) -> None:
    if not NAME.match(data["id"]):
        raise PuzzleError(f"{path}: id: '{data['id']}' must use lowercase letters, digits, '_' and '-'")
    if data["id"] != path.stem:
        raise PuzzleError(f"{path}: id: '{data['id']}' must match the file name '{path.stem}'")
    if not data["entry_point"].isidentifier():
        raise PuzzleError(f"{path}: entry_point: '{data['entry_point']}' is not a Python name")


def check_code(data: dict, path: Path, key: str) -> None:
    """`data[key]` parses and defines the entry point."""
    try:
        ast.parse(data[key])
    except SyntaxError as exc:
        raise PuzzleError(f"{path}: {key}: line {exc.lineno}: {exc.msg}") from None
    if not defines(data[key], data["entry_point"]):
        raise PuzzleError(f"{path}: {key}: does not define entry_point '{data['entry_point']}'")


def check_tests(data: dict, path: Path, allow_empty: bool = False) -> tuple[str, ...]:
    """The tests as a tuple; an empty list only with `allow_empty` (a task without tests,
    which trains on rewards that need none)."""
    tests = data["tests"]
    if not isinstance(tests, list) or not (tests or allow_empty) \
            or not all(isinstance(t, str) and t.strip() for t in tests):
        kind = "list" if allow_empty else "non-empty list"
        raise PuzzleError(f"{path}: tests: must be a {kind} of code strings")
    for i, test in enumerate(tests):
        try:
            plan_test(test)
        except TestSyntaxError as exc:
            raise PuzzleError(f"{path}: tests[{i}]: {exc}") from None
    return tuple(tests)


def check_hidden_tests(data: dict, path: Path, tests: tuple[str, ...]) -> tuple[int, ...]:
    """The optional `hidden_tests`: distinct indices of tests, sorted."""
    hidden = data.get("hidden_tests")
    if hidden is None:
        return ()
    if not isinstance(hidden, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in hidden):
        raise PuzzleError(f"{path}: hidden_tests: must be a list of test indices")
    for i in hidden:
        if not 0 <= i < len(tests):
            raise PuzzleError(f"{path}: hidden_tests: {i} is not the index of a test (0 to {len(tests) - 1})")
    if len(set(hidden)) != len(hidden):
        raise PuzzleError(f"{path}: hidden_tests: an index is listed twice")
    return tuple(sorted(hidden))


def check_timeout(data: dict, path: Path) -> float | None:
    timeout = data.get("timeout")
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT:
        raise PuzzleError(f"{path}: timeout: {timeout!r} must be a number of seconds in (0, {MAX_TIMEOUT:g}]")
    return float(timeout)


def check_source(data: dict, path: Path) -> dict[str, str | int] | None:
    """The optional provenance mapping: string keys, plain string or integer values."""
    source = data.get("source")
    if source is None:
        return None
    if not isinstance(source, dict):
        raise PuzzleError(f"{path}: source: must be a mapping of names to strings or integers")
    for key, value in source.items():
        if not isinstance(key, str) or not key.strip():
            raise PuzzleError(f"{path}: source: key {key!r} must be a non-empty string")
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise PuzzleError(f"{path}: source.{key}: {type(value).__name__} value; must be a string or an integer")
    return dict(source)


def parse_puzzle(data: object, path: Path) -> Puzzle:
    """Validate one loaded YAML document and build the Puzzle."""
    data = check_fields(data, path, FIELDS, REQUIRED)
    check_strings(data, path, ("id", "tier", "split", "entry_point", "description", "buggy", "oracle",
                               "family", "mutation"))
    check_id(data, path)
    if data["tier"] != path.parent.name:
        raise PuzzleError(f"{path}: tier: '{data['tier']}' must match the folder name '{path.parent.name}'")
    if data["split"] not in SPLITS:
        raise PuzzleError(f"{path}: split: '{data['split']}' must be one of {', '.join(SPLITS)}")
    if "family" in data and not NAME.match(data["family"]):
        raise PuzzleError(f"{path}: family: '{data['family']}' must use lowercase letters, digits, '_' and '-'")
    for key in ("buggy", "oracle"):
        check_code(data, path, key)
    tests = check_tests(data, path, allow_empty=True)
    return Puzzle(
        id=data["id"], tier=data["tier"], split=data["split"], entry_point=data["entry_point"],
        description=data["description"].strip(), buggy=data["buggy"], oracle=data["oracle"],
        tests=tests, timeout=check_timeout(data, path), family=data.get("family"), mutation=data.get("mutation"),
        source=check_source(data, path), hidden_tests=check_hidden_tests(data, path, tests), path=path,
    )


def read_yaml(path: Path) -> object:
    """One YAML document, or PuzzleError naming the file."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise PuzzleError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PuzzleError(f"{path}: cannot read: {exc}") from None


def load_puzzle(path: Path) -> Puzzle:
    return parse_puzzle(read_yaml(path), path)


def puzzle_files(root: Path) -> list[Path]:
    """Puzzle files under `root` (a set directory with tier folders, or one tier folder)."""
    root = Path(root)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise PuzzleError(f"{root}: no such puzzle directory")
    return sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())


def load_puzzles(root: Path | None = None, tiers: list[str] | None = None, split: str = "all") -> list[Puzzle]:
    """Load and validate every puzzle under `root`, optionally filtered by tier and split.
    Puzzles are ordered by tier (easy, medium, hard, then others) and id."""
    root = Path(root) if root is not None else default_puzzle_dir()
    files = puzzle_files(root)
    if not files:
        raise PuzzleError(f"{root}: no puzzle files (*.yaml) found")
    puzzles = [load_puzzle(p) for p in files]
    seen: dict[str, Path] = {}
    for p in puzzles:
        if p.id in seen:
            raise PuzzleError(f"{p.path}: id: '{p.id}' is also used by {seen[p.id]}")
        seen[p.id] = p.path
    order = {t: i for i, t in enumerate(TIERS)}
    return filter_puzzles(sorted(puzzles, key=lambda p: (order.get(p.tier, len(TIERS)), p.tier, p.id)), tiers, split)


def filter_puzzles(puzzles: list[Puzzle], tiers: list[str] | None = None, split: str = "all") -> list[Puzzle]:
    """The puzzles of the given tiers (None = all) and split, in their given order."""
    if split not in ("all", *SPLITS):
        raise PuzzleError(f"split: '{split}' must be one of all, {', '.join(SPLITS)}")
    return [p for p in puzzles if (tiers is None or p.tier in tiers) and split in ("all", p.split)]
