"""Prompt building and code extraction from model responses."""

from __future__ import annotations

import pytest

from mlx_swe_rl.env.prompts import (SYSTEM_MESSAGES, SYSTEM_PROMPT, TEMPLATES, AnswerEnd, PromptStyle, bare_code,
                                    build_messages, extract_code)
from mlx_swe_rl.puzzles.format import Puzzle, load_puzzles

FIX = "def f(x):\n    return x + 1"
BUGGY = "def f(x):\n    return x - 1"


# -------------------------------------------------------------------------- extract_code
def test_last_block_defining_entry_point_wins_over_later_unrelated_block():
    response = (
        "The buggy code was:\n```python\n" + BUGGY + "\n```\n"
        "Here is the fix:\n```python\n" + FIX + "\n```\n"
        "Usage:\n```python\nprint(f(1))\n```\n"
    )
    assert extract_code(response, "f") == FIX


def test_last_block_wins_without_entry_point_information():
    response = "```python\n" + BUGGY + "\n```\n```python\n" + FIX + "\n```"
    assert extract_code(response, "f") == FIX
    assert extract_code(response) == FIX
    # no block defines the entry point: the last python block is taken
    assert extract_code("```python\nx = 1\n```\n```python\ny = 2\n```", "f") == "y = 2"


@pytest.mark.parametrize("tag", ["", "python", "py", "python3", "Python", "PY"])
def test_python_and_untagged_fences(tag):
    assert extract_code(f"Sure:\n```{tag}\n{FIX}\n```\nDone.", "f") == FIX


def test_fence_with_trailing_info_after_tag():
    assert extract_code(f"```python title=fix.py\n{FIX}\n```", "f") == FIX


def test_unterminated_fence_from_truncated_completion():
    response = f"Here is the fix:\n```python\n{FIX}\n"
    assert extract_code(response, "f") == FIX
    # truncated mid-block after an earlier, complete quote of the buggy code
    response = f"```python\n{BUGGY}\n```\nFixed:\n```python\n{FIX}\n\n# done"
    assert extract_code(response, "f") == FIX + "\n\n# done"


def test_bare_code_response():
    assert extract_code(FIX + "\n", "f") == FIX
    assert extract_code("\n\n" + FIX + "\n\n", "f") == FIX
    assert extract_code("x = f(1)\n", "f") is None  # parses, but does not define f


@pytest.mark.parametrize("response", [
    "",
    "   \n",
    "I think the bug is in the loop bound; change it to len(xs).",
    "fixed",
    "f",
    "Replace `x - 1` with `x + 1` in f.",
])
def test_prose_only_response_is_none(response):
    assert extract_code(response, "f") is None


@pytest.mark.parametrize("tag", ["text", "bash", "sh", "console", "json", "diff"])
def test_non_python_fenced_block_is_ignored(tag):
    assert extract_code(f"```{tag}\n{FIX}\n```", "f") is None
    assert extract_code(f"```python\n{FIX}\n```\n```{tag}\n{BUGGY}\n```", "f") == FIX
    assert extract_code(f"```{tag}\n{BUGGY}\n```\n```python\n{FIX}\n```", "f") == FIX


def test_empty_python_block_is_skipped():
    assert extract_code(f"```python\n{FIX}\n```\n```python\n\n```", "f") == FIX
    assert extract_code("```python\n\n```", "f") is None


def test_class_entry_point():
    code = "class Stack:\n    def pop(self):\n        return 1"
    response = f"```python\nclass Helper:\n    pass\n```\n```python\n{code}\n```\n```python\nStack().pop()\n```"
    assert extract_code(response, "Stack") == code


def test_indented_fence_in_a_list_item():
    response = "1. Change the sign:\n\n   ```python\n   def f(x):\n       return x + 1\n   ```\n"
    assert extract_code(response, "f") == FIX


# ------------------------------------------------------------------------ build_messages
@pytest.fixture(scope="module")
def bundled() -> list[Puzzle]:
    return load_puzzles()


STYLES = [PromptStyle(t, s) for t in TEMPLATES for s in SYSTEM_MESSAGES]


@pytest.mark.parametrize("style", STYLES, ids=lambda s: f"{s.template}-{s.system}")
def test_build_messages_has_description_and_buggy_code_but_no_tests(bundled, style):
    for puzzle in bundled:
        messages = build_messages(puzzle, style)
        if style.system == "none":  # the chat template then puts in its own default
            assert [m["role"] for m in messages] == ["user"]
        else:
            assert [m["role"] for m in messages] == ["system", "user"]
            assert messages[0]["content"] == SYSTEM_PROMPT
        user = messages[-1]["content"]
        assert puzzle.description in user
        assert puzzle.buggy.rstrip() in user
        assert f"```python\n{puzzle.buggy.rstrip()}\n```" in user
        assert puzzle.oracle.rstrip() not in user
        for test in puzzle.tests:
            assert test.strip() not in user, f"{puzzle.id}: a test leaks into the prompt"


