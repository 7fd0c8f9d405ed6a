"""Tests from recorded outputs: call the original function on chosen inputs, in the sandbox,
and write what it returned as asserts (`assert name(ARGS) == VALUE`).

How inputs are chosen. Only the required positional parameters get values (those with
defaults keep them; a function with a required keyword-only parameter gets none); a function
whose positional parameters all have defaults gets values for its first two. Each
parameter's kind comes from its annotation (`int`, `str`, `list[int]`, `Sequence`...), else
its name (`n`, `count` -> int; `s`, `text` -> str; `items`, `seq` -> list...),
else its default's type (`sep=','` -> str), else "any". A kind has a fixed pool of small values (empty and one-element collections,
zero and negatives, mixed-case and punctuated strings), led by the literals of the same type
found in the function's body and then its module: a function that compares with 'utf-8' or
64 is called with them. Since a guess from a name is often wrong, a few calls
are made under each of several guesses (as hinted; all ints; all floats; all strings; a list
and ints; a string and ints; anything: `hypotheses`), walking the pools in step; the rest are
drawn from the first guess's pools by a generator seeded with the harvest's seed and the seed
id: the same harvest, the same inputs.

What is kept. Every call is made twice, in two sandbox children; a call is kept when it
returned the same plain value both times (numbers, strings, bytes, None and containers of them,
whose `repr` reads back as a literal of at most `MAX_REPR` characters). Calls that raise, time
out or return objects are dropped. A function needs `min_tests` kept calls with at least two
different results (a function that always returns None tests nothing); at most `max_tests`
are written, spread over the different results.
"""

from __future__ import annotations

import ast
import random
from collections import defaultdict
from dataclasses import dataclass

from ..sandbox.pool import Limits, Sandbox
from ..sandbox.verdict import decode, same_value
from .doctests import is_plain

MAX_REPR = 200  # characters of an expected value's literal
ATTEMPTS = 40  # calls tried per function
CHUNK = 8  # calls per sandbox job: a call that hangs loses only its chunk's later calls
MAX_OPTIONAL = 2  # parameters given values when every positional one has a default

POOLS: dict[str, list] = {
    "int": [0, 1, 2, 3, 7, -1, 10, 42, 100, -5],
    "float": [0.0, 0.5, 1.0, 2.5, -1.5, 3.25, 100.0],
    "str": ["", "a", "abc", "Hello, World!", "  two  words ", "a-b_c.d", "123", "MiXeD", "x\ny", "%s=%d"],
    "bool": [True, False],
    "bytes": [b"", b"abc", b"\x00\xffA", b"hello world"],
    "list": [[], [1], [3, 1, 2], [1, 2, 2, 3, 5], [-4, 0, 9, 9], ["b", "a", "c"], [2.5, -1.0], [[1, 2], [3]]],
    "tuple": [(), (1,), (3, 1, 2), (1, "a"), ("x", "y")],
    "dict": [{}, {"a": 1}, {"a": 1, "b": 2}, {1: "x", 2: "y"}],
    "set": [set(), {1}, {1, 2, 3}],
}
POOLS["any"] = [v for kind in ("int", "str", "list", "float", "tuple") for v in POOLS[kind][:4]]
ANNOTATIONS = {"int": "int", "float": "float", "complex": "float", "str": "str", "bool": "bool", "bytes": "bytes",
               "bytearray": "bytes", "list": "list", "List": "list", "Sequence": "list", "Iterable": "list",
               "Iterator": "list", "Collection": "list", "tuple": "tuple", "Tuple": "tuple", "dict": "dict",
               "Dict": "dict", "Mapping": "dict", "set": "set", "Set": "set", "frozenset": "set",
               "AbstractSet": "set"}
NAME_HINTS = {
    "int": ("n", "i", "j", "k", "m", "count", "num", "size", "width", "height", "index", "idx", "start", "stop", "end",
            "step", "level", "depth", "length", "number", "digits", "pos", "position", "offset", "year", "month", "day",
            "base", "limit", "bits", "nbytes", "precision", "indent", "times", "code"),
    "float": ("x", "y", "z", "value", "val", "ratio", "angle", "weight", "alpha"),
    "str": ("s", "text", "string", "name", "word", "line", "prefix", "suffix", "sep", "char", "ch", "pattern",
            "path", "url", "fmt", "format", "key", "label", "title", "message", "msg", "src", "source", "data_str",
            "filename", "encoding", "mode", "tag", "token", "chars", "delimiter", "header", "host"),
    "list": ("items", "seq", "sequence", "iterable", "lst", "values", "xs", "nums", "numbers", "elements", "array",
             "arr", "data", "lines", "args", "parts", "pairs", "points", "objs", "vector", "row"),
    "dict": ("mapping", "dct", "dictionary", "kwargs", "options", "table", "env", "headers"),
    "bool": ("flag", "strict", "reverse", "verbose", "force", "enabled"),
    "bytes": ("buf", "buffer", "raw", "payload", "octets"),
}
KIND_OF_NAME = {name: kind for kind, names in NAME_HINTS.items() for name in names}


