"""Reward functions, their combination and reward-spec validation (no sandbox needed)."""

from __future__ import annotations

import pytest

from mlx_swe_rl.env import rewards
from mlx_swe_rl.sandbox import scorer, verdict
from mlx_swe_rl.puzzles.format import Puzzle
from mlx_swe_rl.env.rewards import (DEFAULT_REWARD, REWARDS, Completion, combine, format_reward, normalise_source, partial_reward, similarity_reward, validate_weights)

# aliases whose names pytest does not mistake for tests
Run = scorer.TestRun
Result = verdict.TestResult
binary_reward = rewards.tests_reward

ORACLE = "def total(xs):\n    result = 0\n    for x in xs:\n        result += x\n    return result\n"
BUGGY = "def total(xs):\n    result = 0\n    for x in xs[1:]:\n        result += x\n    return result\n"
PUZZLE = Puzzle(id="total", tier="easy", split="train", entry_point="total",
                description="Sum a list.", buggy=BUGGY, oracle=ORACLE,
                tests=("assert total([1]) == 1", "assert total([]) == 0", "assert total([1, 2]) == 3",
                       "assert total([5, 5]) == 10"))


def run_of(*statuses: str) -> Run:
    return Run([Result(i, s) for i, s in enumerate(statuses)])


ALL = run_of("passed", "passed", "passed", "passed")
THREE = run_of("passed", "failed", "passed", "passed")
NONE = run_of("error", "error", "error", "error")


def completion(code: str | None = ORACLE, run: Run | None = ALL) -> Completion:
    return Completion(PUZZLE, code, run)


# ----------------------------------------------------------------------- each reward
def test_tests_reward_is_binary():
    assert binary_reward(completion(run=ALL)) == 1.0
    assert binary_reward(completion(run=THREE)) == 0.0
    assert binary_reward(completion(run=NONE)) == 0.0
    assert binary_reward(completion(run=None)) == 0.0
    assert binary_reward(completion(run=run_of())) == 0.0  # no tests is not a pass
    assert binary_reward(completion(code=None, run=None)) == 0.0


def test_partial_reward_is_the_fraction_passed():
    assert partial_reward(completion(run=ALL)) == 1.0
    assert partial_reward(completion(run=THREE)) == 0.75
    assert partial_reward(completion(run=run_of("passed", "timeout", "crashed", "failed"))) == 0.25
    assert partial_reward(completion(run=NONE)) == 0.0
    assert partial_reward(completion(run=None)) == 0.0
    assert partial_reward(completion(run=run_of())) == 0.0


def test_similarity_identical_code_is_one():
    assert similarity_reward(completion(ORACLE)) == 1.0


def test_similarity_format_failure_is_minus_one():
    assert similarity_reward(completion(None, None)) == -1.0


def test_similarity_ignores_formatting_and_comments():
    reformatted = (
        "# my fix\n"
        "def total( xs ):\n"
        "    result=0  # start at zero\n"
        "\n"
        "    for x in xs :   # every item\n"
        "        result  +=  x\n"
        "    return (result)\n"
    )
    assert similarity_reward(completion(reformatted)) == 1.0
    assert normalise_source(reformatted) == normalise_source(ORACLE)


def test_similarity_ranks_closer_code_higher():
    close = similarity_reward(completion(BUGGY))
    far = similarity_reward(completion("import os\nprint(os.getcwd())\n"))
    assert 0.0 <= far < close < 1.0
    assert close > 0.8


def test_similarity_of_unparsable_code_is_in_range():
    value = similarity_reward(completion("def total(xs)\n    return sum(xs)\n"))
    assert 0.0 < value < 1.0


def test_format_reward():
    assert format_reward(completion(ORACLE)) == 1.0
    assert format_reward(completion("class total:\n    pass\n")) == 1.0
    assert format_reward(completion("def other(xs):\n    return 0\n")) == 0.0
    assert format_reward(completion("def total(xs)\n    return 0\n")) == 0.0  # does not parse
    assert format_reward(completion(None, None)) == 0.0


# ---------------------------------------------------------------------------- combine
def test_combine_default_is_tests_only():
    assert DEFAULT_REWARD == {"tests": 1.0}
    assert combine(completion(run=ALL), DEFAULT_REWARD) == (1.0, {"tests": 1.0})
    assert combine(completion(run=THREE), DEFAULT_REWARD) == (0.0, {"tests": 0.0})


def test_combine_weighted_sum_and_unweighted_parts():
    weights = {"tests": 2.0, "partial": 0.5, "format": 0.25, "similarity": -1.0}
    reward, parts = combine(completion(BUGGY, THREE), weights)
    sim = similarity_reward(completion(BUGGY))
    assert parts == {"tests": 0.0, "partial": 0.75, "format": 1.0, "similarity": sim}
    assert reward == pytest.approx(2.0 * 0 + 0.5 * 0.75 + 0.25 * 1.0 - sim)


def test_combine_format_failure():
    reward, parts = combine(completion(None, None), {"tests": 1.0, "similarity": 0.5, "format": 1.0})
    assert parts == {"tests": 0.0, "similarity": -1.0, "format": 0.0}
    assert reward == -0.5


# ---------------------------------------------------------------------- validate_weights
def test_validate_weights_accepts_and_converts():
    assert validate_weights({"tests": 1, "similarity": 0.5}) == {"tests": 1.0, "similarity": 0.5}
    assert validate_weights({"tests": 1, "format": 0}) == {"tests": 1.0, "format": 0.0}
    assert all(type(w) is float for w in validate_weights({"partial": 3}).values())
    assert set(REWARDS) == {"tests", "partial", "similarity", "format"}


@pytest.mark.parametrize("name, suggestion", [("test", "tests"), ("similarty", "similarity"),
                                              ("formatt", "format"), ("partials", "partial")])
def test_validate_weights_unknown_name_suggests_closest(name, suggestion):
    with pytest.raises(ValueError) as info:
        validate_weights({"tests": 1.0, name: 1.0})
    message = str(info.value)
    assert f"reward.{name}" in message and f"did you mean '{suggestion}'?" in message


def test_validate_weights_unknown_name_without_close_match_lists_valid():
    with pytest.raises(ValueError) as info:
        validate_weights({"zzzz": 1.0})
    assert all(name in str(info.value) for name in REWARDS)


@pytest.mark.parametrize("weight", ["1.0", None, True, [1.0]])
def test_validate_weights_non_number(weight):
    with pytest.raises(ValueError, match=r"reward\.tests: weight .* must be a number"):
        validate_weights({"tests": weight})


@pytest.mark.parametrize("weights", [{"tests": 0}, {"tests": 0.0, "format": 0}, {}])
def test_validate_weights_all_zero_or_empty(weights):
    with pytest.raises(ValueError, match="reward"):
        validate_weights(weights)
