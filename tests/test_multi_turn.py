"""Multi-turn repair: exact conversation ids, public and hidden tests, feedback that cannot leak
hidden tests, a loss that never trains environment tokens, and episodes in the trainer."""

from __future__ import annotations

import dataclasses
import json
import shutil

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from mlx_swe_rl.env.codefix import CodeFixEnv
from mlx_swe_rl.env.feedback import GENERIC, NO_CODE, TestSplit, public_view
from mlx_swe_rl.env.verdict import Verdict
from mlx_swe_rl.models.chat import ChatFrame, ChatTemplateError, encode_text, rendered_ids
from mlx_swe_rl.models.sampling import encode_chat
from mlx_swe_rl.puzzles.format import Puzzle
from mlx_swe_rl.rl import policy as policy_module
from mlx_swe_rl.rl.grpo import grpo_objective
from mlx_swe_rl.rl.policy import GroupBatch, group_log_probs
from mlx_swe_rl.rl.rollouts import collect_rollouts, encode_prompts
from mlx_swe_rl.rl.config import SamplingPlan
from scripted import Scripted, script_table

# A Qwen2.5-style ChatML template (default system prompt when there is none), as Qwen models ship.
QWEN2_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

FIRST = "```python\ndef add(a, b):\n    return a - b\n```"
SECOND = "Sorry.\n```python\ndef add(a, b):\n    return a + b\n```\n"
FEEDBACK = "The code failed this test:\nassert add(1, 2) == 3\nfailed: expected 3, got -1"


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from mlx_lm.utils import load_tokenizer

    from mlx_swe_rl.models.specs import resolve_model

    return load_tokenizer(resolve_model("smollm2-135m"))


@pytest.fixture(scope="module")
def qwen2_tokenizer(tiny_model):
    """The tiny model's byte-level BPE tokenizer with a Qwen2.5-style template."""
    import copy

    _, tokenizer = tiny_model
    tok = copy.copy(tokenizer._tokenizer)
    tok.chat_template = QWEN2_TEMPLATE
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    return TokenizerWrapper(tok, eos_token_ids=tokenizer.eos_token_ids)


@pytest.mark.parametrize("which", ["smollm2", "qwen2", "qwen_real", "tiny"])
@pytest.mark.parametrize("eos", [True, False])  # ended on EOS, or on a stop rule / the limit
def test_accumulated_ids_equal_the_rendered_conversation(request, which, eos, tiny_model):
    tokenizer = {"smollm2": lambda: request.getfixturevalue("smollm2_tokenizer"),
                 "qwen2": lambda: request.getfixturevalue("qwen2_tokenizer"),
                 "qwen_real": lambda: request.getfixturevalue("qwen_tokenizer"),  # conftest: Qwen2.5-Coder's own
                 "tiny": lambda: tiny_model[1]}[which]()
    frame = ChatFrame.of(tokenizer)
    (end,) = tokenizer.eos_token_ids
    messages = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix add."}]
    ids = encode_chat(tokenizer, messages)
    for answer, feedback in [(FIRST, FEEDBACK), (SECOND, "The tests failed.")]:
        ids += encode_text(tokenizer, answer) + ([end] if eos else [])
        ids += frame.bridge(tokenizer, feedback, ended_with_eos=eos)
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": feedback}]
        assert ids == rendered_ids(tokenizer, messages)


