"""CodeFixEnv end to end on the bundled puzzles, through the real sandbox."""

from __future__ import annotations

import ast

import pytest

from mlx_swe_rl.env.codefix import CodeFixEnv
from mlx_swe_rl.puzzles.format import Puzzle, load_puzzles


@pytest.fixture(scope="module")
def bundled() -> list[Puzzle]:
    return load_puzzles()


@pytest.fixture(scope="module")
def env(bundled, scorer):
    e = CodeFixEnv(bundled, scorer=scorer)
    yield e
    e.close()


def fenced(code: str) -> str:
    return f"Here is the corrected code:\n\n```python\n{code.rstrip()}\n```\n"


def by_id(bundled: list[Puzzle], pid: str) -> Puzzle:
    return next(p for p in bundled if p.id == pid)


# ---------------------------------------------------------------- reset / prompt / step
def test_reset_observation_and_prompt(env, bundled):
    p = by_id(bundled, "clamp_value")
    obs = env.reset("clamp_value")
    assert obs == {"puzzle_id": "clamp_value", "tier": p.tier, "description": p.description,
                   "buggy_code": p.buggy, "entry_point": "clamp_value"}
    messages = env.get_prompt()
    assert messages[-1]["role"] == "user"
    assert p.description in messages[-1]["content"] and p.buggy.rstrip() in messages[-1]["content"]
    assert env.reset()["puzzle_id"] == bundled[0].id  # no id: the first puzzle
    with pytest.raises(KeyError, match="no_such_puzzle"):
        env.reset("no_such_puzzle")


def test_step_before_reset_and_empty_env(scorer, bundled):
    fresh = CodeFixEnv(bundled[:1], scorer=scorer)
    with pytest.raises(RuntimeError, match="reset"):
        fresh.step("anything")
    with pytest.raises(RuntimeError, match="reset"):
        fresh.get_prompt()
    with pytest.raises(ValueError):
        CodeFixEnv([], scorer=scorer)
    with pytest.raises(ValueError, match="did you mean 'tests'"):
        CodeFixEnv(bundled[:1], scorer=scorer, reward={"test": 1.0})


def test_step_with_oracle_scores_one(env, bundled):
    p = by_id(bundled, "clamp_value")
    env.reset(p.id)
    info = env.step(fenced(p.oracle))
    reward = info.reward
    assert reward == 1.0
    assert info.puzzle_id == p.id
    assert info.code == p.oracle.rstrip()
    assert info.format_ok is True
    assert info.passed == info.total == len(p.tests)
    assert [t.status for t in info.tests] == ["passed"] * len(p.tests)
    assert [t.index for t in info.tests] == list(range(len(p.tests)))
    assert info.parts == {"tests": 1.0}
    assert isinstance(info.output, str)


def test_step_with_class_oracle_scores_one(env, bundled):
    p = by_id(bundled, "lru_cache_ordered_dict")
    env.reset(p.id)
    info = env.step(fenced(p.oracle))
    reward = info.reward
    assert reward == 1.0 and info.passed == len(p.tests)


def test_step_with_buggy_code_scores_zero(env, bundled):
    p = by_id(bundled, "clamp_value")
    env.reset(p.id)
    info = env.step(fenced(p.buggy))
    reward = info.reward
    assert reward == 0.0
    assert info.format_ok is True
    assert 0 <= info.passed < info.total == len(p.tests)
    failing = [t for t in info.tests if t.status != "passed"]
    assert failing and all(t.message for t in failing)


def test_prose_answer_is_a_format_failure(env, bundled):
    p = by_id(bundled, "clamp_value")
    env.reset(p.id)
    info = env.step("The bug is that min and max are swapped; swap them back.")
    reward = info.reward
    assert reward == 0.0
    assert info.format_ok is False and info.code is None
    assert info.passed == 0 and info.total == len(p.tests)
    assert info.tests == [] and info.output == ""
    assert info.parts == {"tests": 0.0}


def test_candidate_output_is_captured(env, bundled):
    p = by_id(bundled, "clamp_value")
    env.reset(p.id)
    info = env.step(fenced("print('hello from the candidate')\n" + p.oracle))
    reward = info.reward
    assert reward == 1.0
    assert "hello from the candidate" in info.output


