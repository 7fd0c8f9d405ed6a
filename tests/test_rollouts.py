"""Dynamic sampling in one continuous batch (`dynamic_rollouts`, the `Refill` policy): a spare
puzzle's group joins for each group that cannot teach, within the cap, while the rest decode;
spare groups never needed sample nothing; with nothing to replace it samples what
`collect_rollouts` samples."""

from __future__ import annotations

import pytest

from mlx_swe_rl.env.verdict import Verdict
from mlx_swe_rl.models import sampling
from mlx_swe_rl.puzzles.format import load_puzzles
from mlx_swe_rl.rl import rollouts
from mlx_swe_rl.rl.config import SamplingPlan
from mlx_swe_rl.rl.rollouts import collect_rollouts, dynamic_rollouts, informative

G = 4
PLAN = SamplingPlan(G, 1.0, 8, seed=3, batch_size=32)


class FirstToken:
    """A stop rule that ends an answer after its first token (`""` is in every token's text)."""

    triggers = ("",)

    def done(self, text: str) -> bool:
        return True


class ScriptedEnv:
    """Outcomes the test decides per puzzle: "pass" always solves, "fail" never does, "mixed"
    solves only the first of its answers ever scored (so its group is mixed however the scorer
    calls were batched). Answers to "pass" and "fail" puzzles end after one token, so their
    groups finish while the "mixed" ones still decode. A failed answer gets feedback (multi-turn)."""

    def __init__(self, outcomes: dict[str, str]):
        self.outcomes, self.seen = outcomes, set()

    def prompt_for(self, puzzle_id: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": puzzle_id.replace("_", " ")}]

    def stop_rule(self, puzzle_id: str) -> FirstToken | None:
        return None if self.outcomes[puzzle_id] == "mixed" else FirstToken()

    def score(self, items):
        out = []
        for pid, _ in items:
            kind = self.outcomes[pid]
            ok = kind == "pass" or (kind == "mixed" and pid not in self.seen)
            self.seen.add(pid)
            out.append(Verdict(pid, float(ok), ok, "x", None, {"tests": float(ok)}, passed=int(ok), total=1,
                               public_tests=[0], public_passed=int(ok), public_ok=ok,
                               feedback=None if ok else "The tests failed. Try again."))
        return out


@pytest.fixture(scope="module")
def named():
    """Eight easy puzzles by letter, A..H."""
    return dict(zip("ABCDEFGH", load_puzzles(tiers=["easy"])[:8]))


def scripted(named, kinds: dict[str, str]) -> ScriptedEnv:
    return ScriptedEnv({named[letter].id: kind for letter, kind in kinds.items()})


@pytest.fixture
def engines(monkeypatch):
    """The engines the rollouts build, and for each release of a held first answer how many rows
    were decoding at that moment (one entry per released answer)."""
    built, running = [], []
    original_engine, original_release = rollouts.plan_engine, sampling.Engine.release

    def plan_engine(*args, **kwargs):
        built.append(original_engine(*args, **kwargs))
        return built[-1]

    def release(engine, seq, extra=None):
        if engine.requests[seq].parent is None:
            running.append(engine.running)
        original_release(engine, seq, extra)

    monkeypatch.setattr(rollouts, "plan_engine", plan_engine)
    monkeypatch.setattr(sampling.Engine, "release", release)
    return built, running


KINDS = {"A": "mixed", "B": "pass", "C": "fail", "D": "fail", "E": "mixed", "F": "mixed", "G": "mixed",
         "H": "mixed"}


@pytest.mark.parametrize("cap, spares, released", [
    (4, "DEFGH", "DEF"),  # B, C fail: D and E join; D fails: F joins; then 3 of 3 teach: G is dropped
    (1, "DEFGH", "D"),  # the cap
    (4, "D", "D"),  # no spare left
])
@pytest.mark.parametrize("batch_size", [32, 3])  # all at once, or queued (groups wait for free rows)
def test_each_group_that_cannot_teach_brings_in_one_spare_within_the_cap(tiny_model, named, engines, cap, spares,
                                                                          released, batch_size):
    model, tokenizer = tiny_model
    built, running = engines
    step = [named[c] for c in "ABC"]
    batch, extra = dynamic_rollouts(model, tokenizer, scripted(named, KINDS), step, [named[c] for c in spares],
                                    PLAN.but(batch_size=batch_size), cap=cap)
    assert [p.id for p in batch.puzzles] == [named[c].id for c in "ABC" + released]
    assert extra == len(released) and len(batch.groups) == len(batch.prompts) == 3 + extra
    assert [informative(g) for g in batch.groups] == [KINDS[c] == "mixed" for c in "ABC" + released]
    assert all(len(g) == G and {e.puzzle_id for e in g} == {p.id} for g, p in zip(batch.groups, batch.puzzles))
    # one engine; with room in the batch, the replacements joined while the step's mixed group decoded
    assert len(built) == 1 and len(running) == G * extra and (running[0] > 0 or batch_size < 3 * G)
    # spare groups that were not needed (dropped, or beyond the cap) sampled nothing
    episodes = [e for g in batch.groups for e in g]
    assert batch.stats.completions == len(episodes) == G * (3 + extra)
    assert batch.stats.generated_tokens == sum(e.model_tokens for e in episodes)


def test_with_every_group_informative_it_samples_what_collect_rollouts_samples(tiny_model, named, engines):
    """Held spare groups cost the step's groups nothing: no token and no random draw."""
    model, tokenizer = tiny_model
    built, running = engines
    step = [named["A"], named["E"]]
    batch, extra = dynamic_rollouts(model, tokenizer, scripted(named, KINDS), step, [named["C"], named["B"]], PLAN,
                                    cap=2)
    plain = collect_rollouts(model, tokenizer, scripted(named, KINDS), step, PLAN)
    assert extra == 0 and running == [] and len(built) == 2
    assert [p.id for p in batch.puzzles] == [p.id for p in plain.puzzles] and batch.prompts == plain.prompts
    assert [[e.sample.token_ids for e in g] for g in batch.groups] == \
        [[e.sample.token_ids for e in g] for g in plain.groups]
    assert [[e.reward for e in g] for g in batch.groups] == [[e.reward for e in g] for g in plain.groups]
    assert batch.stats.completions == plain.stats.completions == 2 * G
    assert batch.stats.generated_tokens == plain.stats.generated_tokens


@pytest.mark.parametrize("batch_size", [32, 2])
def test_multi_turn_groups_are_finished_when_their_last_turns_are(tiny_model, named, engines, batch_size):
    """With later turns, a group is judged once every episode has ended (a failing answer gets a
    second turn first); the replacements' episodes take their turns too."""
    model, tokenizer = tiny_model
    built, _ = engines
    kinds = {"A": "mixed", "B": "pass", "C": "fail", "D": "fail", "E": "mixed"}
    plan = PLAN.but(max_turns=2, batch_size=batch_size)
    spares = [named[c] for c in "AED"]
    batch, extra = dynamic_rollouts(model, tokenizer, scripted(named, kinds), [named["B"], named["C"]], spares, plan,
                                    cap=3)
    assert extra == 2 and [p.id for p in batch.puzzles] == [named[c].id for c in "BCAE"]
    assert [informative(g) for g in batch.groups] == [False, False, True, True]
    episodes = [e for g in batch.groups for e in g]
    assert all(len(e.turns) == 1 for e in batch.groups[0])  # passed at once
    for e in episodes:  # a failed first answer answers again (unless its ids left the template)
        assert len(e.turns) == (1 if e.turns[0].verdict.public_ok or e.dropped else 2)
        assert e.solved == e.turns[-1].verdict.solved
    assert any(len(e.turns) == 2 for e in batch.groups[1])
    assert len(built) == 1 and batch.stats.completions == sum(len(e.turns) for e in episodes)