def test_a_template_that_rewrites_earlier_turns_is_refused(tiny_model):
    import copy

    from mlx_lm.tokenizer_utils import TokenizerWrapper

    _, tokenizer = tiny_model
    tok = copy.copy(tokenizer._tokenizer)
    # drops earlier assistant turns, as templates that strip reasoning do
    tok.chat_template = ("{% for m in messages %}{% if m.role != 'assistant' or loop.last %}"
                         "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
                         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    with pytest.raises(ChatTemplateError, match="appending turns"):
        ChatFrame.of(TokenizerWrapper(tok, eos_token_ids=tokenizer.eos_token_ids))


# ---------------------------------------------------------------------------------- public and hidden
MARKER = "HIDDEN-7c1e-MARKER"
PUZZLE = Puzzle(id="add", tier="easy", split="train", entry_point="add", description="Add two numbers.",
                buggy="def add(a, b):\n    return a - b\n", oracle="def add(a, b):\n    return a + b\n",
                tests=("assert add(1, 2) == 3", "assert add(-4, 4) == 0", "assert add(2, 2) == 4",
                       f"assert add('{MARKER}', '!') == '{MARKER}!'"))


def test_split_is_deterministic_and_keeps_a_hidden_test():
    split = TestSplit(public=2)
    public = split.public_indices(PUZZLE)
    assert len(public) == 2 and public == TestSplit(public=2).public_indices(PUZZLE)
    assert sorted(public + split.hidden_indices(PUZZLE)) == [0, 1, 2, 3]
    assert len(TestSplit(public=10).public_indices(PUZZLE)) == 3  # one always stays hidden
    assert len(TestSplit(public=0.5).public_indices(PUZZLE)) == 2
    one = Puzzle(**{**PUZZLE.__dict__, "id": "one", "tests": PUZZLE.tests[:1]})
    assert TestSplit(public=1).public_indices(one) == ()


def hidden_marker_split() -> TestSplit:
    """A split whose hidden tests hold the marker test."""
    for public in (1, 2, 3):
        split = TestSplit(public=public)
        if 3 in split.hidden_indices(PUZZLE):
            return split
    raise AssertionError("no split keeps the marker test hidden")


HOSTILE = '''```python
import gc
def add(a, b):
    # every string this process holds, returned as the "actual" value
    found = [o for o in gc.get_objects() if isinstance(o, str)]
    for o in gc.get_objects():
        if isinstance(o, (list, tuple, dict)):
            found += [x for x in (o.values() if isinstance(o, dict) else o) if isinstance(x, str)]
    # the strings that look like tests (short enough to come back as a value)
    return " | ".join(sorted({s for s in found if "add(" in s and len(s) < 200}))[:1500]
```'''


def test_hidden_tests_never_reach_the_feedback_nor_a_prompt(scorer, tiny_model):
    split = hidden_marker_split()
    with CodeFixEnv([PUZZLE], scorer, split=split) as env:
        info, = env.score([(PUZZLE.id, HOSTILE)])
        assert not info.public_ok and info.feedback
        assert "got 'add(" in info.feedback, info.feedback  # the channel works: it found the public test
        assert MARKER not in info.feedback
        # through the whole episode machinery: the hostile answer, then its feedback as a user turn
        model, tokenizer = tiny_model
        prompts = encode_prompts(tokenizer, env, [PUZZLE])
        (end,) = tokenizer.eos_token_ids
        scripted = Scripted(model, script_table(tokenizer, prompts, [HOSTILE]), end)
        batch = collect_rollouts(scripted, tokenizer, env, [PUZZLE], SamplingPlan(1, 0.0, 800, max_turns=2))
    (episode,) = batch.groups[0]
    assert len(episode.turns) == 2 and episode.turns[0].verdict.feedback == info.feedback
    ids, _ = episode.sequence()
    text = tokenizer.decode(batch.prompts[0] + ids)
    assert "The code failed this test" in text and MARKER not in text


def test_feedback_names_the_failing_public_test_or_is_generic(scorer):
    split = TestSplit(public=3)
    with CodeFixEnv([PUZZLE], scorer, split=split) as env:
        buggy, fixed, nothing = env.score([(PUZZLE.id, f"```python\n{PUZZLE.buggy}```"),
                                       (PUZZLE.id, f"```python\n{PUZZLE.oracle}```"),
                                       (PUZZLE.id, "no code")])
    view = public_view(PUZZLE, split.public_indices(PUZZLE))
    assert buggy.feedback.startswith("The code failed this test:\n") and "expected" in buggy.feedback
    assert any(test in buggy.feedback for test in view.tests)
    assert fixed.public_ok and fixed.feedback is None and fixed.solved
    assert nothing.feedback == NO_CODE
    with CodeFixEnv([PUZZLE], scorer, split=TestSplit(public=3, detailed=False)) as env:
        generic, = env.score([(PUZZLE.id, f"```python\n{PUZZLE.buggy}```")])
    assert generic.feedback == GENERIC


def test_reward_on_hidden_tests_only(scorer):
    split = hidden_marker_split()
    # passes every test but the marker one (strings): the public tests pass, the hidden one fails
    ints_only = "```python\ndef add(a, b):\n    return a + b if isinstance(a, int) else None\n```"
    with CodeFixEnv([PUZZLE], scorer, split=split) as env:
        info, = env.score([(PUZZLE.id, ints_only)])
    assert info.public_ok and not info.solved and info.reward == 0.0
    assert {t.index for t in info.tests} == set(split.hidden_indices(PUZZLE))


# ---------------------------------------------------------------------------------- the loss
def test_environment_tokens_get_no_gradient_and_no_loss(tiny_model, monkeypatch):
    """Changing the targets at the bridge positions (what the model would be trained to predict
    there) changes neither the loss, its diagnostics, nor any gradient."""
    model, _ = tiny_model
    prompt = [5, 9, 14, 3]
    completions = [[20, 21, 22, 30, 31, 32, 40, 41], [50, 51, 60, 61, 62, 63]]
    masks = [[1, 1, 1, 0, 0, 0, 1, 1], [1, 1, 0, 0, 1, 1]]
    batch = GroupBatch.build(prompt, completions, masks)
    adv, weights = mx.array([1.0, -1.0]), mx.array([0.1, 0.2])

    def loss_fn(batch):
        logp, entropy = group_log_probs(model, batch, with_entropy=True)
        loss, stats = grpo_objective(logp, mx.stop_gradient(logp), mx.zeros_like(logp) - 1.0, adv, batch.mask(),
                                     weights, beta=0.1, eps_low=0.2, eps_high=0.2)
        return loss, {**stats, "entropy": (entropy * batch.mask()).sum(), "logp": logp}

    def grads_and_stats(scramble: bool):
        original = policy_module.head_log_probs

        def head(m, hidden, targets, positions, with_entropy=False):
            if scramble:  # other targets everywhere the loss does not read
                keep = mx.zeros(targets.shape)
                for b, row in enumerate(positions):
                    keep[b, mx.array(row)] = 1.0
                targets = mx.where(keep > 0, targets, (targets * 7 + 3) % 500)
            return original(m, hidden, targets, positions, with_entropy)

        monkeypatch.setattr(policy_module, "head_log_probs", head)
        (loss, stats), grads = nn.value_and_grad(model, lambda b: loss_fn(b))(batch)
        return loss.item(), {k: v for k, v in stats.items()}, dict(tree_flatten(grads))

    loss_a, stats_a, grads_a = grads_and_stats(False)
    loss_b, stats_b, grads_b = grads_and_stats(True)
    assert loss_a == loss_b
    for key in ("policy_loss", "kl", "clip_frac", "entropy"):
        assert stats_a[key].item() == stats_b[key].item()
    assert all(mx.array_equal(grads_a[k], grads_b[k]) for k in grads_a)
    # and the masked positions' log-probs are exactly 0, never computed
    logp = stats_a["logp"]
    assert (logp * (1 - batch.mask())).abs().sum().item() == 0.0


def test_single_turn_mask_is_the_old_length_mask(tiny_model):
    completions = [[3, 4, 5], [6], [7, 8]]
    batch = GroupBatch.build([1, 2], completions)
    lengths = mx.array([3, 1, 2])
    old = (mx.arange(3)[None, :] < lengths[:, None]).astype(mx.float32)
    assert mx.array_equal(batch.mask(), old)
    assert batch.positions() == [[0, 1, 2], [0], [0, 1]]


# ---------------------------------------------------------------------------------- in the trainer
class FeedbackEnv:
    """A synthetic multi-turn env: an answer passes when it starts with a chosen piece; every
    other answer gets feedback and, within max_turns, another turn."""

    def __init__(self, chosen: list[str]):
        self.chosen = chosen
        self.split = TestSplit(public=1)

    def prompt_for(self, puzzle_id: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": puzzle_id.replace("_", " ")}]

    def stop_rule(self, puzzle_id: str) -> None:
        return None

    def score(self, items):
        out = []
        for puzzle_id, text in items:
            ok = any(text.startswith(c) for c in self.chosen)
            out.append(Verdict(puzzle_id, float(ok), ok, text[:8], None, {"tests": float(ok)}, passed=int(ok), total=1,
                               public_tests=[0], public_passed=int(ok), public_ok=ok,
                               feedback=None if ok else "The tests failed. Try again."))
        return out


def multi_turn_config(tiny_model_dir, tmp_path, steps: int, **extra):
    from mlx_swe_rl.rl.config import load_config

    overrides = {"model.spec": str(tiny_model_dir), "output_dir": str(tmp_path), "run_name": "mt",
                 "puzzles.tiers": "[easy]", "train.steps": steps, "train.puzzles_per_step": 2, "train.save_every": 1,
                 "sampling.max_tokens": 6, "sampling.group_size": 4, "train.final_eval": "false",
                 "multi_turn.max_turns": 3, "optim.lr": "1e-3", "grpo.beta": 0.04, **extra}
    return load_config(None, [f"{k}={v}" for k, v in overrides.items()])


@pytest.fixture(scope="module")
def chosen(tiny_model) -> list[str]:
    _, tokenizer = tiny_model
    return [tokenizer.decode([i]) for i in range(3, 500) if i % 4 == 0]


def test_multi_turn_training_trains_episodes_and_resumes_exactly(tiny_model, tiny_model_dir, tmp_path, chosen):
    from mlx_swe_rl.rl.trainer import train

    mx.random.seed(1234)
    straight = train(multi_turn_config(tiny_model_dir, tmp_path / "a", 4), progress=False, env=FeedbackEnv(chosen),
                     log=lambda *_: None)
    lines = [json.loads(line) for line in (tmp_path / "a" / "mt" / "rollouts.jsonl").read_text().splitlines()]
    assert len(lines) == 4 * 2 * 4
    assert any(len(line.get("turns", [])) > 1 for line in lines), "no episode took a second turn"
    mx.random.seed(1234)
    cut = multi_turn_config(tiny_model_dir, tmp_path / "b", 4)
    train(cut, progress=False, env=FeedbackEnv(chosen), stop_after=2, log=lambda *_: None)
    shutil.rmtree(tmp_path / "b" / "mt" / "checkpoint-old", ignore_errors=True)
    resumed = train(cut, resume=True, progress=False, env=FeedbackEnv(chosen), log=lambda *_: None)
    keys = ("reward_mean", "loss", "kl", "grad_norm", "completion_len", "loss_completions")
    assert [[getattr(h, k) for k in keys] for h in straight.history[2:]] == \
        [[getattr(h, k) for k in keys] for h in resumed.history]


def test_eval_turns_prints_the_per_turn_table_and_writes_the_fields(tiny_model_dir, tmp_path):
    from click.testing import CliRunner

    from mlx_swe_rl.cli.eval import main

    out = tmp_path / "mt.json"
    result = CliRunner().invoke(main, ["--model", str(tiny_model_dir), "--tiers", "easy", "--max-tokens", "6",
                                       "--turns", "2", "--best-of-n", "--workers", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "multi-turn repair: up to 2 answers" in result.output and "solved after turn 1:" in result.output
    assert "best of 2 independent answers" in result.output
    report = json.loads(out.read_text())
    assert report["settings"]["turns"] == 2 and report["settings"]["split"]["reward_on"] == "hidden"
    m = report["multi_turn"]
    assert len(m["solved_after_turn"]) == 2 and m["episodes"] == len(report["puzzles"])
    for row in report["puzzles"]:
        assert isinstance(row["public_tests"], list)
        (c,) = row["completions"]
        turns = c["turns"]
        assert 1 <= len(turns) <= 2 and turns[-1]["feedback"] is None
        assert all(t["feedback"] for t in turns[:-1])  # shown after every turn but the last
        assert all(set(t) >= {"text", "code", "public_ok", "solved", "feedback"} for t in turns)
    # a random model writes no code: every first answer gets the no-code feedback and a second turn
    assert m["mean_turns"] == 2.0


def test_calibration_of_multi_turn_episodes(tiny_model, chosen):
    from mlx_swe_rl.puzzles.format import load_puzzles
    from mlx_swe_rl.rl.calibration import calibrate

    model, tokenizer = tiny_model
    puzzles = load_puzzles(tiers=["easy"])[:4]
    report = calibrate(model, tokenizer, FeedbackEnv(chosen), puzzles, SamplingPlan(4, 1.0, 6, max_turns=2),
                       progress=False)
    assert report["settings"]["turns"] == 2
    for row in report["puzzles"]:
        assert row["samples"] == 4
        for c in row["completions"]:
            assert 1 <= len(c["turns"]) <= 2
            assert c["solved"] == c["turns"][-1]["solved"]  # an episode is judged by its last answer
    with pytest.raises(ValueError, match="single-turn"):
        calibrate(model, tokenizer, FeedbackEnv(chosen), puzzles, SamplingPlan(4, 1.0, 6, max_turns=2), rounds=2,
                  progress=False)


# ---------------------------------------------------------------------------------- set-up for public tests
from mlx_swe_rl.env.feedback import public_sources  # noqa: E402

STATEFUL = (
    f"chart = {{'ceo': ['cto']}}\nassert len(chart) == 1\nassert chart.get('{MARKER}') == None",  # 0
    "chart['cto'] = ['dev']\nother = 'unrelated'\nassert len(chart['cto']) == 1",  # 1: a change in place
    "assert chart['cto'] == ['dev']",  # 2
    "assert sorted(chart) == ['ceo', 'cto']",  # 3
)


def test_a_public_test_gets_the_set_up_it_needs_and_no_assert():
    (view,) = public_sources(STATEFUL, (2,))
    assert view == "chart = {'ceo': ['cto']}\nchart['cto'] = ['dev']\n" + STATEFUL[2]
    assert MARKER not in view and "unrelated" not in view  # no hidden assert, no set-up it does not need
    assert plan_steps(view) == [["exec", "chart = {'ceo': ['cto']}\nchart['cto'] = ['dev']"],
                                ["probe", "chart['cto']"]]


def plan_steps(source: str) -> list[list[str]]:
    from mlx_swe_rl.puzzles.testplan import plan_test

    return plan_test(source).candidate_steps


def test_set_up_that_already_runs_in_the_view_is_not_repeated():
    # test 1 is public: its own statements run, so test 2 needs only what test 1 does not give
    first, second = public_sources(STATEFUL, (1, 2))
    assert first == "chart = {'ceo': ['cto']}\n" + STATEFUL[1]
    assert second == STATEFUL[2]
    # set-up prepended to an earlier public test is not run twice (it would undo test 2's state)
    second, third = public_sources(STATEFUL, (2, 3))
    assert second.startswith("chart = {'ceo': ['cto']}\n") and third == STATEFUL[3]


def test_public_tests_that_needed_no_set_up_are_unchanged():
    from mlx_swe_rl.puzzles.format import load_puzzles

    split = TestSplit(public=1)
    changed = [p.id for p in load_puzzles()
               if public_view(p, split.public_indices(p)).tests != tuple(p.tests[i] for i in split.public_indices(p))]
    # the bundled puzzles whose public test reads a name an earlier hidden test binds, and only those
    assert sorted(changed) == ["bucket_range_predicates", "management_levels", "playlist_track_list"]
    assert public_sources(PUZZLE.tests, (0, 2)) == (PUZZLE.tests[0], PUZZLE.tests[2])


def test_puzzles_that_needed_set_up_score_oracle_one_and_buggy_zero(scorer):
    from mlx_swe_rl.puzzles.format import load_puzzles

    chosen = [p for p in load_puzzles() if p.id in {"bucket_range_predicates", "management_levels",
                                                    "playlist_track_list"}]
    with CodeFixEnv(chosen, scorer, split=TestSplit(public=1)) as env:
        verdicts = env.score([(p.id, f"```python\n{code}```") for p in chosen for code in (p.oracle, p.buggy)])
    for p, (oracle, buggy) in zip(chosen, zip(verdicts[::2], verdicts[1::2])):
        assert oracle.reward == 1.0 and oracle.solved and oracle.public_ok, (p.id, oracle)
        assert buggy.reward == 0.0 and not buggy.solved and buggy.error is None, (p.id, buggy)


def test_hidden_asserts_never_reach_a_public_run_with_set_up(scorer):
    stateful = Puzzle(id="chart", tier="easy", split="train", entry_point="reports", description="Reports of a person.",
                      buggy="def reports(chart, who):\n    return []\n",
                      oracle="def reports(chart, who):\n    return chart.get(who, [])\n",
                      tests=STATEFUL[:1] + ("assert reports(chart, 'ceo') == ['cto']",), hidden_tests=(0,))
    assert TestSplit(public=1).public_indices(stateful) == (1,)
    with CodeFixEnv([stateful], scorer, split=TestSplit(public=1)) as env:
        hostile, buggy = env.score([(stateful.id, HOSTILE.replace("def add(a, b)", "def reports(a, b)")
                                     .replace('"add(" in s', '"chart" in s')),
                                    (stateful.id, f"```python\n{stateful.buggy}```")])
    assert "chart = {'ceo'" in hostile.feedback.split("got", 1)[1]  # the channel works: it read the set-up
    assert MARKER not in hostile.feedback
    # the feedback shows the public test with its set-up (no assertion): what the model needs to read it
    assert buggy.feedback.startswith("The code failed this test:\nchart = {'ceo': ['cto']}\nassert reports(")
    assert MARKER not in buggy.feedback


def test_tests_a_puzzle_keeps_hidden_are_never_public():
    split = TestSplit(public=1)
    first = split.public_indices(PUZZLE)
    kept = dataclasses.replace(PUZZLE, hidden_tests=first)
    assert split.public_indices(kept) and not set(split.public_indices(kept)) & set(first)
    assert set(TestSplit(public=10).public_indices(kept)) == set(range(4)) - set(first)
    everything = dataclasses.replace(PUZZLE, hidden_tests=(0, 1, 2, 3))
    assert split.public_indices(everything) == () and split.hidden_indices(everything) == (0, 1, 2, 3)


def test_best_of_public_draws_another_answer_only_after_a_public_failure(tiny_model, chosen):
    """Each episode is a chain of up to n independent answers: the drawn ones are a prefix of
    the chain, every drawn answer but the last failed the public tests, and a chain stops early
    only at an answer that passed them; the tokens counted are the drawn answers' tokens."""
    from mlx_swe_rl.puzzles.format import load_puzzles
    from mlx_swe_rl.rl.evaluation import Retries, best_of_public
    from mlx_swe_rl.rl.rollouts import plan_driver

    model, tokenizer = tiny_model
    puzzles = load_puzzles(tiers=["easy"])[:3]
    env = FeedbackEnv(chosen)
    n, plan = 3, SamplingPlan(4, 1.0, 5, seed=7, max_turns=3)
    driver = plan_driver(model, tokenizer, env, puzzles, plan.but(max_turns=1), False, "test")
    retries = Retries(n)
    chains = [retries.open(driver, p) for p in range(len(puzzles)) for _ in range(plan.group_size)]
    stats = driver.run(retries)
    lengths = set()
    for chain in chains:
        drawn = [live for live in chain if live.samples]
        assert drawn == chain[:len(drawn)] and drawn  # a prefix, never a gap
        assert not any(live.verdicts[-1].public_ok for live in drawn[:-1])
        assert len(drawn) == n or drawn[-1].verdicts[-1].public_ok
        lengths.add(len(drawn))
    assert len(lengths) > 1  # some chains stopped early, some went on: both paths ran
    assert stats.generated_tokens == sum(len(live.samples[0].token_ids) for c in chains for live in c if live.samples)

    report = best_of_public(model, tokenizer, env, puzzles, plan, progress=False)
    assert report["n"] == n and [p["samples"] for p in report["puzzles"]] == [plan.group_size] * len(puzzles)
    assert 0 < report["generated_tokens"] <= n * plan.group_size * len(puzzles) * 5
