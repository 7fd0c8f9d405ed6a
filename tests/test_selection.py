"""`puzzles.select: mixed` (mlx_swe_rl.rl.selection): `train` calibrates its candidate puzzles
with the initial weights, trains on the mixed ones, caches the choice in the run directory and
reuses it on --resume. On the tiny model with test_trainer's synthetic reward."""

from __future__ import annotations

import dataclasses
import json

import mlx.core as mx
import pytest

import mlx_swe_rl.rl.selection as selection
from mlx_swe_rl.rl.config import load_config
from mlx_swe_rl.rl.passrates import PassRates, restore
from mlx_swe_rl.rl.policy import lora_layers
from mlx_swe_rl.rl.trainer import TrainingError, eval_puzzles, train, training_puzzles
from test_trainer import ChoiceEnv, synth_cfg

PROBE = mx.array([[5, 17, 99, 3, 42, 7]])
SOLVED, FAILED = "digit_sum", "manhattan_distance"  # easy training puzzles the env always / never rewards


class PuzzleEnv(ChoiceEnv):
    """ChoiceEnv (about 40% of first tokens rewarded, so most groups are mixed), except that one
    puzzle always passes and one never does."""

    def score(self, items):
        out = super().score(items)
        for k, (puzzle_id, _) in enumerate(items):
            if puzzle_id in (SOLVED, FAILED):
                r = float(puzzle_id == SOLVED)
                out[k] = dataclasses.replace(out[k], reward=r, passed=int(r), solved=r == 1.0, parts={"choice": r})
        return out


@pytest.fixture(scope="module")
def chosen(tiny_model) -> list[str]:
    tokenizer = tiny_model[1]
    return [s for s in (tokenizer.decode([i]) for i in range(3, 500) if i % 6 == 0) if s.strip()]


def mixed_cfg(tmp_path, model_dir, name: str, *overrides: str):
    return synth_cfg(tmp_path, model_dir, name, "puzzles.split=train", "puzzles.select=mixed",
                     "puzzles.calibration.rounds=2", "train.save_every=1", "train.steps=2", *overrides)


def spy_calibrate(monkeypatch) -> list[dict]:
    calls, original = [], selection.calibrate

    def spy(model, tokenizer, env, puzzles, plan, **kwargs):
        layers = lora_layers(model)
        model.eval()
        # the settings it calibrates with: the resolved sampling plan and the calibration's own
        calls.append({"puzzles": [p.id for p in puzzles], "kwargs": {**dataclasses.asdict(plan), **kwargs},
                      "logits": model(PROBE),
                      "lora_b_zero": all(not mx.any(layer.lora_b != 0).item() for layer in layers),
                      "scales": [layer.scale for layer in layers]})
        return original(model, tokenizer, env, puzzles, plan, **kwargs)

    monkeypatch.setattr(selection, "calibrate", spy)
    return calls


def test_train_calibrates_and_trains_on_the_mixed_puzzles(tmp_path, tiny_model_dir, tiny_model, chosen, monkeypatch):
    calls = spy_calibrate(monkeypatch)
    cfg = mixed_cfg(tmp_path, tiny_model_dir, "mixed")
    logs: list[str] = []
    result = train(cfg, env=PuzzleEnv(chosen), progress=False, log=logs.append)
    candidates = [p.id for p in training_puzzles(cfg)]
    assert len(calls) == 1 and calls[0]["puzzles"] == candidates
    assert calls[0]["kwargs"].items() >= {"group_size": 8, "temperature": 1.0, "max_tokens": 3, "rounds": 2,
                                          "seed": cfg.seed}.items()  # null calibration keys follow sampling
    report = json.loads((cfg.run_dir / "calibration.json").read_text())
    mixed = [row["id"] for row in report["puzzles"] if row["category"] == "mixed"]
    by_id = {row["id"]: row["category"] for row in report["puzzles"]}
    assert by_id[SOLVED] == "all-solved" and by_id[FAILED] == "all-failed"
    assert 0 < len(mixed) < len(candidates)
    train_set = json.loads((cfg.run_dir / "train-set.json").read_text())
    assert train_set["puzzles"] == mixed and train_set["puzzle_dir"] is None  # the bundled puzzles
    assert {p for h in result.history for p in h.puzzles} <= set(mixed)
    assert any(line.startswith("calibrating 12 puzzles") for line in logs)
    assert any(f"training on the {len(mixed)} mixed puzzles" in line for line in logs)
    # the pass-rate estimates of the training puzzles start from their calibration outcomes
    rates = PassRates.from_json(json.loads((cfg.run_dir / "passrates.json").read_text()))
    assert list(rates.alpha) == mixed and rates.step == 2
    assert rates == restore(cfg.run_dir, None, 2, mixed, cfg.train.pass_rate_decay, cfg.run_dir / "calibration.json")
    assert rates != restore(cfg.run_dir, None, 2, mixed, cfg.train.pass_rate_decay, cfg.run_dir / "none.json")


def test_calibration_samples_the_base_model(tmp_path, tiny_model_dir, tiny_model, chosen, monkeypatch):
    """LoRA's B matrices start at zero, so the policy calibrated is exactly the base model."""
    calls = spy_calibrate(monkeypatch)
    cfg = mixed_cfg(tmp_path, tiny_model_dir, "base", "train.steps=1")
    train(cfg, env=PuzzleEnv(chosen), progress=False, log=lambda _: None)
    call = calls[0]
    assert call["lora_b_zero"] and call["scales"] and all(s == cfg.finetune.lora.scale for s in call["scales"])
    base, _ = tiny_model
    assert mx.array_equal(call["logits"], base(PROBE)).item()  # adapters on, and exactly the base model


