"""Multi-turn repair's split of a puzzle's tests into public and hidden ones.

Each puzzle's tests split deterministically into public tests, whose failures may be shown to
the model, and hidden tests, which are never shown (env.feedback writes what the model reads).
A public test may use a name an earlier, hidden test binds (`chart = {...}` in test 0, used by
test 2). Its run then carries the set-up it depends on: the earlier tests' statements that bind
or change the names it reads, never their asserts (`public_sources`). The split is about the
puzzle alone, so the forge's checks and the environment share it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
from dataclasses import dataclass

from .format import Puzzle
from .testplan import StatementNames, free_names, statement_names


@dataclass(frozen=True)
class TestSplit:
    """How tests are split and how feedback reads: `public` is a count of public tests (>= 1)
    or a fraction of a puzzle's tests (< 1); at least one test stays hidden, so a puzzle with a
    single test has none public and its feedback is generic. `detailed` False gives the generic
    message always (the ablation that shows whether a model reads the feedback)."""

    __test__ = False  # not a pytest test class, despite the name

    public: float = 1
    reward_on: str = "hidden"  # hidden | all
    detailed: bool = True
    chars: int = 400

    def public_indices(self, puzzle: Puzzle) -> tuple[int, ...]:
        """The indices of the puzzle's public tests: the first ones in a fixed order drawn from
        the puzzle's id (so the split is the same in every run and on every machine), passing
        over the tests the puzzle keeps hidden (`Puzzle.hidden_tests`)."""
        n = len(puzzle.tests)
        count = int(self.public) if self.public >= 1 else int(self.public * n)
        count = max(0, min(count, n - 1))
        order = sorted(range(n), key=lambda i: hashlib.sha256(f"{puzzle.id}:{i}".encode()).hexdigest())
        return tuple(sorted([i for i in order if i not in puzzle.hidden_tests][:count]))

    def hidden_indices(self, puzzle: Puzzle) -> tuple[int, ...]:
        public = set(self.public_indices(puzzle))
        return tuple(i for i in range(len(puzzle.tests)) if i not in public)


def public_view(puzzle: Puzzle, indices: tuple[int, ...]) -> Puzzle:
    """The puzzle with only the given tests, each with the set-up it needs from the tests
    before it (`public_sources`), under its own id, so the scorer's oracle run for it holds
    exactly these tests."""
    return dataclasses.replace(puzzle, id=f"{puzzle.id}#public", tests=public_sources(puzzle.tests, tuple(indices)))


Statement = tuple[int, ast.stmt, StatementNames, str]  # (test index, statement, its names, its text)


def _statements(tests: tuple[str, ...]) -> list[Statement]:
    """Every top-level statement of every test, in run order, with its names and its exact text."""
    out = []
    for index, source in enumerate(tests):
        for stmt in ast.parse(source).body:
            out.append((index, stmt, statement_names(stmt), ast.get_source_segment(source, stmt)))
    return out


@functools.lru_cache(maxsize=4096)  # called for every answer scored; the tests are immutable
def public_sources(tests: tuple[str, ...], indices: tuple[int, ...]) -> tuple[str, ...]:
    """The public tests' sources, each preceded by the set-up it needs (a test that needs none
    is its own text, unchanged).

    A public test needs the names it reads before binding them that an earlier hidden test's
    set-up binds. Walking the earlier statements backwards: asserts never enter (a hidden
    assert's text must not reach this run); statements that already run in this view (earlier
    public tests, set-up prepended to them) are not repeated, and a name they bind is
    satisfied; a hidden set-up statement that binds or reads a needed name is taken (reading
    covers changes in place, `chart["x"] = 1`), its bindings satisfy, and what it reads joins
    the needed names. The taken statements keep their order and their exact text."""
    statements = _statements(tests)
    public = set(indices)
    prepended: set[int] = set()  # positions in `statements` taken as set-up for an earlier public test
    out = []
    for i in indices:
        earlier = [k for k, (index, *_) in enumerate(statements) if index < i]
        setup_binds = {name for k in earlier if statements[k][0] not in public
                       and not isinstance(statements[k][1], ast.Assert) for name in statements[k][2].bound}
        needed = free_names(tests[i]) & setup_binds
        taken: list[int] = []
        for k in reversed(earlier):
            if not needed:
                break
            index, stmt, names, _ = statements[k]
            if isinstance(stmt, ast.Assert):
                continue
            if index in public or k in prepended:  # it ran already in this view, before test i
                needed -= names.bound
            elif needed & (names.bound | names.loaded):
                taken.append(k)
                needed = (needed - names.bound) | (names.loaded & setup_binds)
        prepended.update(taken)
        out.append("".join(statements[k][3] + "\n" for k in reversed(taken)) + tests[i])
    return tuple(out)
