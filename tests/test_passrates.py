"""Pass-rate estimates and the choice of a step's puzzles (rl/passrates.py), without a model."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest

import mlx_swe_rl.rl.passrates as passrates
from mlx_swe_rl.rl.config import load_config
from mlx_swe_rl.rl.passrates import PRIOR, PassRateError, PassRates, choose, restore, step_puzzles


@dataclass(frozen=True)
class P:
    id: str


def outcomes(pid: str, solved: int, samples: int, error: bool = False) -> list[dict]:
    return [{"puzzle_id": pid, "solved": i < solved, **({"error": "oracle"} if error else {})} for i in range(samples)]


def test_the_calibration_seeds_the_estimates_and_rollouts_update_them():
    calibration = {"puzzles": [{"id": "a", "solved": 3, "samples": 8}, {"id": "gone", "solved": 1, "samples": 2}]}
    rates = PassRates.start(["a", "b"], decay=0.5, calibration=calibration)
    assert (rates.alpha, rates.beta) == ({"a": 4.0, "b": 1.0}, {"a": 6.0, "b": 1.0})  # no row for "b": the prior
    rates.observe(1, outcomes("a", 2, 2) + outcomes("b", 0, 8, error=True))
    # a: the earlier counts halved (beyond the prior), then two passes; b: error verdicts say nothing
    assert rates.alpha["a"] == 1 + 3 * 0.5 + 2 and rates.beta["a"] == 1 + 5 * 0.5
    assert (rates.alpha["b"], rates.beta["b"], rates.last_step["b"]) == (1.0, 1.0, 0)
    assert rates.last_step["a"] == 1 and rates.step == 1
    with pytest.raises(PassRateError, match="after step 1 cannot take step 3"):
        rates.observe(3, [])


def test_the_state_round_trips_through_json_exactly():
    rates = PassRates.start(["a", "b"], decay=0.93)
    for step in range(1, 6):
        rates.observe(step, outcomes("a", step % 3, 7) + outcomes("b", 1, 3))
    again = PassRates.from_json(json.loads(json.dumps(rates.to_json())))
    assert again == rates
    with pytest.raises(PassRateError, match="not a pass-rate state"):
        PassRates.from_json({"puzzles": {"a": {}}})


def test_rows_rank_the_most_learnable_first():
    rates = PassRates({"solved": 41.0, "mixed": 5.0, "never": 1.0}, {"solved": 1.0, "mixed": 5.0, "never": 41.0},
                      {"solved": 3, "mixed": 4, "never": 0})
    rows = rates.rows()
    assert [r["id"] for r in rows][0] == "mixed"
    mixed = rows[0]
    assert mixed["mean"] == 0.5 and mixed["outcomes"] == 8.0 and mixed["last_step"] == 4
    assert mixed["sd"] == pytest.approx(np.sqrt(25 / (100 * 11)))


# --- (d) the learnable order --------------------------------------------------------------------
def test_learnable_prefers_puzzles_near_one_half():
    puzzles = [P("always"), P("never"), P("mixed"), P("unmeasured")]
    rates = PassRates({"always": 41.0, "never": 1.0, "mixed": 21.0}, {"always": 1.0, "never": 41.0, "mixed": 21.0})
    firsts = Counter(rates.ranking(puzzles, seed=0, step=step)[0].id for step in range(1, 401))
    assert firsts["mixed"] > 0.6 * 400, firsts
    assert firsts["mixed"] > firsts["unmeasured"] > firsts["always"] + firsts["never"], firsts
    # a pure function of (state, seed, step)
    assert rates.ranking(puzzles, 0, 7) == rates.ranking(puzzles, 0, 7)
    assert [rates.ranking(puzzles, 0, s) for s in range(1, 30)] != [rates.ranking(puzzles, 1, s) for s in range(1, 30)]


def simulate(rates: PassRates, truth: dict[str, float], steps: int, per_step: int, group: int = 8) -> list[list[str]]:
    """`steps` learnable steps against fixed true pass rates; returns the ids chosen per step."""
    cfg = load_config(None, ["train.order=learnable", f"train.puzzles_per_step={per_step}"])
    puzzles = [P(pid) for pid in truth]
    chosen = []
    for step in range(rates.step + 1, rates.step + steps + 1):
        picked, spare = choose(cfg, puzzles, rates, step)
        assert spare == [] and len({p.id for p in picked}) == per_step  # no repeats in a step
        chosen.append([p.id for p in picked])
        rates.observe(step, [line for p in picked for line in outcomes(p.id, round(truth[p.id] * group), group)])
    return chosen


def test_learnable_comes_back_to_a_stale_puzzle():
    """A puzzle the calibration found never solved, that the policy has since learned to solve
    half the time: the estimate fades toward the prior until a draw picks the puzzle again, and
    from then on it is sampled like the other mixed ones."""
    truth = {"mixed-1": 0.5, "mixed-2": 0.5, "always": 1.0, "stale": 0.5}
    calibration = {"puzzles": [{"id": "mixed-1", "solved": 4, "samples": 8}, {"id": "mixed-2", "solved": 4, "samples": 8},
                               {"id": "always", "solved": 8, "samples": 8}, {"id": "stale", "solved": 0, "samples": 32}]}
    rates = PassRates.start(truth, decay=0.95, calibration=calibration)
    chosen = simulate(rates, truth, steps=200, per_step=2)
    first_visit = next(i for i, ids in enumerate(chosen, start=1) if "stale" in ids)
    assert first_visit <= 100, first_visit  # 68 here: two well-measured mixed puzzles compete for 2 places
    later = Counter(pid for ids in chosen[first_visit:] for pid in ids)
    assert later["stale"] > later["always"], later  # once seen mixed, it is learnable again
    # without fading (decay 1) the old measurement stands much longer
    frozen = PassRates.start(truth, decay=1.0, calibration=calibration)
    kept = simulate(frozen, truth, steps=first_visit, per_step=2)
    assert not any("stale" in ids for ids in kept)


# --- (c) the default order: unchanged, no extra random numbers -----------------------------------
def test_epoch_order_is_step_puzzles_and_draws_nothing_else(monkeypatch):
    puzzles = [P(f"p{i}") for i in range(10)]
    seeds = []
    original = np.random.default_rng

    def recording(seed=None):
        seeds.append(list(seed))
        return original(seed)

    monkeypatch.setattr(passrates.np.random, "default_rng", recording)
    cfg = load_config(None, ["seed=7", "train.puzzles_per_step=3"])
    rates = PassRates.start([p.id for p in puzzles], decay=0.95)
    for step in range(1, 8):
        chosen, spare = choose(cfg, puzzles, rates, step)
        assert chosen == step_puzzles(puzzles, step, 3, 7) and spare == []
        rates.observe(step, outcomes(chosen[0].id, 1, 2))
    assert seeds and all(len(s) == 2 for s in seeds)  # only step_puzzles' [seed, epoch] streams


def test_dynamic_sampling_spares_are_the_other_puzzles_in_a_seeded_order():
    puzzles = [P(f"p{i}") for i in range(10)]
    rates = PassRates.start([p.id for p in puzzles], decay=0.95)
    epoch = load_config(None, ["train.puzzles_per_step=3", "train.dynamic_sampling.enabled=true"])
    chosen, spare = choose(epoch, puzzles, rates, 4)
    assert chosen == step_puzzles(puzzles, 4, 3, 0)  # the step's own puzzles do not move
    assert {p.id for p in chosen} | {p.id for p in spare} == {p.id for p in puzzles}
    assert len(spare) == len({p.id for p in spare}) and not {p.id for p in chosen} & {p.id for p in spare}
    assert choose(epoch, puzzles, rates, 4) == (chosen, spare) and choose(epoch, puzzles, rates, 5)[1] != spare
    learnable = load_config(None, ["train.puzzles_per_step=3", "train.dynamic_sampling.enabled=true",
                                   "train.order=learnable"])
    chosen, spare = choose(learnable, puzzles, rates, 4)
    assert chosen + spare == rates.ranking(puzzles, 0, 4)


def test_restore_replays_the_rollouts_when_the_checkpoint_has_no_state(tmp_path):
    """A checkpoint written before pass rates existed: the calibration's estimates replayed
    with the rollouts up to its step give the state the run had."""
    calibration = {"puzzles": [{"id": "a", "solved": 1, "samples": 4}]}
    (tmp_path / "calibration.json").write_text(json.dumps(calibration))
    lines = [{"step": s, **line} for s in (1, 2, 3) for line in outcomes("a", s, 4) + outcomes("b", 0, 4)]
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines if line["step"] <= 2))
    expected = PassRates.start(["a", "b"], 0.9, calibration)
    for s in (1, 2):
        expected.observe(s, [line for line in lines if line["step"] == s])
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    assert restore(tmp_path, checkpoint, 2, ["a", "b"], 0.9, tmp_path / "calibration.json") == expected
    assert restore(tmp_path, checkpoint, 0, ["a", "b"], 0.9, tmp_path / "calibration.json") == \
        PassRates.start(["a", "b"], 0.9, calibration)
    (checkpoint / "passrates.json").write_text(json.dumps(expected.to_json()))
    (tmp_path / "rollouts.jsonl").write_text("")  # the saved state wins over a replay
    assert restore(tmp_path, checkpoint, 2, ["a", "b"], 0.9, tmp_path / "nothing.json") == expected
    (checkpoint / "passrates.json").write_text("{}")
    with pytest.raises(PassRateError, match="passrates.json: not a pass-rate state"):
        restore(tmp_path, checkpoint, 2, ["a", "b"], 0.9, tmp_path / "calibration.json")
    assert PRIOR == (1.0, 1.0)
