"""Reward functions. Each maps one scored completion to a number; a reward spec combines
them with weights (`{"tests": 1.0}` by default, as in the seed)."""

from __future__ import annotations

import ast
import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..puzzles.format import Puzzle, defines, parse_python
from ..sandbox.scorer import TestRun

DEFAULT_REWARD: dict[str, float] = {"tests": 1.0}
# For tasks with no tests: progress toward the fix, which neither echoing nor deleting can earn
# (SWE-RL's `similarity` pays for both at the scale of one function; README "Rewards").
DEFAULT_REWARD_WITHOUT_TESTS: dict[str, float] = {"progress": 1.0}


@dataclass(frozen=True)
class Completion:
    """What the reward functions see: the puzzle, the extracted code (None when the
    response held no code) and the test run (None when the code was not run)."""

    puzzle: Puzzle
    code: str | None
    run: TestRun | None


def tests_reward(c: Completion) -> float:
    """1.0 only when every test passes (the seed's binary reward)."""
    return 1.0 if c.run is not None and c.run.all_passed else 0.0


def partial_reward(c: Completion) -> float:
    """The fraction of tests passed."""
    return c.run.passed / c.run.total if c.run is not None and c.run.total else 0.0


def normalise_source(code: str) -> str:
    """Source with formatting and comments normalised away (via the AST) when it parses."""
    try:
        return ast.unparse(parse_python(code))
    except (SyntaxError, ValueError):
        return "\n".join(line.rstrip() for line in code.strip().splitlines())


def exact_match(code: str, oracle: str) -> bool:
    """The candidate is the oracle, formatting and comments aside."""
    return normalise_source(code) == normalise_source(oracle)


def change(before: str, after: str) -> str:
    """The unified diff (3 lines of context, file headers stripped) from `before` to `after`,
    both normalised: what an edit changed, blind to formatting and comments."""
    lines = difflib.unified_diff(normalise_source(before).splitlines(), normalise_source(after).splitlines(),
                                 n=3, lineterm="")
    return "\n".join(line for line in lines if not line.startswith(("--- ", "+++ ")))


def well_formed(c: Completion) -> bool:
    """The response holds code that parses and defines the entry point (SWE-RL's format rule)."""
    return c.code is not None and defines(c.code, c.puzzle.entry_point)


def similarity_reward(c: Completion) -> float:
    """SWE-RL's reward: difflib's SequenceMatcher ratio between the change the candidate makes
    to the buggy code and the change the oracle makes, in [0, 1]. Changes, not whole functions:
    echoing the buggy code (or restyling it) changes nothing and scores 0. -1 for a format
    failure: no code, code that does not parse, or code that does not define the entry point.
    At the scale of one function the diffs' context lines are most of the text, so an edit in
    the wrong place, or deleting the body, still scores well (README "Rewards"): `progress`
    does not have that weakness."""
    if not well_formed(c):
        return -1.0
    made = change(c.puzzle.buggy, c.code)
    if not made:
        return 0.0
    return ratio(made, change(c.puzzle.buggy, c.puzzle.oracle))


def ratio(a: str, b: str) -> float:
    """difflib's SequenceMatcher ratio, autojunk off (SWE-RL's setting; 1.0: the same text)."""
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def progress_reward(c: Completion) -> float:
    """The share of the way from the buggy code to the oracle the candidate covers, by difflib's
    ratio to the oracle (normalised sources): (ratio(candidate) - ratio(buggy)) / (1 - ratio(buggy)),
    clipped at 0. The buggy code (restyled or not) scores 0, the oracle 1, a partial fix in
    between; an edit that moves away from the fix (deleting the body, a change elsewhere) scores
    0, not the partial credit `similarity` gives it. -1 for a format failure, as there."""
    if not well_formed(c):
        return -1.0
    code, buggy, oracle = (normalise_source(s) for s in (c.code, c.puzzle.buggy, c.puzzle.oracle))
    start = ratio(buggy, oracle)
    if code == buggy or start == 1.0:
        return 0.0
    return max(0.0, (ratio(code, oracle) - start) / (1.0 - start))


ANSWER_KINDS = ("solved", "no answer", "buggy code unchanged", "toward the fix", "other edit")