@dataclass(frozen=True)
class RecordSettings:
    seed: int = 0
    min_tests: int = 3
    max_tests: int = 8
    timeout: float = 2.0  # seconds per sandbox job of CHUNK calls


@dataclass(frozen=True)
class Parameter:
    name: str
    kind: str  # a key of POOLS


def annotation_kind(node: ast.expr | None) -> str | None:
    """The pool an annotation asks for: `list[int]`, `typing.Sequence`, `'str'` all count."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(node, ast.Subscript):
        node = node.value
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    return ANNOTATIONS.get(name or "")


def default_kind(node: ast.expr | None) -> str | None:
    """The pool a parameter's default value asks for (`n=3`: int, `sep=','`: str)."""
    if not isinstance(node, ast.Constant) or node.value is None:
        return None
    return {int: "int", float: "float", str: "str", bool: "bool", bytes: "bytes"}.get(type(node.value))


def required_parameters(code: str, name: str) -> list[Parameter] | None:
    """The function's required positional parameters with their kinds; None when it cannot
    be called with positional values alone (a required keyword-only parameter) or takes none.
    A function whose positional parameters all have defaults gets values for the first
    `MAX_OPTIONAL` of them, kinds also read from the defaults: called with none, it would
    return one value, which tests nothing."""
    node = next((n for n in ast.parse(code).body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if node is None:
        return None
    args = node.args
    if any(default is None for default in args.kw_defaults):
        return None
    positional = args.posonlyargs + args.args
    required = positional[:len(positional) - len(args.defaults)]
    defaults: list[ast.expr | None] = [None] * len(required)
    if not required:
        required, defaults = positional[:MAX_OPTIONAL], list(args.defaults[:MAX_OPTIONAL])
    if not required:
        return None
    return [Parameter(a.arg, annotation_kind(a.annotation) or KIND_OF_NAME.get(a.arg.lower().strip("_"))
                      or default_kind(default) or "any")
            for a, default in zip(required, defaults)]


def value_pool(kind: str, literals: tuple) -> list:
    """The values a parameter of `kind` is tried with: its literals of that type first."""
    wanted = {"int": (int,), "float": (float, int), "str": (str,), "any": (int, str)}.get(kind, ())
    found = [v for v in literals if type(v) in wanted]
    pool = found + [v for v in POOLS[kind] if not any(type(v) is type(f) and v == f for f in found)]
    return pool


def hypotheses(parameters: list[Parameter]) -> list[list[str]]:
    """The kinds to try the parameters with, best guess first: as hinted, then every parameter
    an int, a float, a string, a list and the rest ints, a string and the rest ints, anything.
    A guess is often wrong (`bisect(a, x)` says nothing); a wrong one only costs calls."""
    n = len(parameters)
    guesses = [[p.kind for p in parameters], ["int"] * n, ["float"] * n, ["str"] * n,
               ["list"] + ["int"] * (n - 1), ["str"] + ["int"] * (n - 1), ["any"] * n]
    unique: list[list[str]] = []
    for guess in guesses:
        if guess not in unique:
            unique.append(guess)
    return unique


def argument_lists(parameters: list[Parameter], literals: tuple, rng: random.Random, attempts: int = ATTEMPTS) -> list[str]:
    """Up to `attempts` distinct argument lists as source text ("3, 'abc'"): for each guess of
    the parameters' kinds in turn, its pools walked in step (each parameter a step further along
    its pool: clamp(0, 1, 2), not clamp(0, 0, 0)), then seeded draws from the first guess."""
    guesses = [[value_pool(kind, literals) for kind in guess] for guess in hypotheses(parameters)]
    per_guess = max(3, attempts // (2 * len(guesses)))
    seen: dict[str, None] = {}
    for pools in guesses:
        for i in range(min(per_guess, max(len(pool) for pool in pools))):
            seen[", ".join(repr(pool[(i + j) % len(pool)]) for j, pool in enumerate(pools))] = None
    for _ in range(attempts * 4):
        if len(seen) >= attempts:
            break
        seen[", ".join(repr(rng.choice(pool)) for pool in guesses[0])] = None
    return list(seen)[:attempts]


def stable_repr(value: object) -> str:
    """`repr`, with the elements of every set and the items of every dict in sorted order: a
    set's order is its process's (string hashes are salted per process), so each harvest would
    write the same recorded value differently. Equal values, equal texts."""
    if isinstance(value, (set, frozenset)) and value:
        body = "{" + ", ".join(sorted(stable_repr(v) for v in value)) + "}"
        return body if type(value) is set else f"frozenset({body})"
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(f"{stable_repr(k)}: {stable_repr(v)}" for k, v in value.items())) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(stable_repr(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(stable_repr(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def literal_of(value: object) -> str | None:
    """The value's repr (`stable_repr`) when it is plain data that reads back as itself, short
    enough."""
    if not is_plain(value):
        return None
    text = stable_repr(value)
    if len(text) > MAX_REPR:
        return None
    try:
        back = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return text if same_value(back, value) else None


def _values(run) -> dict[int, object]:
    """{call index: decoded value} for the calls of one job that returned."""
    return {i: decode(line["values"][0]) for i, line in run.tests.items()
            if "error" not in line and line.get("values")}


@dataclass(frozen=True)
class Recording:
    """What recording found for one function: its tests, or why it has none."""

    tests: tuple[str, ...]
    calls: int  # argument lists tried
    returned: int  # calls that returned the same plain value twice
    problem: str = ""


def choose_tests(name: str, calls: list[tuple[str, str]], settings: RecordSettings) -> Recording:
    """The asserts for kept (arguments, literal) calls, spread over the different results."""
    by_result: dict[str, list[str]] = defaultdict(list)
    for args, literal in calls:
        by_result[literal].append(args)
    if len(calls) < settings.min_tests:
        return Recording((), 0, len(calls), f"{len(calls)} calls returned plain values the same way twice")
    if len(by_result) < 2:
        return Recording((), 0, len(calls), "every call returned the same value")
    chosen: list[str] = []
    queues = [(literal, list(args)) for literal, args in by_result.items()]
    while len(chosen) < settings.max_tests and any(q for _, q in queues):
        for literal, queue in queues:
            if queue and len(chosen) < settings.max_tests:
                chosen.append(f"assert {name}({queue.pop(0)}) == {literal}")
    return Recording(tuple(chosen), 0, len(calls))


def record_tests(functions: list[tuple[str, str, str, tuple]], sandbox: Sandbox,
                 settings: RecordSettings = RecordSettings()) -> dict[str, Recording]:
    """Recorded tests for (key, code, entry point, literals) functions, by key. All calls of
    all functions run in one batch of sandbox jobs, each job twice."""
    plans: dict[str, tuple[str, list[str]]] = {}
    found: dict[str, Recording] = {}
    for key, code, name, literals in functions:
        try:
            parameters = required_parameters(code, name)
        except (SyntaxError, ValueError):
            parameters = None
        if parameters is None:
            found[key] = Recording((), 0, 0, "no positional parameters to give values to")
            continue
        rng = random.Random(f"{settings.seed}:{key}")
        plans[key] = (name, argument_lists(parameters, literals, rng))
    jobs, owners = [], []
    limits = Limits(timeout=settings.timeout, memory_mb=512)
    for key, code, name, _ in functions:
        if key not in plans:
            continue
        args = plans[key][1]
        for start in range(0, len(args), CHUNK):
            steps = [[["probe", f"{name}({a})"]] for a in args[start:start + CHUNK]]
            for _ in range(2):
                jobs.append((code, steps, limits))
                owners.append((key, start))
    runs = sandbox.run_many(jobs)
    kept: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for i in range(0, len(runs), 2):
        key, start = owners[i]
        first, second = _values(runs[i]), _values(runs[i + 1])
        for index, value in first.items():
            literal = literal_of(value)
            if literal is not None and index in second and literal_of(second[index]) == literal:
                kept[key].append((plans[key][1][start + index], literal))
    for key, (name, args) in plans.items():
        recording = choose_tests(name, kept[key], settings)
        found[key] = Recording(recording.tests, len(args), recording.returned, recording.problem)
    return found
