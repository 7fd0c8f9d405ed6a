"""Stop rules: completions that end where their answer ends (issue "Generate only the answer").

A scripted wrapper forces the tiny model to write given texts, so the tests know exactly where
each completion must stop; the seeded test runs the tiny model itself at temperature 1.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

import mlx.core as mx
import pytest

from mlx_swe_rl.env.codefix import CodeFixEnv
from mlx_swe_rl.env.prompts import AnswerEnd, answer_closed, extract_code
from mlx_swe_rl.env.formats import StopStrings
from mlx_swe_rl.models.sampling import sample
from mlx_swe_rl.puzzles.format import Puzzle
from mlx_swe_rl.rl.evaluation import evaluate
from mlx_swe_rl.rl.rollouts import encode_prompts
from mlx_swe_rl.rl.config import SamplingPlan
from scripted import Scripted, script_table

ANSWER = "def add(a, b):\n    return a + b"
SCRIPT = ("Sure.\n```bash\npip install adder\n```\nA fragment first:\n```python\nx = add\n```\n"
          f"The fix:\n```python\n{ANSWER}\n```\nThis works because addition commutes.\n"
          "```python\ndef add(a, b):\n    return b + a\n```\nDone.")
PROSE = "No code in this answer, only words about the function and its tests. " * 2


@pytest.fixture(scope="module")
def scripted(tiny_model):
    model, tokenizer = tiny_model
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 500) for _ in range(n)] for n in (5, 400)]
    (eos,) = tokenizer.eos_token_ids
    return Scripted(model, script_table(tokenizer, prompts, [SCRIPT, PROSE]), eos), tokenizer, prompts


# ---------------------------------------------------------------------------------- the rule on text
@pytest.mark.parametrize("text, closed", [
    (f"```python\n{ANSWER}\n```", True),
    (f"```\n{ANSWER}\n```", True),  # untagged counts
    (f"~~~py\n{ANSWER}\n~~~", True),
    (f"```python\n{ANSWER}\n```python", True),  # models sometimes close with a tagged fence
    (f"```python\n{ANSWER}\n", False),  # not closed yet
    (f"```python\n{ANSWER}\n``", False),
    (f"```bash\n{ANSWER}\n```", False),  # another language
    ("```python\nx = add\n```", False),  # does not define the entry point
    ("```python\ndef add(a, b:\n    return a + b\n```", False),  # does not parse
    (f"Here:\n```python\nx = 1\n```\nand\n```python\n{ANSWER}\n```", True),
])
def test_answer_closed(text, closed):
    assert answer_closed(text, "add") is closed
    assert AnswerEnd("add").done(text) is closed


# ---------------------------------------------------------------------------------- in the sampler
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_stops_at_the_fence_closing_the_first_defining_block(scripted, temperature):
    model, tokenizer, prompts = scripted
    full = sample(model, tokenizer, prompts, max_tokens=200, temperature=temperature, seed=3)
    stopped = sample(model, tokenizer, prompts, max_tokens=200, temperature=temperature, seed=3,
                     stop=[AnswerEnd("add"), AnswerEnd("add")])
    whole, cut = full.groups[0][0], stopped.groups[0][0]
    assert whole.text == SCRIPT and whole.finish == "eos"
    # ends with the closing fence of the third block: not the bash block, not the fragment
    head, fence, tail = SCRIPT.partition(f"{ANSWER}\n```")
    assert cut.text.startswith(head + fence) and len(cut.text) < len(head + fence) + 4
    assert "This works" not in cut.text
    assert cut.finish == "stop" and not cut.truncated
    assert cut.token_ids == whole.token_ids[:len(cut.token_ids)]  # the tokens that made the match included
    assert len(cut.logprobs) == cut.num_tokens
    assert cut.logprobs == pytest.approx(whole.logprobs[:cut.num_tokens], abs=1e-5)
    assert extract_code(cut.text, "add") == ANSWER  # the block it stopped on is the answer
    # the other sequence in the batch has no answer to end on: untouched
    assert stopped.groups[1][0].token_ids == full.groups[1][0].token_ids
    assert stopped.groups[1][0].finish == "eos"
    assert stopped.stats.stopped == 1 and full.stats.stopped == 0
    assert stopped.stats.generated_tokens == full.stats.generated_tokens - (whole.num_tokens - cut.num_tokens)


def test_stop_strings_and_a_match_on_the_last_allowed_token(scripted):
    model, tokenizer, prompts = scripted
    result = sample(model, tokenizer, prompts[:1], max_tokens=200, stop=[StopStrings(("pip install",))])
    (s,) = result.groups[0]
    assert s.finish == "stop" and "pip install" in s.text
    assert "pip install" not in tokenizer.decode(s.token_ids[:-1])  # the last token completed the match
    limit = sample(model, tokenizer, prompts[:1], max_tokens=s.num_tokens, stop=[StopStrings(("pip install",))])
    assert limit.groups[0][0].finish == "stop"  # matched exactly at max_tokens: not truncated
    shorter = sample(model, tokenizer, prompts[:1], max_tokens=s.num_tokens - 1, stop=[StopStrings(("pip install",))])
    assert shorter.groups[0][0].finish == "length" and shorter.groups[0][0].truncated


@dataclass(frozen=True)
class LongEnough:
    """Stops once the text has `chars` characters (any printable character triggers a look)."""

    chars: int
    triggers: str = string.printable

    def done(self, text: str) -> bool:
        return len(text) >= self.chars


def test_seeded_samples_equal_the_unstopped_ones_up_to_the_stop(tiny_model):
    model, tokenizer = tiny_model
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randrange(3, 12))] for _ in range(4)]
    full = sample(model, tokenizer, prompts, max_tokens=24, temperature=1.0, seed=7)
    stopped = sample(model, tokenizer, prompts, max_tokens=24, temperature=1.0, seed=7,
                     stop=[LongEnough(12), None, None, None])
    cut, whole = stopped.groups[0][0], full.groups[0][0]
    assert cut.finish == "stop" and cut.num_tokens < whole.num_tokens
    assert cut.token_ids == whole.token_ids[:cut.num_tokens]
    assert len(tokenizer.decode(cut.token_ids)) >= 12 > len(tokenizer.decode(cut.token_ids[:-1]))
    # Every other sequence is the same up to that step; after it the batch differs (a row was
    # dropped), and so do later random draws.
    for a, b in zip(stopped.groups[1:], full.groups[1:]):
        assert a[0].token_ids[:cut.num_tokens] == b[0].token_ids[:cut.num_tokens]


def test_greedy_other_sequences_are_unaffected(tiny_model):
    model, tokenizer = tiny_model
    rng = random.Random(2)
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randrange(3, 12))] for _ in range(5)]
    full = sample(model, tokenizer, prompts, max_tokens=20, temperature=0.0)
    stopped = sample(model, tokenizer, prompts, max_tokens=20, temperature=0.0,
                     stop=[LongEnough(8), None, LongEnough(20), None, None])
    for p in (1, 3, 4):
        assert stopped.groups[p][0].token_ids == full.groups[p][0].token_ids


def test_one_rule_per_prompt(tiny_model):
    model, tokenizer = tiny_model
    with pytest.raises(ValueError, match="one rule"):
        sample(model, tokenizer, [[5, 6, 7]], max_tokens=4, stop=[None, None])


# ---------------------------------------------------------------------------------- through evaluate
def test_evaluate_stops_after_the_answer_and_full_completions_restore_the_old_output(tiny_model, scorer):
    model, tokenizer = tiny_model
    puzzle = Puzzle(id="add", tier="easy", split="train", entry_point="add", description="Add two numbers.",
                    buggy="def add(a, b):\n    return a - b\n", oracle="def add(a, b):\n    return a + b\n",
                    tests=("assert add(1, 2) == 3", "assert add(-4, 4) == 0"))
    with CodeFixEnv([puzzle], scorer) as env:
        prompts = encode_prompts(tokenizer, env, [puzzle])
        (eos,) = tokenizer.eos_token_ids
        scripted_model = Scripted(model, script_table(tokenizer, prompts, [SCRIPT]), eos)
        short = evaluate(scripted_model, tokenizer, env, [puzzle], SamplingPlan(1, 0.0, 200), progress=False)
        full = evaluate(scripted_model, tokenizer, env, [puzzle], SamplingPlan(1, 0.0, 200, stop_after_answer=False),
                        progress=False)
    (a,), (b,) = short["puzzles"][0]["completions"], full["puzzles"][0]["completions"]
    assert a["finish"] == "stop" and b["finish"] == "eos" and b["text"] == SCRIPT
    assert a["num_tokens"] < b["num_tokens"]
    assert short["settings"]["stop_after_answer"] and not full["settings"]["stop_after_answer"]
    assert short["timing"]["stopped"] == 1 and full["timing"]["stopped"] == 0
    # The same answer is read from both: the first defining block (stopped) and, in the full
    # text, the last defining block, which here is another correct fix.
    assert a["code"] == ANSWER and a["solved"] and b["solved"]
    # Without the stop the sampler sees no stop rule at all: exactly the old output.
    plain = sample(scripted_model, tokenizer, prompts, max_tokens=200, temperature=0.0, logprobs=False)
    assert b["text"] == plain.groups[0][0].text and b["num_tokens"] == plain.groups[0][0].num_tokens
