"""Reward functions, their combination and reward-spec validation (no sandbox needed)."""

from __future__ import annotations

import pytest

from mlx_swe_rl.env import rewards
from mlx_swe_rl.sandbox import scorer, verdict
from script_module import load_script
from mlx_swe_rl.puzzles.format import Puzzle
from mlx_swe_rl.env.rewards import (DEFAULT_REWARD, DEFAULT_REWARD_WITHOUT_TESTS, REWARDS, Completion, combine, format_reward,
                                    normalise_source, partial_reward, progress_reward, similarity_reward, validate_weights)

# the wrong answers of docs/scoring.md ("Rewards"): the body deleted, an unrelated line added
reward_probe = load_script("reward_probe")
body_deleted, edited_elsewhere = reward_probe.body_deleted, reward_probe.edited_elsewhere

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


def test_change_is_a_headerless_unified_diff_of_normalised_code():
    diff = rewards.change(BUGGY, ORACLE)
    assert diff.splitlines() == ["@@ -1,5 +1,5 @@", " def total(xs):", "     result = 0", "-    for x in xs[1:]:",
                                 "+    for x in xs:", "         result += x", "     return result"]
    assert rewards.change(BUGGY, "# same\n" + BUGGY) == ""


def test_similarity_echoing_the_buggy_code_or_restyling_it_is_zero():
    assert similarity_reward(completion(BUGGY)) == 0.0
    restyled = "def total(xs):\n    # add them up\n    result = 0\n    for x in xs[1:]:  # every item\n" \
               "        result += (x)\n\n    return result\n"
    assert similarity_reward(completion(restyled)) == 0.0


def test_similarity_partial_fix_is_between_zero_and_one():
    oracle = "def span(xs):\n    low = min(xs)\n    high = max(xs)\n    return high - low\n"
    buggy = "def span(xs):\n    low = max(xs)\n    high = min(xs)\n    return low - high\n"
    puzzle = Puzzle(id="span", tier="easy", split="train", entry_point="span", description="Range.",
                    buggy=buggy, oracle=oracle, tests=("assert span([1, 3]) == 2",))
    half = "def span(xs):\n    low = min(xs)\n    high = max(xs)\n    return low - high\n"
    other = "def span(xs):\n    return 0\n"
    partial = similarity_reward(Completion(puzzle, half, None))
    assert 0.0 < similarity_reward(Completion(puzzle, other, None)) < partial < 1.0
    assert similarity_reward(Completion(puzzle, oracle, None)) == 1.0


def test_similarity_code_that_does_not_parse_or_define_the_entry_point_is_minus_one():
    assert similarity_reward(completion("def total(xs)\n    return sum(xs)\n")) == -1.0
    assert similarity_reward(completion("import os\nprint(os.getcwd())\n")) == -1.0


def test_similarity_echo_scores_zero_and_oracle_one_on_every_bundled_puzzle():
    from mlx_swe_rl.puzzles.format import load_puzzles

    for p in load_puzzles():
        assert similarity_reward(Completion(p, p.buggy, None)) == 0.0, p.id
        assert similarity_reward(Completion(p, p.oracle, None)) == 1.0, p.id


def test_progress_echo_is_zero_oracle_one_and_deleting_or_editing_elsewhere_earns_next_to_nothing_on_every_bundled_puzzle():
    from mlx_swe_rl.puzzles.format import load_puzzles

    elsewhere = []
    for p in load_puzzles():
        assert progress_reward(Completion(p, p.buggy, None)) == 0.0, p.id
        assert progress_reward(Completion(p, p.oracle, None)) == 1.0, p.id
        assert progress_reward(Completion(p, body_deleted(p), None)) == 0.0, p.id
        elsewhere.append(progress_reward(Completion(p, edited_elsewhere(p), None)))
    # An unrelated line can line up with a few characters of the fix (3 of 54 puzzles, at most 0.08).
    assert max(elsewhere) < 0.1 and sum(elsewhere) / len(elsewhere) < 0.01


def test_similarity_pays_for_deleting_the_body_which_is_why_tasks_without_tests_default_to_progress():
    from mlx_swe_rl.puzzles.format import load_puzzles

    puzzles = load_puzzles()
    deleted = [similarity_reward(Completion(p, body_deleted(p), None)) for p in puzzles]
    assert sum(deleted) / len(deleted) > 0.5  # measured: 0.73 on average (docs/scoring.md, "Rewards")
    assert DEFAULT_REWARD_WITHOUT_TESTS == {"progress": 1.0}