def test_resume_reuses_the_cached_calibration(tmp_path, tiny_model_dir, chosen, monkeypatch):
    cfg = mixed_cfg(tmp_path, tiny_model_dir, "resume", "train.steps=3")
    train(cfg, env=PuzzleEnv(chosen), progress=False, log=lambda _: None, stop_after=1)
    before = (cfg.run_dir / "train-set.json").read_text()

    def refuse(*args, **kwargs):
        raise AssertionError("--resume must not calibrate again")

    monkeypatch.setattr(selection, "calibrate", refuse)
    logs: list[str] = []
    result = train(cfg, env=PuzzleEnv(chosen), progress=False, log=logs.append, resume=True)
    assert [h.step for h in result.history] == [2, 3]
    assert (cfg.run_dir / "train-set.json").read_text() == before
    assert any("mixed ones of the run's calibration" in line for line in logs)
    mixed = set(json.loads(before)["puzzles"])
    assert {p for h in result.history for p in h.puzzles} <= mixed

    # without its cache, a run with a checkpoint cannot be resumed (the weights are no longer initial)
    (cfg.run_dir / "train-set.json").unlink()
    with pytest.raises(TrainingError, match="no train-set.json") as info:
        train(cfg, env=PuzzleEnv(chosen), progress=False, log=lambda _: None, resume=True)
    assert "\n" not in str(info.value)


def test_no_mixed_puzzle_is_a_one_line_error(tmp_path, tiny_model_dir):
    cfg = mixed_cfg(tmp_path, tiny_model_dir, "none")
    with pytest.raises(TrainingError, match="none of the 12 candidate puzzles is mixed") as info:
        train(cfg, env=ChoiceEnv([]), progress=False, log=lambda _: None)  # never rewarded: all fail
    assert "\n" not in str(info.value)
    assert not (cfg.run_dir / "history.jsonl").exists() and not (cfg.run_dir / "train-set.json").exists()
    assert json.loads((cfg.run_dir / "calibration.json").read_text())["categories"] == {"all-failed": 12}


def test_greedy_calibration_is_refused_before_any_work(tmp_path, tiny_model_dir, chosen):
    env = PuzzleEnv(chosen)
    cfg = mixed_cfg(tmp_path, tiny_model_dir, "greedy", "puzzles.calibration.temperature=0")
    with pytest.raises(TrainingError, match="puzzles.calibration.temperature: must be > 0"):
        train(cfg, env=env, progress=False, log=lambda _: None)
    assert env.scored == 0 and not cfg.run_dir.exists()


def test_the_quick_start_selects_its_puzzles_itself():
    cfg = load_config("configs/quickstart.yaml")
    assert cfg.puzzles.select == "mixed" and cfg.puzzles.train_set is None
    candidates = training_puzzles(cfg)
    assert len(candidates) == 12 and {(p.tier, p.split) for p in candidates} == {("easy", "train")}
    assert selection.calibration_summary(cfg) == {"group_size": 8, "temperature": 0.8, "max_tokens": 192, "rounds": 4}
    evaluated = eval_puzzles(cfg, candidates)  # as before: every easy puzzle, train and held out
    assert len(evaluated) == 18 and {p.split for p in evaluated} == {"train", "heldout"}


class Killed(Exception):
    pass


def test_a_run_killed_while_calibrating_resumes_its_calibration(tmp_path, tiny_model_dir, chosen, monkeypatch,
                                                                 journal_killed_after):
    """Calibrating a large pool takes longer than a session: --resume calibrates only the puzzles
    the killed run had not finished (its journal), and a new run starts over."""
    from mlx_swe_rl.rl.journal import progress

    cfg = mixed_cfg(tmp_path, tiny_model_dir, "killed", "train.steps=1")
    journal = cfg.run_dir / "calibration.journal.jsonl"
    with journal_killed_after(5, Killed), pytest.raises(Killed):
        train(cfg, env=PuzzleEnv(chosen), progress=False, log=lambda _: None)
    assert progress(journal) == (5, 12) and not (cfg.run_dir / "calibration.json").exists()
    done = {json.loads(line)["row"]["id"] for line in journal.read_text().splitlines()[2:]}

    calls = spy_calibrate(monkeypatch)
    logs: list[str] = []
    result = train(cfg, env=PuzzleEnv(chosen), progress=False, log=logs.append, resume=True)
    assert calls[0]["kwargs"]["journal"].earlier[0]["puzzles"] == 5
    assert any("12 puzzles" in line and "5 finished before, in calibration.journal.jsonl" in line for line in logs)
    report = json.loads((cfg.run_dir / "calibration.json").read_text())
    assert [r["id"] for r in report["puzzles"]] == [p.id for p in training_puzzles(cfg)]
    assert {r["id"] for r in report["puzzles"] if r["id"] in done} == done
    assert len(report["timing"]["earlier_sessions"]) == 1 and not journal.exists()
    assert [h.step for h in result.history] == [1]

    # the same run started again without --resume calibrates from the start
    cfg2 = mixed_cfg(tmp_path, tiny_model_dir, "fresh", "train.steps=1")
    with journal_killed_after(5, Killed), pytest.raises(Killed):
        train(cfg2, env=PuzzleEnv(chosen), progress=False, log=lambda _: None)
    train(cfg2, env=PuzzleEnv(chosen), progress=False, log=lambda _: None)
    assert "earlier_sessions" not in json.loads((cfg2.run_dir / "calibration.json").read_text())["timing"]
