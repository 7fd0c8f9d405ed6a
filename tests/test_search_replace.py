"""SWE-RL's answer format (SEARCH/REPLACE edits) and rewards for tasks without tests."""

from __future__ import annotations

import pytest

from mlx_swe_rl.env.codefix import CodeFixEnv
from mlx_swe_rl.env.formats import answer_format
from mlx_swe_rl.env.search_replace import Edit, FormatError, apply_edits, extract_edited_code, parse_edits
from mlx_swe_rl.env.prompts import PromptStyle
from mlx_swe_rl.puzzles.format import Puzzle

BUGGY = "def span(xs):\n    low = max(xs)\n    high = min(xs)\n    return high - low\n"
ORACLE = "def span(xs):\n    low = min(xs)\n    high = max(xs)\n    return high - low\n"
PUZZLE = Puzzle(id="span", tier="easy", split="train", entry_point="span", description="The range of a list.",
                buggy=BUGGY, oracle=ORACLE, tests=("assert span([1, 5, 3]) == 4", "assert span([2]) == 0"))
UNTESTED = Puzzle(id="span-mined", tier="mined", split="train", entry_point="span", description="Fix span.",
                  buggy=BUGGY, oracle=ORACLE, tests=())


def answer(*edits: tuple[str, str], think: str = "<think>min and max are swapped</think>\n") -> str:
    blocks = "".join(f"<<<<<<< SEARCH\n{s}\n=======\n{r}\n>>>>>>> REPLACE\n" for s, r in edits)
    return f"{think}<solution>\n{blocks}</solution>"


FIX = ("    low = max(xs)\n    high = min(xs)", "    low = min(xs)\n    high = max(xs)")
HALF = ("    low = max(xs)", "    low = min(xs)")


def test_edits_apply_in_order():
    code, problem = extract_edited_code(answer(FIX), BUGGY)
    assert problem is None and code == ORACLE
    code, _ = extract_edited_code(answer(("    low = max(xs)", "    low = min(xs)"),
                                         ("    high = min(xs)", "    high = max(xs)")), BUGGY)
    assert code == ORACLE
    # fences around the blocks and an empty REPLACE (a deletion) are fine
    fenced = "<solution>\n```python\n<<<<<<< SEARCH\n    high = min(xs)\n=======\n>>>>>>> REPLACE\n```\n</solution>"
    code, _ = extract_edited_code(fenced, BUGGY)
    assert code == "def span(xs):\n    low = max(xs)\n\n    return high - low\n"


@pytest.mark.parametrize("response, rule", [
    ("no tags at all", "one <solution>"),
    (answer(FIX) + "<solution></solution>", "one <solution>"),
    ("</solution> oops <solution>", "before"),
    ("<think>x</think><solution>just words</solution>", "no SEARCH/REPLACE"),
    (answer(("    low = maximum(xs)", "    low = min(xs)")), "not found"),
    (answer(("    low = max(xs)", "    low = max(xs)")), "SEARCH equals REPLACE"),
    (answer(("", "    low = min(xs)")), "empty SEARCH"),
    ("<solution>\n<<<<<<< SEARCH\n    low = max(xs)\n=======\n    low = min(xs)\n</solution>", "not closed"),
])
def test_format_rules(response, rule):
    code, problem = extract_edited_code(response, BUGGY)
    assert code is None and rule in problem


def test_parse_and_apply_directly():
    assert parse_edits("<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE") == [Edit("a", "b")]
    with pytest.raises(FormatError, match="out of place"):
        parse_edits("<<<<<<< SEARCH\na\n>>>>>>> REPLACE\n")
    assert apply_edits("x = 1\nx = 1\n", [Edit("x = 1", "x = 2")]) == "x = 2\nx = 1\n"  # first occurrence


def test_prompt_asks_for_edits_and_the_answer_ends_at_the_closing_tag():
    fmt = answer_format("search_replace")
    (system, user) = fmt.messages(PUZZLE, PromptStyle("block", "expert"))
    assert "<<<<<<< SEARCH" in user["content"] and BUGGY.rstrip() in user["content"]
    assert ORACLE.rstrip() not in user["content"]
    rule = fmt.stop_rule(PUZZLE)
    assert rule.done(answer(FIX)) and not rule.done(answer(FIX)[:-1])
    assert ">" in rule.triggers
    with pytest.raises(ValueError, match="prompt.format"):
        answer_format("diff")


def test_env_scores_edits_with_tests_and_similarity(scorer):
    with CodeFixEnv([PUZZLE], scorer, reward={"tests": 1.0, "similarity": 0.5},
                    answer_format="search_replace") as env:
        full, half, broken, echo = env.score(
            [(PUZZLE.id, answer(FIX)), (PUZZLE.id, answer(HALF)), (PUZZLE.id, "<solution>words</solution>"),
             (PUZZLE.id, f"```python\n{BUGGY}```")])
    assert full.reward == 1.5 and full.solved and full.parts == {"tests": 1.0, "similarity": 1.0}
    assert not half.solved and 0.0 < half.parts["similarity"] < 1.0
    assert broken.reward == -0.5 and broken.code is None and "no SEARCH/REPLACE" in broken.format_error
    assert echo.reward == -0.5  # a fenced function is not this format's answer


def test_tasks_without_tests_train_on_progress_and_are_solved_by_the_oracle(scorer):
    with CodeFixEnv([PUZZLE, UNTESTED], scorer) as env:  # reward: tests (default); untested: progress
        results = env.score([(UNTESTED.id, f"```python\n{ORACLE}```"),
                             (UNTESTED.id, f"```python\n# fixed\n{ORACLE}```"),
                             (UNTESTED.id, f"```python\n{BUGGY}```"),
                             (UNTESTED.id, "no code"),
                             (PUZZLE.id, f"```python\n{ORACLE}```")])
    assert [v.reward for v in results] == [1.0, 1.0, 0.0, -1.0, 1.0]
    assert [v.solved for v in results] == [True, True, False, False, True]
    assert results[0].tests == [] and results[0].parts == {"progress": 1.0}
    assert results[4].parts == {"tests": 1.0}


def test_reward_without_tests_cannot_use_test_rewards(scorer):
    with pytest.raises(ValueError, match="reward_without_tests: partial, tests needs tests"):
        CodeFixEnv([PUZZLE], scorer, reward_without_tests={"tests": 1.0, "partial": 1.0})