def test_crashing_and_looping_candidates_score_zero(env, bundled):
    p = by_id(bundled, "clamp_value")
    items = [
        (p.id, fenced("import os\nos._exit(0)\n" + p.oracle)),
        (p.id, fenced("def clamp_value(value, low, high):\n    return undefined_name\n")),
        (p.id, fenced("def clamp_value(value, low, high)\n    return value\n")),  # syntax error
    ]
    results = env.score(items)
    assert [v.reward for v in results] == [0.0, 0.0, 0.0]
    assert {t.status for t in results[0].tests} == {"crashed"}
    assert {t.status for t in results[1].tests} == {"error"}
    assert all("failed to load" in t.message for t in results[2].tests)


def test_score_many_pairs_in_input_order(env, bundled):
    chosen = [by_id(bundled, pid) for pid in
              ("clamp_value", "lru_cache_ordered_dict", "staircase_ways", "digit_sum", "levenshtein_edit_distance")]
    items, expected = [], []
    for i in range(4):
        for j, p in enumerate(chosen):
            kind = (i + j) % 3
            text = fenced(p.oracle) if kind == 0 else fenced(p.buggy) if kind == 1 else "no code here"
            items.append((p.id, text))
            expected.append((p.id, 1.0 if kind == 0 else 0.0, kind != 2))
    results = env.score(items)
    assert len(results) == len(items)
    assert [(v.puzzle_id, v.reward, v.format_ok) for v in results] == expected


def test_partial_and_format_rewards_through_env(scorer, bundled):
    p = by_id(bundled, "clamp_value")
    env = CodeFixEnv([p], scorer=scorer, reward={"partial": 1.0, "format": 0.5})
    good, bad, prose = env.score([(p.id, fenced(p.oracle)), (p.id, fenced(p.buggy)), (p.id, "no idea")])
    assert good.reward == 1.5 and good.parts == {"partial": 1.0, "format": 1.0}
    assert bad.reward == pytest.approx(bad.passed / bad.total + 0.5)
    assert prose.reward == 0.0


def test_similarity_only_reward_does_not_run_code(bundled):
    class NoRuns:
        def run_many(self, items):
            assert items == [], "code was run although no reward needs test results"
            return []

    p = by_id(bundled, "clamp_value")
    env = CodeFixEnv([p], scorer=NoRuns(), reward={"similarity": 1.0})
    same, none = env.score([(p.id, fenced(p.oracle)), (p.id, "prose")])
    assert same.reward == 1.0 and same.tests == [] and same.passed == 0
    assert none.reward == -1.0 and none.format_ok is False


# ------------------------------------------------------------------ reward hacking
ALWAYS_EQUAL = '''
class AlwaysEqual:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __hash__(self):
        return 0
    def __bool__(self):
        return True
    def __len__(self):
        return 0
    def __iter__(self):
        return iter(())
    def __getattr__(self, name):
        return lambda *args, **kwargs: AlwaysEqual()
    def __call__(self, *args, **kwargs):
        return AlwaysEqual()
'''


def is_class(p: Puzzle) -> bool:
    return any(isinstance(node, ast.ClassDef) and node.name == p.entry_point for node in ast.parse(p.oracle).body)


def always_equal_response(p: Puzzle) -> str:
    if is_class(p):  # a class entry point: every method returns AlwaysEqual
        wrapper = (f"class {p.entry_point}:\n"
                   f"    def __init__(self, *args, **kwargs):\n        pass\n"
                   f"    def __getattr__(self, name):\n        return lambda *args, **kwargs: AlwaysEqual()\n")
    else:
        wrapper = f"def {p.entry_point}(*args, **kwargs):\n    return AlwaysEqual()\n"
    return fenced(ALWAYS_EQUAL + "\n" + wrapper)


def test_always_equal_trick_scores_zero_on_every_bundled_puzzle(env, bundled):
    """Acceptance test: the seed's AlwaysEqual reward hack earns nothing anywhere."""
    assert sum(map(is_class, bundled)) >= 3  # class entry points are covered too
    items = [(p.id, always_equal_response(p)) for p in bundled]
    results = env.score(items)
    assert len(results) == len(bundled)
    for p, info in zip(bundled, results):
        assert info.format_ok, f"{p.id}: the hack was not even extracted"
        assert info.reward == 0.0, f"{p.id}: AlwaysEqual earned {info.reward}"
        assert info.passed < info.total, p.id
        # every probe of the entry point's value is rejected as non-plain data or an error
        assert any("not plain data" in t.message for t in info.tests) or \
            all(t.status != "passed" for t in info.tests), p.id