def answer_kind(c: Completion, solved: bool) -> str:
    """What an answer did, one of ANSWER_KINDS, for reading what training changed beyond the pass
    rate: solved (by the tests), no well-formed answer, the buggy code given back (restyling
    aside), an unsolved edit that moves toward the fix (`progress` above 0), or some other edit."""
    if solved:
        return "solved"
    moved = progress_reward(c)
    if moved < 0:
        return "no answer"
    if moved > 0:
        return "toward the fix"
    unchanged = normalise_source(c.code) == normalise_source(c.puzzle.buggy)
    return "buggy code unchanged" if unchanged else "other edit"


def answer_kind_shares(rows: list[dict], puzzles: Mapping[str, Puzzle]) -> dict[str, float]:
    """The share of each of ANSWER_KINDS among the completions of evaluation report rows (`eval
    --out`'s `puzzles`: each with its `id` and `completions`, whose `code` and `solved` were recorded)."""
    kinds = [answer_kind(Completion(puzzles[row["id"]], c["code"], None), c["solved"])
             for row in rows for c in row["completions"]]
    return {k: kinds.count(k) / len(kinds) for k in ANSWER_KINDS}


def changed_lines(a: str, b: str) -> int:
    """The size of the edit from `a` to `b`: lines removed plus lines added, between their
    normalised sources (restyling, comments and blank lines are no edit)."""
    before, after = ([line for line in normalise_source(code).splitlines() if line.strip()] for code in (a, b))
    ops = difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes()
    return sum((i2 - i1) + (j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")


def edit_sizes(rows: list[dict], puzzles: Mapping[str, Puzzle]) -> dict[str, float | int] | None:
    """How much the answers of evaluation report rows changed the buggy code, against how much
    the fix (the oracle) does, over the completions that hold code: the mean changed lines of
    each, and the share of answers that change more lines than the fix. Over-editing (rewriting
    what was right) is the known failure of GRPO on repair; None when no answer holds code."""
    pairs = [(changed_lines(puzzles[row["id"]].buggy, c["code"]),
              changed_lines(puzzles[row["id"]].buggy, puzzles[row["id"]].oracle))
             for row in rows for c in row["completions"] if c.get("code")]
    if not pairs:
        return None
    return {"answers": len(pairs), "answer_lines": sum(a for a, _ in pairs) / len(pairs),
            "fix_lines": sum(f for _, f in pairs) / len(pairs),
            "larger_than_fix": sum(a > f for a, f in pairs) / len(pairs)}


def format_reward(c: Completion) -> float:
    """1.0 when the response holds code that parses and defines the entry point."""
    return 1.0 if well_formed(c) else 0.0


REWARDS: dict[str, Callable[[Completion], float]] = {
    "tests": tests_reward,
    "partial": partial_reward,
    "similarity": similarity_reward,
    "progress": progress_reward,
    "format": format_reward,
}
NEEDS_TESTS = {"tests", "partial"}


def validate_weights(weights: Mapping[str, float], key: str = "reward", without_tests: bool = False
                     ) -> dict[str, float]:
    """Check a reward spec (the config key `key`): known names, numeric weights, at least one
    non-zero; `without_tests`: for tasks that have no tests, so no reward that needs them."""
    if not weights:
        raise ValueError(f"{key}: at least one reward function is needed")
    for name, weight in weights.items():
        if name not in REWARDS:
            close = difflib.get_close_matches(name, REWARDS, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"valid: {', '.join(REWARDS)}"
            raise ValueError(f"{key}.{name}: unknown reward function ({hint})")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise ValueError(f"{key}.{name}: weight {weight!r} must be a number")
    if not any(weights.values()):
        raise ValueError(f"{key}: all weights are zero")
    if without_tests and NEEDS_TESTS & weights.keys():
        raise ValueError(f"{key}: {', '.join(sorted(NEEDS_TESTS & weights.keys()))} needs tests (use "
                         f"{', '.join(n for n in REWARDS if n not in NEEDS_TESTS)})")
    return {name: float(w) for name, w in weights.items()}


def combine(c: Completion, weights: Mapping[str, float]) -> tuple[float, dict[str, float]]:
    """The weighted sum of the selected rewards, and each part unweighted."""
    parts = {name: REWARDS[name](c) for name in weights}
    return sum(weights[name] * value for name, value in parts.items()), parts
