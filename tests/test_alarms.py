"""Alarms (mlx_swe_rl.rl.alarms): each trips on a scripted broken run and stays quiet on a
healthy one; once through the trainer, where a record carries the alarm and the line is printed
once."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from mlx_swe_rl.rl import alarms
from mlx_swe_rl.rl.config import AlarmConfig, load_config
from mlx_swe_rl.runfiles import StepRecord

MAX_TOKENS = 192
DEFAULTS = AlarmConfig()


def step(n: int, **changes) -> StepRecord:
    """A healthy step record (the quick start's shape of numbers); `changes` break it. The
    fields the alarms do not read stay as an old history line's would: None."""
    record = {"step": n, "reward_mean": 0.3, "solve_rate": 0.3, "loss": 0.01, "kl": None, "clip_frac": 0.0,
              "grad_norm": 0.4, "zero_var_frac": 0.33, "loss_completions": 16, "completion_len": 140.0,
              "truncation_rate": 0.1}
    record.update(changes)
    return StepRecord.from_json(record)


def healthy(n: int = 16) -> list[StepRecord]:
    """The recorded quick start's completion lengths and truncation rates
    (docs/results/quickstart.json), with rewards slowly rising: nothing is wrong."""
    lengths = [134.2, 81.3, 134.1, 111.1, 147.2, 143.8, 124.9, 154.7, 131.4, 120.5, 157.3, 156.5, 126.0, 162.3,
               148.4, 158.7]
    truncation = [0.21, 0.0, 0.12, 0.17, 0.29, 0.29, 0.08, 0.38, 0.12, 0.04, 0.17, 0.25, 0.12, 0.21, 0.12, 0.5]
    return [step(i + 1, completion_len=lengths[i], truncation_rate=truncation[i], reward_mean=0.2 + 0.01 * i,
                 zero_var_frac=[0.33, 0.67, 1.0][i % 3], kl=0.01 * i, clip_frac=0.05)
            for i in range(n)]


def trips(history, evals=(), settings=DEFAULTS) -> list[str]:
    """Names of the alarms that trip first at some step of `history`, replayed step by step
    the way the trainer records them."""
    replay, names = [], []
    for record in history:
        replay.append(replace(record))
        new = alarms.new_alarms(replay, [e for e in evals if e[0] < record.step], settings, MAX_TOKENS)
        if new:
            replay[-1].alarms = alarms.as_records(new)
            names += [a.name for a in new]
    return names


def test_a_healthy_run_raises_no_alarm():
    evals = [(0, 0.30), (4, 0.32), (8, 0.33), (12, 0.31)]  # noise within eval_drop
    assert trips(healthy(), evals) == []


# (name, a history where it must trip, the step at which it first does)
BROKEN = {
    "no_gradient": ([step(1), step(2, grad_norm=0.0)], 2),
    "lora_b_zero": ([step(1, lora_b_zero=True)], 1),
    "zero_variance": ([step(1, zero_var_frac=0.9), step(2, zero_var_frac=1.0), step(3, zero_var_frac=0.8)], 3),
    "truncation": ([step(i, truncation_rate=r) for i, r in enumerate([0.2, 0.5, 0.6, 0.97], 1)], 4),
    "length_limit": ([step(i, completion_len=n) for i, n in enumerate([120, 135, 150, 165, 180, 190], 1)], 5),
    "kl": ([step(1, kl=0.05), step(2, kl=1.7)], 2),
    "clip_frac": ([step(1, clip_frac=0.1), step(2, clip_frac=0.45)], 2),
}
ALARM_OF = {"lora_b_zero": "no_gradient"}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_alarm_trips_once_on_its_scripted_run(case):
    history, first = BROKEN[case]
    history = history + [replace(history[-1], step=history[-1].step + k) for k in (1, 2)]  # it persists
    replay, tripped_at = [], []
    for record in history:
        replay.append(replace(record))
        new = alarms.new_alarms(replay, [], DEFAULTS, MAX_TOKENS)
        if new:
            replay[-1].alarms = alarms.as_records(new)
            tripped_at += [(record.step, a.name, a.message) for a in new]
    assert [(s, n) for s, n, _ in tripped_at] == [(first, ALARM_OF.get(case, case))]  # once, at the first step
    message = tripped_at[0][2]
    assert message and "\n" not in message


def recorded_runs() -> dict[str, list[StepRecord]]:
    """Step curves of the project's recorded runs (docs/results), as history records."""
    results = Path(__file__).resolve().parents[1] / "docs" / "results"
    runs = {name: run["curves"] for name, run in json.loads((results / "learn.json").read_text())["runs"].items()}
    runs |= {f"{name} (stop)": run["curves"]
             for name, run in json.loads((results / "learn-stop.json").read_text())["runs"].items()}
    quick = json.loads((results / "quickstart.json").read_text())
    runs |= {f"quickstart {key}": quick[key] for key in ("mask_truncated: false (the quick start)",
                                                          "mask_truncated: true",
                                                          "stop_after_answer (the quick start, 2026-12-01)")}
    keys = ("reward_mean", "completion_len", "truncation_rate", "zero_var_frac")
    return {name: [step(i + 1, **{k: c[k][i] for k in keys if k in c}) for i in range(len(c["reward_mean"]))]
            for name, c in runs.items()}


@pytest.mark.parametrize("name, expected", [
    # seed 0 of the learning experiment: 97% of its completions truncated by step 15
    ("onpolicy-s0", [(7, "length_limit"), (12, "truncation")]),
    # the quick start with truncated completions masked: every completion truncated by step 15
    ("quickstart mask_truncated: true", [(11, "length_limit"), (12, "truncation")]),
    ("onpolicy-s1", []), ("frozen-s0", []), ("drgrpo-s0", []),
    ("quickstart mask_truncated: false (the quick start)", []),
    # the same experiment and the quick start with completions ended at the answer: no alarm
    ("onpolicy-s0 (stop)", []), ("onpolicy-s1 (stop)", []), ("frozen-s0 (stop)", []),
    ("quickstart stop_after_answer (the quick start, 2026-12-01)", []),
])
def test_recorded_runs(name, expected):
    """The runs docs/results records: the two whose lengths ran into the limit trip well before
    their end; the others stay quiet."""
    replay, tripped = [], []
    for record in recorded_runs()[name]:
        replay.append(replace(record))
        new = alarms.new_alarms(replay, [], DEFAULTS, MAX_TOKENS)
        replay[-1].alarms = alarms.as_records(new)
        tripped += [(record.step, a.name) for a in new]
    assert tripped == expected


def test_no_gradient_needs_completions_in_the_loss():
    # grad_norm 0 because every group had equal rewards is not a broken gradient
    assert trips([step(1, grad_norm=0.0, loss_completions=0)]) == []
    assert trips([step(1, grad_norm=1e-9)]) == []
    assert trips([step(1, lora_b_zero=False)]) == []


def test_rate_alarms_need_the_whole_streak():
    interrupted = [step(1, zero_var_frac=0.9), step(2, zero_var_frac=0.5), step(3, zero_var_frac=0.9),
                   step(4, zero_var_frac=0.85)]
    assert trips(interrupted) == []
    assert trips(interrupted + [step(5, zero_var_frac=0.8)]) == ["zero_variance"]
    # a single step at the truncation threshold (the quick start's last step) is not a streak
    assert trips([step(1), step(2), step(3, truncation_rate=0.5)]) == []


def test_length_limit_reads_the_trend_not_one_noisy_step():
    assert trips([step(1), step(2), step(3, completion_len=180), step(4), step(5)]) == []
    assert trips([step(i, completion_len=MAX_TOKENS) for i in (1, 2)]) == ["length_limit"]
    # a higher threshold keeps the same rise quiet
    assert trips(BROKEN["length_limit"][0][:5], settings=AlarmConfig(length_frac=0.95)) == []


def test_kl_and_clip_thresholds_are_config_keys():
    kl_run = BROKEN["kl"][0]
    assert trips(kl_run, settings=AlarmConfig(kl_max=2.0)) == []
    assert trips([step(1, kl=None)]) == []  # beta = 0: no KL recorded
    assert trips(BROKEN["clip_frac"][0], settings=AlarmConfig(clip_frac_max=0.5)) == []


def test_reward_rising_while_the_eval_falls():
    rising = [step(i, reward_mean=0.2 + 0.05 * i) for i in range(1, 9)]
    falling = [(0, 0.30), (4, 0.40), (8, 0.25)]
    assert trips(rising + [step(9, reward_mean=0.65)], falling) == ["reward_vs_eval"]
    # either half alone is quiet: eval falling with flat rewards, rewards rising with the eval
    flat = [step(i) for i in range(1, 10)]
    assert trips(flat, falling) == []
    assert trips(rising + [step(9, reward_mean=0.65)], [(0, 0.30), (4, 0.40), (8, 0.42)]) == []
    # a fall within eval_drop is noise
    assert trips(rising + [step(9, reward_mean=0.65)], [(0, 0.30), (4, 0.40), (8, 0.37)]) == []


def test_alarms_can_be_switched_off():
    off = AlarmConfig(enabled=False)
    for history, _ in BROKEN.values():
        assert trips(history, settings=off) == []


def test_an_alarm_recorded_before_a_resume_is_not_repeated():
    history = BROKEN["kl"][0]
    earlier = [replace(history[0]), replace(history[1], alarms=[{"name": "kl", "message": "..."}])]
    assert alarms.new_alarms(earlier + [step(3, kl=2.0)], [], DEFAULTS, MAX_TOKENS) == []


def test_eval_points_read_the_run_directory(tmp_path):
    def report(score):
        return {"totals": [{"tier": "easy", "split": "all", "pass@1": 0.9},
                           {"tier": "all", "split": "all", "pass@1": score}]}

    for name, score in [("eval-before", 0.25), ("eval-step-0004", 0.5), ("eval-step-0008", 0.125),
                        ("eval-after", 0.9)]:
        (tmp_path / f"{name}.json").write_text(json.dumps(report(score)))
    (tmp_path / "eval-step-0006.json").write_text("{not json")  # half-written: skipped
    assert alarms.eval_points(tmp_path, before_step=9) == [(0, 0.25), (4, 0.5), (8, 0.125)]
    assert alarms.eval_points(tmp_path, before_step=8) == [(0, 0.25), (4, 0.5)]  # a killed run's later file


def test_line_fit():
    assert alarms.line_fit([5.0]) == (0.0, 5.0)
    slope, last = alarms.line_fit([1.0, 3.0, 5.0])
    assert slope == pytest.approx(2.0) and last == pytest.approx(5.0)


# ------------------------------------------------------------------------------ through the trainer
def run_synthetic(tmp_path, model_dir, tokenizer, name: str,
                  *overrides: str) -> tuple[list[StepRecord], list[dict], list[str]]:
    """A short training on test_trainer's synthetic env: (returned history, history.jsonl, log)."""
    from test_trainer import ChoiceEnv, synth_cfg

    from mlx_swe_rl.rl.trainer import train

    chosen = [s for s in (tokenizer.decode([i]) for i in range(3, 500) if i % 6 == 0) if s.strip()]
    cfg = synth_cfg(tmp_path, model_dir, name, "train.puzzles_per_step=4", *overrides)
    logs: list[str] = []
    history = train(cfg, env=ChoiceEnv(chosen), progress=False, log=logs.append).history
    lines = [json.loads(line) for line in (cfg.run_dir / "history.jsonl").read_text().splitlines()]
    return history, lines, logs


def test_the_trainer_records_an_alarm_and_prints_it_once(tmp_path, tiny_model_dir, tiny_model):
    """With a learning rate of 0 the LoRA B matrices are still exactly zero after the first
    update: that step's record says so (`lora_b_zero`), carries the no_gradient alarm, and the
    alarm's line is printed once although the condition lasts."""
    tokenizer = tiny_model[1]
    history, lines, logs = run_synthetic(tmp_path, tiny_model_dir, tokenizer, "lr0", "optim.lr=0.0", "train.steps=3")
    first = next(i for i, h in enumerate(lines) if h["loss_completions"])
    assert lines[first]["lora_b_zero"] is True
    assert sum("lora_b_zero" in h for h in lines) == 1  # checked once, after the first update
    message = alarms.no_gradient([StepRecord.from_json(h) for h in lines[:first + 1]], AlarmConfig())
    assert {"name": "no_gradient", "message": message} in lines[first]["alarms"]
    recorded = [(h["step"], a["name"], a["message"]) for h in lines for a in h.get("alarms", [])]
    assert len(recorded) == len({name for _, name, _ in recorded})  # each alarm in one record only
    printed = [line for line in logs if line.startswith("ALARM")]
    assert printed == [f"ALARM {name} at step {s}: {m}" for s, name, m in recorded]
    assert sum(line.startswith("ALARM no_gradient") for line in printed) == 1
    assert [h.to_json() for h in history] == lines  # what train() returns is what it wrote


def test_the_trainer_stays_quiet_when_learning_or_switched_off(tmp_path, tiny_model_dir, tiny_model):
    tokenizer = tiny_model[1]
    _, lines, _ = run_synthetic(tmp_path, tiny_model_dir, tokenizer, "learning", "train.steps=2")
    first = next(h for h in lines if h["loss_completions"])
    assert first["lora_b_zero"] is False
    assert not any(a["name"] == "no_gradient" for h in lines for a in h.get("alarms", []))
    _, lines, logs = run_synthetic(tmp_path, tiny_model_dir, tokenizer, "switched-off", "optim.lr=0.0", "train.steps=2",
                                   "alarms.enabled=false")
    assert not any("alarms" in h for h in lines) and not any(line.startswith("ALARM") for line in logs)