def test_builtin_subclass_trick_scores_zero(env, bundled):
    """An int/str/list subclass with an __eq__ that always agrees is not plain data either."""
    sub = ("class Liar({base}):\n    def __eq__(self, other):\n        return True\n"
           "    def __ne__(self, other):\n        return False\n    __hash__ = {base}.__hash__\n")
    items = []
    for base in ("int", "str", "list", "float"):
        for pid in ("clamp_value", "digit_sum", "reverse_word_order", "average_score"):
            p = by_id(bundled, pid)
            items.append((pid, fenced(sub.format(base=base) +
                                      f"def {p.entry_point}(*args, **kwargs):\n    return Liar()\n")))
    assert [v.reward for v in env.score(items)] == [0.0] * len(items)


def test_huge_int_answer_scores_zero_instead_of_crashing(env, bundled):
    p = by_id(bundled, "average_score")  # expects floats such as 90.0
    [info] = env.score([(p.id, fenced(f"def {p.entry_point}(*args):\n    return 10 ** 400\n"))])
    reward = info.reward
    assert reward == 0.0 and info.passed == 0


# ------------------------------------------------------------------ a batch survives a puzzle that cannot be scored
def broken_puzzle(pid: str = "broken_oracle") -> Puzzle:
    """A puzzle whose expected values cannot be computed: its oracle raises (as one that fails
    under load would fail its own tests)."""
    return Puzzle(id=pid, tier="easy", split="train", entry_point="add_one", description="Return x plus one.",
                  buggy="def add_one(x):\n    return x - 1\n",
                  oracle="def add_one(x):\n    raise RuntimeError('oracle down')\n",
                  tests=("assert add_one(1) == 2", "assert add_one(2) == 3"))


def test_a_batch_survives_a_puzzle_that_cannot_be_scored(scorer, bundled, caplog):
    from mlx_swe_rl.env.feedback import TestSplit
    from mlx_swe_rl.puzzles.format import PuzzleError

    good = [by_id(bundled, "clamp_value"), by_id(bundled, "management_levels")]
    broken = broken_puzzle()
    for split in (None, TestSplit(public=1)):
        caplog.clear()
        with CodeFixEnv(good + [broken], scorer, reward={"tests": 1.0, "format": 0.5}, split=split) as env:
            items = [(good[0].id, fenced(good[0].oracle)), (broken.id, fenced("def add_one(x):\n    return x + 1\n")),
                     (good[1].id, fenced(good[1].buggy)), (broken.id, "no code"), (good[1].id, fenced(good[1].oracle))]
            for _ in range(2):  # logged once per puzzle, however often it comes back
                verdicts = env.score(items)
        i0, i1, i2, i3, i4 = verdicts
        assert [(v.reward, v.solved) for v in (i0, i2, i4)] == [(1.5, True), (0.5, False), (1.5, True)]
        assert not any(info.error is not None for info in (i0, i2, i4)) and i0.tests and i2.tests
        for info in (i1, i3):  # every answer to the broken puzzle, with code or not
            assert info.reward == 0.0 and not info.solved and info.tests == []
            assert set(info.parts.values()) == {0.0}  # no part: its group carries no signal
            assert info.error == "test 0: oracle did not finish: RuntimeError: oracle down"
        if split is not None:
            assert i1.public_ok is False and i1.feedback is None  # an episode ends on an error verdict
        logged = [r.getMessage() for r in caplog.records if broken.id in r.getMessage()]
        assert len(logged) == 1 and "cannot be scored" in logged[0] and "oracle down" in logged[0]
    # callers that want to stop at a broken puzzle still can
    with pytest.raises(PuzzleError, match="oracle down"):
        scorer.expectations([broken])
    errored, fine = scorer.run_many([(broken, broken.buggy), (good[0], good[0].buggy)])
    assert errored.error and errored.results == [] and not errored.all_passed
    assert fine.error is None and fine.results


def test_a_public_view_that_cannot_be_scored_is_an_error_verdict(scorer):
    from mlx_swe_rl.env.feedback import TestSplit

    state = Puzzle(id="state_view", tier="easy", split="train", entry_point="add_one", description="Return x plus one.",
                   buggy="def add_one(x):\n    return x - 1\n", oracle="def add_one(x):\n    return x + 1\n",
                   tests=("items = [1]\nassert add_one(items.pop()) == 2", "assert items == []"), hidden_tests=(0,))
    with CodeFixEnv([state], scorer, split=TestSplit(public=1)) as env:
        [info] = env.score([(state.id, fenced(state.oracle))])
        reward = info.reward
    assert reward == 0.0 and not info.solved
    assert info.error == "public tests: test 0: oracle gives [1], test expects []"
    with CodeFixEnv([state], scorer) as env:  # single-turn, the puzzle is fine
        [info] = env.score([(state.id, fenced(state.oracle))])
        reward = info.reward
    assert reward == 1.0 and info.error is None