def test_build_messages_hides_distinctive_test_values():
    puzzle = Puzzle(
        id="p", tier="easy", split="train", entry_point="f", description="Return x plus one.",
        buggy=BUGGY + "\n", oracle=FIX + "\n",
        tests=("assert f(4241) == 4242", "assert f('SECRET_VALUE') == 'SECRET_VALUE1'"),
    )
    text = "\n".join(m["content"] for m in build_messages(puzzle))
    assert "Return x plus one." in text and BUGGY in text
    for hidden in ("4241", "4242", "SECRET_VALUE", "assert"):
        assert hidden not in text
    assert "x + 1" not in text  # the oracle is not shown either


@pytest.mark.parametrize("closing", ["```", "```python", "````", "```   "])
def test_closing_fence_variants_and_crlf(closing):
    response = f"Fixed:\r\n```python\r\ndef f(x):\r\n    return x + 1\r\n{closing}\r\nDone."
    assert extract_code(response, "f") == FIX


def test_prompt_styles_by_name():
    seed = build_messages(Puzzle(id="p", tier="easy", split="train", entry_point="f", description="Add one.",
                                 buggy=BUGGY + "\n", oracle=FIX + "\n", tests=("assert f(1) == 2",)),
                          PromptStyle("seed", "none"))
    assert seed == [{"role": "user", "content": "Fix the buggy Python function below.\n\nPROBLEM: Add one.\n\n"
                     f"BUGGY CODE:\n```python\n{BUGGY}\n```\n\nReturn ONLY the corrected Python function. No "
                     "explanation, no tests, no markdown — just the function code."}]
    with pytest.raises(ValueError, match="prompt.template: 'sed' is not one of block, seed, find"):
        PromptStyle("sed")
    with pytest.raises(ValueError, match="prompt.system: 'default' is not one of expert, none"):
        PromptStyle("block", "default")


# ------------------------------------------------------------- answers without fences
@pytest.mark.parametrize("response", [
    f"Here is the corrected function:\n\n{FIX}\n",
    f"{FIX}\n\nThe bug was the minus sign; it should add one.",
    f"Sure! Here it is.\n{FIX}\nExplanation:\n- the function now adds one.\n",
    f"{FIX}\n\nprint(f(1))  # 2\n",
])
def test_bare_code_with_prose_around_it(response):
    code = extract_code(response, "f")
    assert code is not None and code.startswith(FIX)
    assert "bug" not in code and "Here" not in code and "Explanation" not in code


def test_bare_code_keeps_decorators_imports_and_helpers():
    response = ("Fixed version:\nimport math\n\n@staticmethod_like\ndef helper(x):\n    return math.floor(x)\n\n"
                "def f(x):\n    return helper(x) + 1\n\nThis now rounds down first.")
    assert extract_code(response, "f") == ("import math\n\n@staticmethod_like\ndef helper(x):\n"
                                           "    return math.floor(x)\n\ndef f(x):\n    return helper(x) + 1")


def test_bare_code_cut_by_the_token_limit_is_cut_back_to_what_parses():
    truncated = FIX + "\n\ndef g(y):\n    return (y +"
    assert extract_code(truncated, "f") == FIX
    assert bare_code("def f(x):\n    return (x +", "f") is None


def test_fenced_answers_do_not_fall_back_to_bare_code():
    # a fence line means the model used blocks: code outside them is not read
    assert extract_code(f"{FIX}\n```text\nnotes\n```", "f") is None


@pytest.mark.parametrize("text, done", [
    (f"{FIX}\n", False),                           # the function may go on
    (f"{FIX}\n\nThe bug", False),                  # the prose line is not complete yet
    (f"{FIX}\n\nThe bug was the sign.\n", True),  # code, then a complete line of prose
    (f"Here is the fix:\n{FIX}\n", False),         # prose before the code does not end it
    (f"{FIX}\n\nprint(f(1))\n", False),           # more code, not prose
    (f"def f(x):\n    for i in x:\nreturn\n", False),  # no complete definition of f yet
    # a block opened on the last complete line still awaits its body: the function goes on (an
    # earlier rule cut it back to what parsed and ended the answer there, mid-function)
    ("Here is the fix:\n\ndef f(x):\n    y = []\n    for i in x:\n", False),
    ("def f(x):\n    y = []\n    if x:\n       ", False),
    (f"```python\n{FIX}\nThe end.\n", False),     # inside an open fence only the fence closes it
])
def test_answer_end_for_bare_code(text, done):
    rule = AnswerEnd("f")
    assert "\n" in rule.triggers
    assert rule.done(text) is done
