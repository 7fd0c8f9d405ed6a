"""forge.mutators: the single-site AST mutants that become candidate bug-fix puzzles."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mlx_swe_rl.forge.mutators import FAMILIES, Mutant, mutants

ROOT = Path(__file__).resolve().parents[1]

# A realistic seed: loop, range, slices, if/else, accumulators, an early return, a docstring.
WINDOW = '''\
import math

def best_window(xs, k):
    """Return (start, best sum * 2 // k) of the best window of length k; 1 + 1 stays."""
    if not xs or k > len(xs):
        return None
    best = xs[0]
    start = 0
    total = sum(xs[:k])
    found = False
    for i in range(k, len(xs)):
        total += xs[i] - xs[i - k]
        if total > best and i % 2 == 0:
            best = total
            start = i - k + 1
        else:
            continue
    return start, best * 2 // k
'''


def src(text: str) -> str:
    """Source written as an indented triple-quoted block."""
    return textwrap.dedent(text).lstrip("\n")


def unparsed(text: str) -> str:
    """What ast.unparse makes of an indented block: the expected code of a mutant."""
    return src(text).rstrip("\n")


def codes(code: str, family: str) -> list[str]:
    return [m.code for m in mutants(code, [family])]


def changed_lines(found: list[Mutant]) -> list[str]:
    """The mutated line of each mutant (mutants keep the line structure of these sources)."""
    return [m.code.splitlines()[m.line - 1].strip() for m in found]


# --------------------------------------------------------------------------- one family at a time
def test_arith_op():
    assert codes("def f(a, b):\n    return a + b\n", "arith_op") == ["def f(a, b):\n    return a - b"]
    found = mutants("def f(a, b):\n    return a * b + 'x' * 2 + (a % b)\n", ["arith_op"])
    assert changed_lines(found) == [
        "return a * b + 'x' * 2 - a % b",
        "return a * b - 'x' * 2 + a % b",
        "return a // b + 'x' * 2 + a % b",
        "return a / b + 'x' * 2 + a % b",
        "return a * b + 'x' * 2 + a // b",  # 'x' * 2 is string repetition: left alone
    ]
    assert found[2].description == "line 2: '*' -> '//' in 'a * b'"
    assert found[0].family == "arith_op" and found[0].line == 2


def test_compare_flip():
    assert codes("def f(a, b, s):\n    return a < b and a in s and a is not None\n", "compare_flip") == [
        "def f(a, b, s):\n    return a <= b and a in s and (a is not None)",
        "def f(a, b, s):\n    return a > b and a in s and (a is not None)",
        "def f(a, b, s):\n    return a < b and a not in s and (a is not None)",
        "def f(a, b, s):\n    return a < b and a in s and (a is None)",
    ]
    found = mutants("def f(n, best):\n    if n >= best:\n        return n\n", ["compare_flip"])
    assert [m.description for m in found] == [
        "line 2: '>=' -> '>' in 'n >= best'", "line 2: '>=' -> '<=' in 'n >= best'"]
    assert codes("def f(s):\n    return s == ''\n", "compare_flip") == ["def f(s):\n    return s != ''"]


def test_bool_op():
    assert codes("def f(a, b, c):\n    return a and (b or c)\n", "bool_op") == [
        "def f(a, b, c):\n    return a or (b or c)",
        "def f(a, b, c):\n    return a and (b and c)",
    ]


def test_negation():
    code = src("""
        def f(a, done):
            while not done:
                done = True
            if a > 0:
                return a
            return a < 0
    """)
    found = mutants(code, ["negation"])
    assert changed_lines(found) == ["while done:", "if not a > 0:", "return not a < 0"]
    assert [m.line for m in found] == [2, 4, 6]
    assert found[1].description == "line 4: 'a > 0' -> 'not a > 0' in 'if a > 0:'"
    assert found[1].code == unparsed("""
        def f(a, done):
            while not done:
                done = True
            if not a > 0:
                return a
            return a < 0
    """)


def test_off_by_one_const():
    code = src("""
        def f(a):
            if a == -1:
                return True
            return a * 10
    """)
    found = mutants(code, ["off_by_one_const"])
    assert changed_lines(found) == ["if a == 0:", "if a == -2:", "return a * 11", "return a * 9"]  # True is no int
    assert found[2].description == "line 4: '10' -> '11' in 'return a * 10'"


def test_range_bounds():
    code = src("""
        def f(n, xs):
            for i in range(n):
                xs.append(i)
            return [j for j in range(1, n - 1)]
    """)
    found = mutants(code, ["range_bounds"])
    assert changed_lines(found) == [
        "for i in range(1, n):",
        "for i in range(n + 1):",
        "for i in range(n - 1):",
        "return [j for j in range(2, n - 1)]",
        "return [j for j in range(0, n - 1)]",
        "return [j for j in range(1, n)]",  # n - 1 + 1 folds back to n
        "return [j for j in range(1, n - 2)]",
    ]
    assert [m.line for m in found] == [2, 2, 2, 4, 4, 4, 4]
    assert found[0].description == "line 2: added start 1 to 'range(n)'"
    assert found[1].description == "line 2: 'n' -> 'n + 1' in 'range(n)'"


def test_slice_bounds():
    found = mutants("def f(xs):\n    return xs[1:] + xs[-1] + xs[::2]\n", ["slice_bounds"])
    assert changed_lines(found) == [
        "return xs[2:] + xs[-1] + xs[::2]",
        "return xs[0:] + xs[-1] + xs[::2]",
        "return xs[:] + xs[-1] + xs[::2]",
        "return xs[1:] + xs[0] + xs[::2]",
        "return xs[1:] + xs[-2] + xs[::2]",
    ]
    assert found[2].description == "line 2: dropped lower bound '1' of 'xs[1:]'"


def test_swap_args():
    code = "def f(a, b, c):\n    return divmod(a, b) + g(a, b, c) + h(a, a) + (a - b) + (a + b)\n"
    found = mutants(code, ["swap_args"])
    assert changed_lines(found) == [
        "return divmod(b, a) + g(a, b, c) + h(a, a) + (a - b) + (a + b)",
        "return divmod(a, b) + g(b, a, c) + h(a, a) + (a - b) + (a + b)",
        "return divmod(a, b) + g(a, c, b) + h(a, a) + (a - b) + (a + b)",
        "return divmod(a, b) + g(a, b, c) + h(a, a) + (b - a) + (a + b)",
    ]  # h(a, a) would be a no-op, a + b is commutative
    assert [m.description for m in found[:2]] == [
        "line 2: swapped arguments of 'divmod(a, b)'", "line 2: swapped arguments 1 and 2 of 'g(a, b, c)'"]
    assert found[3].description == "line 2: swapped operands of 'a - b'"


def test_var_replace():
    assert codes("def f(a, b):\n    c = a + b\n    return c * 2\n", "var_replace") == [
        "def f(a, b):\n    c = b + b\n    return c * 2",
        "def f(a, b):\n    c = a + a\n    return c * 2",
        "def f(a, b):\n    c = a + b\n    return b * 2",  # the nearest preceding names first
        "def f(a, b):\n    c = a + b\n    return a * 2",
    ]


def test_var_replace_skips_builtins_calls_self_and_later_names():
    code = src("""
        class C:
            def m(self, xs):
                n = len(xs)
                total = helper(n)
                for x in xs:
                    total = total + x
                return total
    """)
    found = mutants(code, ["var_replace"])
    replaced = {(m.line, m.description.split(" in ")[0].split(": ")[1]) for m in found}
    assert replaced == {
        (4, "'n' -> 'xs'"),  # n is only defined after its line, total after the next
        (5, "'xs' -> 'total'"), (5, "'xs' -> 'n'"),
        (6, "'total' -> 'x'"), (6, "'total' -> 'n'"), (6, "'x' -> 'total'"), (6, "'x' -> 'n'"),
        (7, "'total' -> 'x'"), (7, "'total' -> 'n'"),
    }
    assert not any(name in m.description for m in found for name in ("self", "'len'", "'helper'"))


def test_stmt_remove():
    code = src("""
        def f(xs):
            total = 0
            for x in xs:
                if x < 0:
                    continue
                total += x
                print(x)
            return total
    """)
    found = mutants(code, ["stmt_remove"])
    assert [m.description for m in found] == [
        "line 2: removed 'total = 0'", "line 5: removed 'continue'",
        "line 6: removed 'total += x'", "line 7: removed 'print(x)'",
    ]  # the final return stays
    assert found[1].code == code.rstrip("\n").replace("continue", "pass")  # a block never goes empty
    early = mutants("def f(x):\n    if x:\n        return 1\n    return 2\n", ["stmt_remove"])
    assert [m.code for m in early] == ["def f(x):\n    if x:\n        pass\n    return 2"]


def test_aug_assign():
    code = src("""
        def f(xs):
            s = p = 1
            t = ''
            for x in xs:
                s += x
                p *= x
                t += 'x'
            return s - p
    """)
    found = mutants(code, ["aug_assign"])
    assert changed_lines(found) == ["s -= x", "p += x"]  # t += 'x' stays
    assert [m.description for m in found] == [
        "line 5: '+' -> '-' in 's += x'", "line 6: '*' -> '+' in 'p *= x'"]


def test_return_value():
    code = src("""
        def f(a, b):
            if a:
                return True
            if b is None:
                return None
            return b
    """)
    found = mutants(code, ["return_value"])
    assert list(zip([m.line for m in found], changed_lines(found))) == [
        (3, "return False"), (3, "return None"), (3, "return a"),
        (6, "return None"), (6, "return a"),
    ]  # `return None` is left alone


def test_init_value():
    code = src("""
        import math

        def f(xs):
            best = xs[0]
            found = False
            lo = float('inf')
            hi = -math.inf
            s = ''
            x = None
            n = 0
            m = 1.0
            k = 5
            return best
    """)
    found = mutants(code, ["init_value"])
    assert changed_lines(found) == [
        "best = 0", "found = True", "lo = -float('inf')", "hi = math.inf", "s = ' '", "x = 0", "n = 1", "m = 0.0",
    ]
    assert found[2].description == """line 6: "float('inf')" -> "-float('inf')" in "lo = float('inf')\""""


def test_if_else_swap():
    code = src("""
        def f(a):
            if a > 0:
                return 1
            elif a < 0:
                return -1
            else:
                return 0
    """)
    assert codes(code, "if_else_swap") == [
        unparsed("""
            def f(a):
                if a > 0:
                    if a < 0:
                        return -1
                    else:
                        return 0
                else:
                    return 1
        """),
        unparsed("""
            def f(a):
                if a > 0:
                    return 1
                elif a < 0:
                    return 0
                else:
                    return -1
        """),
    ]
    assert mutants(code, ["if_else_swap"])[0].description == "line 2: swapped branches of 'if a > 0:'"
    assert codes("def f(a):\n    if a:\n        return 1\n    return 0\n", "if_else_swap") == []


# --------------------------------------------------------------------------- properties
def diff_paths(a, b, path=()):
    """Paths (field names and list indices) where two trees differ, not descending past a difference."""
    if type(a) is not type(b):
        return [path]
    if isinstance(a, ast.AST):
        return [p for f in a._fields for p in diff_paths(getattr(a, f), getattr(b, f), path + (f,))]
    if isinstance(a, list):
        if len(a) != len(b):
            return [path]
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in diff_paths(x, y, path + (i,))]
    return [] if a == b else [path]


def node_at(tree, path):
    for step in path:
        tree = tree[step] if isinstance(step, int) else getattr(tree, step)
    return tree


def is_single_site(original: ast.AST, mutant: ast.AST) -> bool:
    """One changed subtree, one swap (two operands, two adjacent arguments, two branches), or
    one node wrapped into a new one or unwrapped (`n // 2` -> `n // 2 + 1`, `n - k + 1` -> `n - k`)."""
    paths = diff_paths(original, mutant)
    if len(paths) == 1:
        return True
    common = os.path.commonprefix(paths)
    steps = {p[len(common)] for p in paths}
    if steps in ({"left", "right"}, {"body", "orelse"}):
        return True
    if len(steps) == 2 and all(isinstance(s, int) for s in steps) and max(steps) - min(steps) == 1:
        return True
    old, new = node_at(original, common), node_at(mutant, common)
    wrapped = isinstance(new, ast.AST) and ast.dump(old) in map(ast.dump, ast.iter_child_nodes(new))
    unwrapped = isinstance(old, ast.AST) and ast.dump(new) in map(ast.dump, ast.iter_child_nodes(old))
    return wrapped or unwrapped


def test_every_mutant_parses_changes_one_site_and_is_not_a_no_op():
    original = ast.parse(ast.unparse(ast.parse(WINDOW)))
    for m in mutants(WINDOW):
        mutant = ast.parse(m.code)
        assert diff_paths(original, mutant), m.description  # not a no-op
        assert is_single_site(original, mutant), m.description


def strings(tree: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_docstrings_imports_annotations_and_strings_are_untouched():
    code = src('''
        """Module doc 1 + 1."""
        import math
        from os import path

        def f(xs: list[int], k: int = 2) -> tuple[int, int]:
            """Doc: 0 < 1."""
            label = "%d items" % k
            return (len(xs) + k, "a" + label)
    ''')
    found = mutants(code)
    assert found
    for m in found:
        tree = ast.parse(m.code)
        fn = tree.body[3]
        assert ast.get_docstring(tree) == "Module doc 1 + 1." and ast.get_docstring(fn) == "Doc: 0 < 1."
        assert [ast.unparse(s) for s in tree.body[1:3]] == ["import math", "from os import path"]
        assert [ast.unparse(a.annotation) for a in fn.args.args] == ["list[int]", "int"]
        assert ast.unparse(fn.returns) == "tuple[int, int]"
        assert strings(tree) <= strings(ast.parse(code))  # none changed (one may be removed)
    # "%d items" % k and "a" + label are formatting and concatenation, not arithmetic
    assert [m.description for m in found if m.family in ("arith_op", "swap_args")] == [
        "line 8: '+' -> '-' in 'len(xs) + k'"]


def test_families_filter_and_order():
    assert FAMILIES[:3] == ("arith_op", "compare_flip", "bool_op")
    assert len(FAMILIES) == len(set(FAMILIES)) >= 13
    everything = mutants(WINDOW)
    some = mutants(WINDOW, ["if_else_swap", "arith_op"])  # the order asked for does not matter
    assert [m.family for m in some] == sorted((m.family for m in some), key=FAMILIES.index)
    assert {m.family for m in some} == {"arith_op", "if_else_swap"}
    assert some == [m for m in everything if m.family in ("arith_op", "if_else_swap")]
    assert mutants(WINDOW, []) == []
    assert mutants(WINDOW, "bool_op") == mutants(WINDOW, ["bool_op"])


def test_unknown_family_and_syntax_error():
    with pytest.raises(ValueError, match="no_such_family"):
        mutants(WINDOW, ["arith_op", "no_such_family"])
    with pytest.raises(SyntaxError):
        mutants("def f(:\n    return 1\n")
    assert mutants("") == []


def test_realistic_function_covers_the_families_with_distinct_codes():
    found = mutants(WINDOW)
    assert len({m.family for m in found}) >= 12
    assert len({m.code for m in found}) == len(found)
    original = ast.unparse(ast.parse(WINDOW))
    for m in found:
        assert m.code != original
        assert len(m.description) < 120 and "\n" not in m.description
        assert m.description.startswith(f"line {m.line}: ")
        assert 5 <= m.line <= 18  # the docstring (line 4) and import (line 1) are never sites


def test_deterministic_within_and_across_processes():
    expected = [dataclasses.astuple(m) for m in mutants(WINDOW)]
    assert [dataclasses.astuple(m) for m in mutants(WINDOW)] == expected
    script = ("import dataclasses, json, sys\nfrom mlx_swe_rl.forge.mutators import mutants\n"
              "print(json.dumps([dataclasses.astuple(m) for m in mutants(sys.stdin.read())]))\n")
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", script], input=WINDOW, capture_output=True, text=True,
                             env=env, cwd=ROOT, check=True, timeout=60).stdout
        assert [tuple(m) for m in json.loads(out)] == expected
