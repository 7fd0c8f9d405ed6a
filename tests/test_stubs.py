"""Writing tasks made from repair puzzles (forge/stubs.py, `puzzles stubs`): issue 53's
capability gate."""

from __future__ import annotations

import ast
import dataclasses

import pytest
from click.testing import CliRunner

from mlx_swe_rl.cli.app import main
from mlx_swe_rl.env.codefix import CodeFixEnv
from mlx_swe_rl.env.prompts import PromptStyle, build_messages
from mlx_swe_rl.forge.stubs import stub_code, stub_puzzles
from mlx_swe_rl.puzzles.format import Puzzle, load_puzzles

ORACLE = '''import math
from collections import Counter

SCALE = 3


def _helper(x):
    return x * SCALE


def norm(xs, *, p=2):
    """The p-norm of xs."""
    # a comment the stub drops
    total = sum(abs(x) ** p for x in xs)
    return total ** (1 / p)
'''


def test_a_stub_keeps_imports_signature_and_docstring_and_drops_body_and_helpers():
    stub = stub_code(ORACLE, "norm")
    tree = ast.parse(stub)
    assert [type(n).__name__ for n in tree.body] == ["Import", "ImportFrom", "FunctionDef"]
    fn = tree.body[-1]
    assert ast.unparse(fn.args) == "xs, *, p=2"
    assert ast.get_docstring(fn) == "The p-norm of xs."
    assert ast.unparse(fn.body[-1]) == "..." and len(fn.body) == 2
    assert "_helper" not in stub and "SCALE" not in stub and "sum(" not in stub


def test_a_class_keeps_its_attributes_and_loses_every_method_body():
    oracle = ("class Stack:\n    limit = 10\n\n    def __init__(self):\n        self.items = []\n\n"
              "    @property\n    def size(self):\n        return len(self.items)\n")
    stub = stub_code(oracle, "Stack")
    cls = ast.parse(stub).body[0]
    assert ast.unparse(cls.body[0]) == "limit = 10"
    assert [ast.unparse(m.body[0]) for m in cls.body[1:]] == ["...", "..."]
    assert "@property" in stub and "self.items" not in stub
    with pytest.raises(ValueError, match="does not define 'Queue'"):
        stub_code(oracle, "Queue")


def mutant(p: Puzzle, n: int) -> Puzzle:
    return dataclasses.replace(p, id=f"{p.id}__m{n}", buggy=p.buggy + f"\n# mutant {n}\n", family="x")


def test_one_task_per_function_that_fails_its_tests_until_written(scorer):
    """Mutants of one function make one task; every bundled function's stub fails its tests and
    its oracle passes them, so the task measures writing, not the scorer."""
    bundled = load_puzzles(None, ["medium", "hard"])
    puzzles = [q for p in bundled for q in (mutant(p, 1), mutant(p, 2))]
    stubs = stub_puzzles(puzzles)
    assert len(stubs) == len(bundled) and len({s.id for s in stubs}) == len(stubs)
    assert all(s.source["spec_of"].endswith("__m1") and s.family == "spec" for s in stubs)
    assert [s.split for s in stubs] == [p.split for p in bundled]
    assert sum("Symptom:" in p.description for p in bundled) > 10  # how the bug shows: not a specification
    assert not any("Symptom:" in s.description for s in stubs)
    assert all(p.description.startswith(s.description) for p, s in zip(bundled, stubs))
    with CodeFixEnv(stubs, scorer=scorer) as env:
        fence = "```python\n{}\n```"
        empty = env.score([(s.id, fence.format(s.buggy)) for s in stubs])
        written = env.score([(s.id, fence.format(s.oracle)) for s in stubs])
    assert not any(v.solved for v in empty)
    assert all(v.solved for v in written)


def test_the_write_prompt_asks_for_the_body_of_the_stub():
    stub = stub_puzzles([load_puzzles(None, ["medium"])[0]])[0]
    user = build_messages(stub, PromptStyle("write", "none"))[-1]["content"]
    assert user.startswith("Write the Python function below") and stub.buggy.rstrip() in user
    assert stub.description in user and "buggy" not in user.lower()


def test_the_command_writes_a_set_that_loads(tmp_path):
    out = tmp_path / "stubs"
    result = CliRunner().invoke(main, ["puzzles", "stubs", "--tiers", "medium", "--out", str(out)])
    assert result.exit_code == 0, result.output
    loaded = load_puzzles(out)
    assert len(loaded) == len(load_puzzles(None, ["medium"])) and all(p.id.startswith("spec-") for p in loaded)
    again = CliRunner().invoke(main, ["puzzles", "stubs", "--tiers", "medium", "--out", str(out)])
    assert again.exit_code == 1 and "pass --overwrite" in again.output and "Traceback" not in again.output