# span: both extremes swapped and the subtraction reversed; HALF mends the extremes only
SPAN_ORACLE = "def span(xs):\n    low = min(xs)\n    high = max(xs)\n    return high - low\n"
SPAN_BUGGY = "def span(xs):\n    low = max(xs)\n    high = min(xs)\n    return low - high\n"
SPAN = Puzzle(id="span", tier="easy", split="train", entry_point="span", description="Range.",
              buggy=SPAN_BUGGY, oracle=SPAN_ORACLE, tests=())
HALF = "def span(xs):\n    low = min(xs)\n    high = max(xs)\n    return low - high\n"
RESTYLED = "def span(xs):\n    # the extremes\n    low = max(xs)\n    high = min(xs)\n\n    return (low - high)\n"
STUB = "def span(xs):\n    return 0\n"


def test_progress_partial_fix_is_between_zero_and_one_and_restyling_is_zero():
    assert 0.0 < progress_reward(Completion(SPAN, HALF, None)) < 1.0
    assert progress_reward(Completion(SPAN, RESTYLED, None)) == 0.0
    assert progress_reward(Completion(SPAN, STUB, None)) == 0.0


def test_answer_kind_names_what_an_answer_did():
    def kind(code: str | None, solved: bool = False) -> str:
        kind = rewards.answer_kind(Completion(SPAN, code, None), solved)
        assert kind in rewards.ANSWER_KINDS
        return kind

    assert kind(SPAN_ORACLE, solved=True) == "solved"
    assert kind(None) == kind("def other(xs):\n    return 0\n") == "no answer"
    assert kind(SPAN_BUGGY) == kind(RESTYLED) == "buggy code unchanged"
    assert kind(HALF) == "toward the fix"
    assert kind(STUB) == "other edit"


def test_answer_kind_shares_read_an_evaluation_report():
    rows = [{"id": SPAN.id, "completions": [{"code": SPAN_ORACLE, "solved": True}, {"code": None, "solved": False},
                                            {"code": SPAN_BUGGY, "solved": False}, {"code": STUB, "solved": False}]}]
    shares = rewards.answer_kind_shares(rows, {SPAN.id: SPAN})
    assert list(shares) == list(rewards.ANSWER_KINDS)
    assert shares == {"solved": 0.25, "no answer": 0.25, "buggy code unchanged": 0.25, "toward the fix": 0.0,
                      "other edit": 0.25}


def test_changed_lines_count_removed_and_added_lines_of_normalised_code():
    assert rewards.changed_lines(SPAN_BUGGY, RESTYLED) == 0  # comments and layout are no edit
    assert rewards.changed_lines(SPAN_BUGGY, SPAN_ORACLE) == 6  # three lines replaced
    assert rewards.changed_lines(SPAN_BUGGY, HALF) == 4
    assert rewards.changed_lines(SPAN_BUGGY, STUB) == 4  # three lines out, one in


def test_edit_sizes_compare_each_answer_with_the_fix():
    rows = [{"id": SPAN.id, "completions": [{"code": SPAN_ORACLE, "solved": True}, {"code": None, "solved": False},
                                            {"code": RESTYLED, "solved": False}, {"code": HALF, "solved": False},
                                            {"code": SPAN_ORACLE + "\n\ndef extra():\n    return 1\n",
                                             "solved": True}]}]
    sizes = rewards.edit_sizes(rows, {SPAN.id: SPAN})
    # the answer without code is left out; the last one rewrites more than the fix does
    assert sizes == {"answers": 4, "answer_lines": (6 + 0 + 4 + 8) / 4, "fix_lines": 6.0, "larger_than_fix": 0.25}
    assert rewards.edit_sizes([{"id": SPAN.id, "completions": [{"code": None, "solved": False}]}],
                              {SPAN.id: SPAN}) is None


def test_progress_format_failure_is_minus_one():
    assert progress_reward(completion(None, None)) == -1.0
    assert progress_reward(completion("def total(xs)\n    return sum(xs)\n")) == -1.0
    assert progress_reward(completion("import os\n")) == -1.0


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
    half_fixed = BUGGY.replace("xs[1:]", "xs[0:]")
    reward, parts = combine(completion(half_fixed, THREE), weights)
    sim = similarity_reward(completion(half_fixed))
    assert 0.0 < sim < 1.0
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
    assert set(REWARDS) == {"tests", "partial", "similarity", "progress", "format"}


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


def test_reading_odd_code_prints_no_warning():
    import warnings

    from mlx_swe_rl.env.prompts import answer_closed
    from mlx_swe_rl.puzzles.format import defines, normal_form

    odd = "def f(y):\n    return 1if y else '\\d'\n"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert normalise_source(odd) == "def f(y):\n    return 1 if y else '\\\\d'"
        assert defines(odd, "f") and normal_form(odd)
        assert answer_closed(f"```python\n{odd}```\n", "f")
    # one SyntaxWarning per odd answer would flood a report, a training log or a mining run
    assert not caught, [str(w.message) for w in caught]
