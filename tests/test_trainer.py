"""The GRPO trainer (mlx_swe_rl.trainer) end to end on the tiny random model.

Most tests replace the sandboxed code-fix environment with a synthetic one whose prompts are
short and whose reward is 1 when a completion starts with one of a fixed set of tokens, so a
working policy gradient visibly raises the reward within a few seconds (and a flipped one
visibly lowers it). One test runs the real command line with the real sandbox.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest
from click.testing import CliRunner
from mlx.utils import tree_flatten

import mlx_swe_rl.rl.policy as policy_module
import mlx_swe_rl.rl.rundir as rundir
import mlx_swe_rl.rl.trainer as trainer_module
from mlx_swe_rl.env.verdict import Verdict
from mlx_swe_rl.models import fastmath
from mlx_swe_rl.rl.config import load_config
from mlx_swe_rl.rl.policy import SequenceBatch, adapters_off, completion_log_probs, lora_layers, prepare_policy
from mlx_swe_rl.rl.rollouts import collect_rollouts
from mlx_swe_rl.rl.passrates import step_puzzles
from mlx_swe_rl.rl.trainer import (TrainingError, build_policy, make_optimizer, run_step, step_seed, train, training_puzzles)
from mlx_swe_rl.runfiles import run_in_use

HISTORY_KEYS = ("step", "reward_mean", "solve_rate", "loss", "kl", "entropy", "clip_frac", "zero_var_frac",
                "completion_len", "truncation_rate", "tokens_per_s", "step_s", "peak_memory_gb")


# ------------------------------------------------------------------------------ synthetic env
class ChoiceEnv:
    """Short prompts; reward 1.0 when the completion text starts with one of `chosen`."""

    def __init__(self, chosen: list[str]):
        self.chosen = chosen
        self.scored = 0

    def prompt_for(self, puzzle_id: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": puzzle_id.replace("_", " ")}]

    def stop_rule(self, puzzle_id: str) -> None:  # completions run to EOS or the limit
        return None

    def reward(self, text: str) -> float:
        return 1.0 if any(text.startswith(c) for c in self.chosen) else 0.0

    def score(self, items):
        out = []
        for puzzle_id, text in items:
            r = self.reward(text)
            out.append(Verdict(puzzle_id, r, r == 1.0, None, None, {"choice": r}, passed=int(r), total=1))
        self.scored += len(items)
        return out


@pytest.fixture(autouse=True)
def seeded_global_rng():
    """build_policy does not seed MLX's global RNG before LoRA's random init of lora_a (see
    test_same_seed_gives_the_same_lora_init), so seed it here: runs then start alike."""
    mx.random.seed(1234)


@pytest.fixture(scope="module")
def chosen(tiny_model) -> list[str]:
    """Decoded strings of token ids 3 <= i < 500 with i % 6 == 0 (about 40% of a random start)."""
    tokenizer = tiny_model[1]
    return [s for s in (tokenizer.decode([i]) for i in range(3, 500) if i % 6 == 0) if s.strip()]


@pytest.fixture
def env(chosen) -> ChoiceEnv:
    return ChoiceEnv(chosen)


def synth_cfg(tmp_path, model_dir, name: str, *overrides: str, mode: str = "lora"):
    """A config for the synthetic env; later overrides win."""
    base = [f"model.spec={model_dir}", f"output_dir={tmp_path}", f"run_name={name}", "puzzles.tiers=[easy]",
            "sampling.max_tokens=3", "sampling.group_size=8", "sampling.temperature=1.0",
            "train.final_eval=false", "train.save_every=100", "grpo.beta=0.0", f"finetune.mode={mode}",
            "optim.lr=0.03" if mode == "lora" else "optim.lr=0.001", "train.steps=3",
            "train.puzzles_per_step=2", "train.micro_batch_size=64"]
    return load_config(None, base + list(overrides))


def quiet(_: str) -> None:
    pass


def rewards(result) -> list[float]:
    return [h.reward_mean for h in result.history]


def flip_advantages(monkeypatch) -> None:
    original = trainer_module.group_advantages

    def flipped(r, method):
        adv, valid = original(r, method)
        return -adv, valid

    monkeypatch.setattr(trainer_module, "group_advantages", flipped)


def trainable(model) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}


# ------------------------------------------------------------------------------ 1. learning
# (mode, overrides). Rise of the mean reward from the first 5 steps to the last 10, measured on
# this machine over cfg.seed 0-3 (and, for LoRA, three LoRA inits):
#   full: +0.45 .. +0.55, flipped sign -0.38 .. -0.43
#   lora: +0.20 .. +0.50, flipped sign -0.20 .. -0.36
# The thresholds below keep about 2x headroom on the worst case seen.
LEARNING = {
    "full": ("full", ["optim.lr=0.001", "train.steps=30", "train.puzzles_per_step=4", "train.micro_batch_size=32"]),
    "lora": ("lora", ["optim.lr=0.03", "train.steps=40", "train.puzzles_per_step=8", "train.micro_batch_size=64"]),
}
RISE = {"full": 0.25, "lora": 0.1}  # required rise of last-10 over first-5
FALL = {"full": 0.2, "lora": 0.1}  # required fall with the advantage sign flipped
SEED = 0


def learning_run(tmp_path, model_dir, env, key: str, name: str) -> tuple[float, float, list[float]]:
    mode, overrides = LEARNING[key]
    cfg = synth_cfg(tmp_path, model_dir, name, *overrides, f"seed={SEED}", mode=mode)
    r = rewards(train(cfg, env=env, progress=False, log=quiet))
    assert len(r) == cfg.train.steps
    return sum(r[:5]) / 5, sum(r[-10:]) / 10, r


@pytest.mark.parametrize("key", ["full", "lora"])
def test_grpo_raises_the_reward(tmp_path, tiny_model_dir, env, key):
    first, last, r = learning_run(tmp_path, tiny_model_dir, env, key, f"learn-{key}")
    print(f"{key}: first-5 {first:.3f} -> last-10 {last:.3f} ({last - first:+.3f})")
    assert last >= first + RISE[key], [round(x, 2) for x in r]


@pytest.mark.parametrize("key", ["full", "lora"])
def test_flipped_advantage_sign_lowers_the_reward(tmp_path, tiny_model_dir, env, key, monkeypatch):
    flip_advantages(monkeypatch)
    first, last, r = learning_run(tmp_path, tiny_model_dir, env, key, f"flip-{key}")
    print(f"{key} flipped: first-5 {first:.3f} -> last-10 {last:.3f} ({last - first:+.3f})")
    assert last <= first - FALL[key], [round(x, 2) for x in r]


# ------------------------------------------------------------------------------ 2. reference
def test_adapters_off_is_exactly_the_base_model(tiny_model_dir, tiny_model):
    from mlx_swe_rl.models.specs import load_model

    base, tokenizer = tiny_model
    model, _ = load_model(str(tiny_model_dir))
    cfg = load_config(None, ["finetune.mode=lora", "finetune.lora.rank=4"])
    prepare_policy(model, cfg.finetune)
    layers = lora_layers(model)
    assert layers and all(layer.scale == cfg.finetune.lora.scale for layer in layers)
    mx.random.seed(1)
    for layer in layers:
        layer.lora_b = mx.random.normal(layer.lora_b.shape) * 0.05
    model.eval()

    prompts = [tokenizer.encode("def add_one(x):"), tokenizer.encode("return x")]
    completions = [tokenizer.encode(" + 1\n"), tokenizer.encode(" - 1 if x else 0")]
    batch = SequenceBatch.build(prompts, completions)
    expected, _ = completion_log_probs(base, batch)
    with adapters_off(model) as reference:
        assert reference is model
        assert all(layer.scale == 0.0 for layer in layers)
        off, _ = completion_log_probs(reference, batch)
    on, _ = completion_log_probs(model, batch)
    assert all(layer.scale == cfg.finetune.lora.scale for layer in layers)
    assert mx.array_equal(off, expected).item()
    assert not np.allclose(np.array(on), np.array(expected), atol=1e-3)  # the adapters matter when on

    with pytest.raises(KeyError):  # scales come back even when the body raises
        with adapters_off(model):
            raise KeyError("boom")
    assert all(layer.scale == cfg.finetune.lora.scale for layer in layers)


# ------------------------------------------------------------------------------ 3. KL
def count_adapters_off(monkeypatch) -> list[int]:
    calls = [0]
    original = policy_module.adapters_off

    def counting(model):
        calls[0] += 1
        return original(model)

    monkeypatch.setattr(policy_module, "adapters_off", counting)
    return calls


def test_kl_is_zero_at_the_start_then_positive(tmp_path, tiny_model_dir, env, monkeypatch):
    calls = count_adapters_off(monkeypatch)
    cfg = synth_cfg(tmp_path, tiny_model_dir, "kl", "grpo.beta=0.04", "train.puzzles_per_step=4")
    history = train(cfg, env=env, progress=False, log=quiet).history
    assert all(h.loss_completions > 0 for h in history)
    assert history[0].kl == pytest.approx(0.0, abs=1e-7)
    assert all(h.kl > 0 for h in history[1:]), [h.kl for h in history]
    assert calls[0] >= len(history)  # the reference forward ran (adapters off) every step


def test_beta_zero_skips_the_reference(tmp_path, tiny_model_dir, env, monkeypatch):
    calls = count_adapters_off(monkeypatch)
    cfg = synth_cfg(tmp_path, tiny_model_dir, "nokl", "grpo.beta=0.0", "train.steps=2")
    history = train(cfg, env=env, progress=False, log=quiet).history
    assert any(h.loss_completions > 0 for h in history)
    assert [h.kl for h in history] == [None, None]
    assert calls[0] == 0


def test_reference_runs_once_per_group_whatever_the_micro_batch(tmp_path, tiny_model_dir, env, monkeypatch):
    # The reference forward keeps no activations, so it takes whole groups (one prompt pass per
    # group) while the backward goes in micro-batches of 2; the step is the same as with one
    # micro-batch per group, up to float rounding.
    calls = count_adapters_off(monkeypatch)
    records = {}
    for size in (2, 64):
        mx.random.seed(1234)
        cfg = synth_cfg(tmp_path, tiny_model_dir, f"mb{size}", "grpo.beta=0.04", "train.steps=2",
                        f"train.micro_batch_size={size}")
        before = calls[0]
        records[size] = train(cfg, env=env, progress=False, log=quiet).history
        groups = sum(h.groups_kept for h in records[size])
        assert calls[0] - before == groups  # once per kept group, not once per micro-batch
    for small, whole in zip(records[2], records[64]):
        assert small.reward_mean == whole.reward_mean
        for key in ("loss", "kl", "grad_norm", "entropy"):
            assert getattr(small, key) == pytest.approx(getattr(whole, key), rel=1e-4, abs=1e-7), key


# ------------------------------------------------------------------------------ 4. resume
ADAPTER_TOL = dict(rtol=1e-5, atol=1e-6)  # float32 round-trips exactly; this only allows for kernel noise


def history_lines(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines() if line.strip()]


def assert_same_adapters(dir_a, dir_b) -> None:
    a = mx.load(str(dir_a / "adapters.safetensors"))
    b = mx.load(str(dir_b / "adapters.safetensors"))
    assert a.keys() == b.keys() and a
    for key in a:
        np.testing.assert_allclose(np.array(b[key]), np.array(a[key]), err_msg=key, **ADAPTER_TOL)


@pytest.fixture(scope="module")
def resumed_runs(tmp_path_factory, tiny_model_dir, chosen):
    """Run A: 6 steps straight. Run B: killed after step 5 (last checkpoint: 4), then resumed.
    Both keep the adapters of steps 3 and 6 (train.keep_every)."""
    root = tmp_path_factory.mktemp("resume")
    opts = ("train.steps=6", "train.save_every=2", "train.keep_every=3")
    cfg_a = synth_cfg(root, tiny_model_dir, "a", *opts)
    cfg_b = synth_cfg(root, tiny_model_dir, "b", *opts)
    mx.random.seed(99)  # the same LoRA init for both runs (see seeded_global_rng)
    a = train(cfg_a, env=ChoiceEnv(chosen), progress=False, log=quiet)
    mx.random.seed(99)
    killed = train(cfg_b, env=ChoiceEnv(chosen), progress=False, log=quiet, stop_after=5)
    checkpoint_step = json.loads((cfg_b.run_dir / "checkpoint" / "state.json").read_text())["step"]
    killed_steps = [h["step"] for h in history_lines(cfg_b.run_dir)]
    logs = []
    b = train(cfg_b, env=ChoiceEnv(chosen), progress=False, log=logs.append, resume=True)
    return dict(root=root, a=a, b=b, cfg_a=cfg_a, cfg_b=cfg_b, killed=killed, checkpoint_step=checkpoint_step,
                killed_steps=killed_steps, logs=logs)


def test_same_seed_gives_the_same_lora_init(tmp_path, tiny_model_dir):
    cfg = synth_cfg(tmp_path, tiny_model_dir, "init")
    mx.random.seed(1)  # whatever state earlier work left behind
    first = trainable(build_policy(cfg).model)
    mx.random.seed(2)
    second = trainable(build_policy(cfg).model)
    assert first.keys() == second.keys() and first
    assert all(np.array_equal(first[k], second[k]) for k in first)


def test_kill_and_resume_reproduces_the_uninterrupted_run(resumed_runs):
    r = resumed_runs
    a_dir, b_dir = r["cfg_a"].run_dir, r["cfg_b"].run_dir
    assert [h.step for h in r["killed"].history] == [1, 2, 3, 4, 5]
    assert r["checkpoint_step"] == 4 and r["killed_steps"] == [1, 2, 3, 4, 5]
    assert any("after step 4" in line for line in r["logs"])
    assert [h.step for h in r["b"].history] == [5, 6]
    assert_same_adapters(a_dir, b_dir)
    assert_same_adapters(a_dir / "checkpoint", b_dir / "checkpoint")
    hist_a, hist_b = history_lines(a_dir), history_lines(b_dir)
    assert [h["step"] for h in hist_b] == [1, 2, 3, 4, 5, 6]
    assert [h["reward_mean"] for h in hist_b] == [h["reward_mean"] for h in hist_a]
    assert [h["puzzles"] for h in hist_b] == [h["puzzles"] for h in hist_a]
    for ha, hb in zip(hist_a, hist_b):
        assert hb["loss"] == pytest.approx(ha["loss"], rel=1e-4, abs=1e-6)
    assert json.loads((b_dir / "checkpoint" / "state.json").read_text())["step"] == 6
    assert not (b_dir / "checkpoint-new").exists() and not (b_dir / "checkpoint-old").exists()


def test_kept_adapters_survive_a_resume_and_make_a_soup(resumed_runs, tmp_path):
    from click.testing import CliRunner
    from mlx_swe_rl.cli.app import main
    from mlx_swe_rl.rl.rundir import kept_adapters

    a_dir, b_dir = resumed_runs["cfg_a"].run_dir, resumed_runs["cfg_b"].run_dir
    for run in (a_dir, b_dir):
        assert [p.name for p in kept_adapters(run)] == ["step-00003", "step-00006"]
        assert json.loads((run / "kept" / "step-00003" / "state.json").read_text())["step"] == 3
    for name in ("step-00003", "step-00006"):  # the resumed run kept what the straight one did
        assert_same_adapters(a_dir / "kept" / name, b_dir / "kept" / name)
    assert_same_adapters(a_dir / "kept" / "step-00006", a_dir)  # the last kept is the final adapter
    step3, step6 = (trainable_file(a_dir / "kept" / n) for n in ("step-00003", "step-00006"))
    assert any(not np.array_equal(step3[k], step6[k]) for k in step3)  # copies of different steps

    result = CliRunner().invoke(main, ["soup", str(a_dir), "--last", "2", "--out", str(tmp_path / "soup")])
    assert result.exit_code == 0, result.output
    mean = trainable_file(tmp_path / "soup")
    for k in mean:
        np.testing.assert_allclose(mean[k], (step3[k] + step6[k]) / 2, rtol=1e-6, atol=1e-7)
    too_many = CliRunner().invoke(main, ["soup", str(a_dir), "--last", "3", "--out", str(tmp_path / "x")])
    assert too_many.exit_code == 1 and "kept 2 adapter(s)" in too_many.output
    two_runs = CliRunner().invoke(main, ["soup", str(a_dir), str(b_dir), "--last", "2", "--out", str(tmp_path / "y")])
    assert two_runs.exit_code == 1 and "give one run directory, not 2 paths" in two_runs.output


def trainable_file(directory) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in mx.load(str(directory / "adapters.safetensors")).items()}


def test_resume_does_not_duplicate_rollouts(resumed_runs):
    lines = (resumed_runs["cfg_b"].run_dir / "rollouts.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines]
    per_step = resumed_runs["cfg_b"].sampling.group_size * resumed_runs["cfg_b"].train.puzzles_per_step
    assert steps == sorted(steps)
    assert {s: steps.count(s) for s in set(steps)} == {s: per_step for s in range(1, 7)}


def test_resume_errors(resumed_runs, tiny_model_dir, chosen):
    r = resumed_runs
    root = r["root"]
    env = ChoiceEnv(chosen)
    steps_before = len(history_lines(r["cfg_a"].run_dir))
    with pytest.raises(TrainingError, match="no run in"):
        train(synth_cfg(root, tiny_model_dir, "never-ran"), env=env, progress=False, log=quiet, resume=True)
    with pytest.raises(TrainingError, match="already holds a run"):
        train(r["cfg_a"], env=env, progress=False, log=quiet)
    changed = synth_cfg(root, tiny_model_dir, "a", "train.steps=6", "train.save_every=2", "grpo.beta=0.04")
    with pytest.raises(TrainingError, match="'grpo'") as info:
        train(changed, env=env, progress=False, log=quiet, resume=True)
    assert "\n" not in str(info.value)
    assert env.scored == 0  # refused before any work
    assert len(history_lines(r["cfg_a"].run_dir)) == steps_before
    config_before = (r["cfg_a"].run_dir / "config.yaml").read_text()
    with run_in_use(r["cfg_a"].run_dir):  # as if a forgotten background run were still going
        with pytest.raises(TrainingError, match="is being trained by another process"):
            train(r["cfg_a"], env=env, progress=False, log=quiet, resume=True)
    assert env.scored == 0
    assert (r["cfg_a"].run_dir / "config.yaml").read_text() == config_before
    assert len(history_lines(r["cfg_a"].run_dir)) == steps_before


def test_resume_may_extend_the_run(resumed_runs, tiny_model_dir, chosen):
    r = resumed_runs
    longer = synth_cfg(r["root"], tiny_model_dir, "a", "train.steps=7", "train.save_every=2")
    result = train(longer, env=ChoiceEnv(chosen), progress=False, log=quiet, resume=True)
    assert [h.step for h in result.history] == [7]
    assert [h["step"] for h in history_lines(longer.run_dir)] == list(range(1, 8))
    assert json.loads((longer.run_dir / "checkpoint" / "state.json").read_text())["step"] == 7


def test_a_run_saved_before_a_key_existed_resumes_with_its_default(tmp_path):
    """A config.yaml written by an older version lacks later keys; they count as their defaults
    (the behaviour the run had), so it resumes; a key this version does not know, or a changed
    value, still refuses."""
    import yaml
    cfg = load_config(None, ["train.steps=4"])
    old = rundir.to_dict(cfg)
    del old["multi_turn"], old["puzzles"]["select"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    rundir.check_resumable(tmp_path, load_config(None, ["train.steps=8"]))
    with pytest.raises(TrainingError, match="'optim'"):
        rundir.check_resumable(tmp_path, load_config(None, ["optim.lr=0.5"]))
    with pytest.raises(TrainingError, match="'multi_turn'"):
        rundir.check_resumable(tmp_path, load_config(None, ["multi_turn.max_turns=2"]))
    # the data order and dynamic sampling shape the weights: an old run resumes as it ran (epoch, off)
    for key in ("order", "pass_rate_decay", "dynamic_sampling"):
        del old["train"][key]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    rundir.check_resumable(tmp_path, load_config(None, ["train.steps=8"]))
    for change in ("train.order=learnable", "train.dynamic_sampling.enabled=true", "train.pass_rate_decay=0.5"):
        with pytest.raises(TrainingError, match="'train'"):
            rundir.check_resumable(tmp_path, load_config(None, [change]))
    old["grpo"]["retired_key"] = 1
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    with pytest.raises(TrainingError, match="grpo.retired_key: unknown key"):
        rundir.check_resumable(tmp_path, cfg)


# ------------------------------------------------------------------------------ 5. NaN guard
def nan_objective(monkeypatch) -> None:
    original = trainer_module.grpo_objective

    def poisoned(*args, **kwargs):
        loss, stats = original(*args, **kwargs)
        return loss * float("nan"), stats

    monkeypatch.setattr(trainer_module, "grpo_objective", poisoned)


def test_non_finite_loss_stops_without_touching_the_weights(tmp_path, tiny_model_dir, env, monkeypatch):
    cfg = synth_cfg(tmp_path, tiny_model_dir, "nan", "train.puzzles_per_step=4")
    policy = build_policy(cfg)
    optimizer = make_optimizer(cfg)
    puzzles = step_puzzles(training_puzzles(cfg), 1, cfg.train.puzzles_per_step, cfg.seed)
    before = trainable(policy.model)
    nan_objective(monkeypatch)
    with pytest.raises(TrainingError, match="non-finite") as info:
        run_step(policy, optimizer, env, puzzles, 1)
    assert "\n" not in str(info.value)
    after = trainable(policy.model)
    assert before.keys() == after.keys() and before
    for key in before:
        assert np.array_equal(before[key], after[key]), key


def test_non_finite_loss_ends_the_run_with_a_training_error(tmp_path, tiny_model_dir, env, monkeypatch):
    nan_objective(monkeypatch)
    cfg = synth_cfg(tmp_path, tiny_model_dir, "nan-run", "train.puzzles_per_step=4", "train.save_every=1")
    with pytest.raises(TrainingError, match="non-finite"):
        train(cfg, env=env, progress=False, log=quiet)
    assert not (cfg.run_dir / "checkpoint").exists()
    assert not (cfg.run_dir / "adapters.safetensors").exists()


# ------------------------------------------------------------------------------ 6. outputs, CLI
def test_cli_end_to_end_with_the_sandbox(tmp_path, tiny_model_dir):
    from mlx_lm import generate, load

    from mlx_swe_rl.cli.train import main

    sets = [f"model.spec={tiny_model_dir}", f"output_dir={tmp_path}", "run_name=cli", "workers=2",
            "train.steps=2", "puzzles.tiers=[easy]", "sampling.max_tokens=8", "sampling.group_size=2",
            "train.puzzles_per_step=2", "train.final_eval=true", "train.eval_tiers=[easy]"]
    args = [a for s in sets for a in ("--set", s)] + ["--quiet"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "cli"
    assert str(run_dir) in result.output
    for name in ("config.yaml", "history.jsonl", "rollouts.jsonl", "adapters.safetensors", "adapter_config.json",
                 "checkpoint/optimizer.safetensors", "checkpoint/state.json", "checkpoint/adapters.safetensors",
                 "eval-before.json", "eval-after.json"):
        assert (run_dir / name).is_file(), name
    history = history_lines(run_dir)
    assert [h["step"] for h in history] == [1, 2]
    for h in history:
        assert set(HISTORY_KEYS) <= h.keys()
        assert 0.0 <= h["reward_mean"] <= 1.0 and 0.0 <= h["solve_rate"] <= 1.0
        assert h["step_s"] > 0 and h["peak_memory_gb"] >= 0 and 0 < h["completion_len"] <= 8
    rollouts = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 2 * 2 * 2 and {r["step"] for r in rollouts} == {1, 2}
    assert load_config(run_dir / "config.yaml").train.steps == 2
    # the model patches are named in the config record (a comment: it still loads) and the results
    first = (run_dir / "config.yaml").read_text().splitlines()[0]
    assert first == f"# model patches (fast math): {fastmath.describe()}"
    for name in ("eval-before.json", "eval-after.json"):
        report = json.loads((run_dir / name).read_text())
        assert report["meta"]["eval"] == name[5:-5] and report["totals"]
        assert report["meta"]["model_patches"] == fastmath.patched()
    assert json.loads((run_dir / "adapter_config.json").read_text())["fine_tune_type"] == "lora"
    model, tokenizer = load(str(tiny_model_dir), adapter_path=str(run_dir))
    text = generate(model, tokenizer, prompt="def f(x):", max_tokens=4)
    assert isinstance(text, str)


@pytest.mark.parametrize("args, needle", [
    (["--set", "grpo.betta=0"], "grpo.betta: unknown key (did you mean 'grpo.beta'?)"),
    (["--set", "grpo.beta=-1"], "grpo.beta: -1.0 is below the minimum 0.0"),
])
def test_cli_bad_config_is_a_one_line_error(args, needle, tmp_path):
    from mlx_swe_rl.cli.train import main

    result = CliRunner().invoke(main, args + ["--set", f"output_dir={tmp_path}", "--quiet"])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert lines == [f"Error: {needle}"]
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------ 7. frozen sampling
def record_sampling(monkeypatch) -> tuple[list[dict], list]:
    """Wrap build_policy and collect_rollouts to see what the trainer samples from."""
    calls, policies = [], []
    original_build, original_collect = trainer_module.build_policy, trainer_module.collect_rollouts

    def build(cfg):
        policy = original_build(cfg)
        policies.append(policy)
        return policy

    def collect(model, tokenizer, env, puzzles, plan, **kwargs):
        scales = [layer.scale for layer in lora_layers(model)]
        batch = original_collect(model, tokenizer, env, puzzles, plan, **kwargs)
        calls.append({"model": model, "scales": scales, "puzzles": puzzles, "plan": plan,
                      "kwargs": {**dataclasses.asdict(plan), **kwargs},
                      "ids": [s.sample.token_ids for g in batch.groups for s in g]})
        return batch

    monkeypatch.setattr(trainer_module, "build_policy", build)
    monkeypatch.setattr(trainer_module, "collect_rollouts", collect)
    return calls, policies


def initial_model_samples(tiny_model, env, call) -> list[list[int]]:
    """What the untrained base model samples for a recorded call (same puzzles and seed)."""
    base, tokenizer = tiny_model
    batch = collect_rollouts(base, tokenizer, env, call["puzzles"], call["plan"])
    return [s.sample.token_ids for g in batch.groups for s in g]


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_frozen_mode_samples_from_the_initial_weights(tmp_path, tiny_model_dir, tiny_model, env, monkeypatch,
                                                      mode):
    calls, policies = record_sampling(monkeypatch)
    cfg = synth_cfg(tmp_path, tiny_model_dir, f"frozen-{mode}", "sampling.mode=frozen", "train.steps=3",
                    "train.puzzles_per_step=4", mode=mode)
    history = train(cfg, env=env, progress=False, log=quiet).history
    assert len(calls) == 3 and len(policies) == 1 and any(h.loss_completions for h in history)
    policy = policies[0]
    if mode == "lora":
        scale = cfg.finetune.lora.scale
        for call in calls:
            assert call["model"] is policy.model
            assert call["scales"] and all(s == 0.0 for s in call["scales"])
        assert all(layer.scale == scale for layer in lora_layers(policy.model))  # restored
        assert any(np.abs(np.array(layer.lora_b)).max() > 0 for layer in lora_layers(policy.model))  # trained
    else:
        assert policy.reference is not None and policy.reference is not policy.model
        assert all(call["model"] is policy.reference for call in calls)
        assert trainable(policy.reference) == {}  # frozen
    for step, call in enumerate(calls, start=1):
        assert call["kwargs"]["seed"] == step_seed(cfg.seed, step)
        assert call["ids"] == initial_model_samples(tiny_model, env, call), f"step {step}"


def test_on_policy_mode_samples_from_the_trained_model(tmp_path, tiny_model_dir, env, monkeypatch):
    calls, policies = record_sampling(monkeypatch)
    cfg = synth_cfg(tmp_path, tiny_model_dir, "onpolicy", "train.steps=2")
    train(cfg, env=env, progress=False, log=quiet)
    scale = cfg.finetune.lora.scale
    assert all(c["model"] is policies[0].model and all(s == scale for s in c["scales"]) for c in calls)


# ------------------------------------------------------------------------------ 8. mu > 1, masking
def test_two_iterations_per_batch(tmp_path, tiny_model_dir, env):
    cfg = synth_cfg(tmp_path, tiny_model_dir, "mu2", "grpo.num_iterations=2", "grpo.beta=0.04",
                    "train.puzzles_per_step=4")
    history = train(cfg, env=env, progress=False, log=quiet).history
    assert len(history) == 3
    for h in history:
        assert h.loss_completions > 0
        assert isinstance(h.clip_frac, float) and 0.0 <= h.clip_frac <= 1.0
        assert all(math.isfinite(getattr(h, k)) for k in ("loss", "kl", "entropy", "grad_norm"))


def test_two_iterations_report_the_clipping_that_happens(tmp_path, tiny_model_dir, env, monkeypatch):
    seen = []
    original = trainer_module.grpo_objective

    def observed(*args, **kwargs):
        loss, stats = original(*args, **kwargs)
        seen.append(stats["clip_frac"].item())
        return loss, stats

    monkeypatch.setattr(trainer_module, "grpo_objective", observed)
    cfg = synth_cfg(tmp_path, tiny_model_dir, "mu2-clip", "grpo.num_iterations=2", "optim.lr=0.1",
                    "train.steps=2", "train.puzzles_per_step=4")
    history = train(cfg, env=env, progress=False, log=quiet).history
    assert max(seen) > 0.05  # the second update of each batch does clip
    assert max(h.clip_frac for h in history) > 0


def test_mask_truncated(tmp_path, tiny_model_dir, env):
    cfg = synth_cfg(tmp_path, tiny_model_dir, "mask", "grpo.mask_truncated=true", "train.puzzles_per_step=4")
    history = train(cfg, env=env, progress=False, log=quiet).history
    assert len(history) == 3
    per_step = cfg.sampling.group_size * cfg.train.puzzles_per_step
    for h in history:
        assert h.truncation_rate > 0
        assert h.loss_completions <= round((1 - h.truncation_rate) * per_step)


# ------------------------------------------------------------------------------ 9. data order
def test_step_puzzles_order():
    items = [f"p{i}" for i in range(10)]
    stream = [p for step in range(1, 11) for p in step_puzzles(items, step, 3, seed=7)]  # 30 = 3 epochs
    assert stream == [p for step in range(1, 11) for p in step_puzzles(items, step, 3, seed=7)]
    for epoch in range(3):
        assert sorted(stream[10 * epoch:10 * (epoch + 1)]) == sorted(items)
    assert stream[:10] != stream[10:20]  # a new permutation each epoch
    other = [p for step in range(1, 11) for p in step_puzzles(items, step, 3, seed=8)]
    assert other != stream
    # A step is a pure function of (step, per_step, seed): asking for step 7 alone gives the same.
    assert step_puzzles(items, 7, 3, seed=7) == stream[18:21]
    assert step_puzzles(items, 1, 12, seed=7)[:10] == stream[:10]


# ------------------------------------------------------------------------------ 10. a puzzle that cannot be scored
def test_an_errored_group_drops_out_of_the_loss(tmp_path, tiny_model_dir):
    from mlx_swe_rl.models.sampling import Sample, SampleStats
    from mlx_swe_rl.rl.rollouts import Episode, RolloutBatch
    from mlx_swe_rl.rl.trainer import LossCounts, loss_inputs

    cfg = synth_cfg(tmp_path, tiny_model_dir, "errored")

    def group(pid: str, rewards: list[float], error: str | None = None) -> list[Episode]:
        return [Episode.single(Sample(0, [5 + i, 6], "ab", [], "eos"), Verdict(pid, r, False, None, None, {}, 0, 1, error=error))
                for i, r in enumerate(rewards)]

    # rewards that differ within the errored group (a reward part that needs no test run, say)
    batch = RolloutBatch([], [[1, 2], [3, 4]], [group("good", [1.0, 0.0]), group("broken", [0.5, 0.0], "oracle")],
                         SampleStats())
    groups, info = loss_inputs(batch, cfg)
    assert [g.prompt for g in groups] == [[1, 2]]
    assert info == LossCounts(zero_var_frac=0.5, loss_completions=2, groups_sampled=2, groups_kept=1)


def test_a_training_step_survives_a_puzzle_that_cannot_be_scored(tmp_path, tiny_model_dir, scorer):
    """A broken puzzle among good ones: its episodes get the error verdict (counted as `errored`
    in history.jsonl, the error in rollouts.jsonl), the others are scored, the run goes on."""
    import shutil

    from mlx_swe_rl.env.codefix import CodeFixEnv
    from mlx_swe_rl.puzzles.format import default_puzzle_dir, load_puzzles

    root = tmp_path / "set"
    (root / "easy").mkdir(parents=True)
    for pid in ("clamp_value", "digit_sum"):
        shutil.copyfile(default_puzzle_dir() / "easy" / f"{pid}.yaml", root / "easy" / f"{pid}.yaml")
    text = (default_puzzle_dir() / "easy" / "digit_sum.yaml").read_text()
    (root / "easy" / "broken_sum.yaml").write_text(
        text.replace("id: digit_sum", "id: broken_sum").replace("oracle: |\n", "oracle: |\n  import no_such_module_xyz\n"))
    puzzles = load_puzzles(root)
    cfg = synth_cfg(tmp_path, tiny_model_dir, "broken", f"puzzles.dir={root}", "puzzles.split=all", "train.steps=2",
                    "train.puzzles_per_step=3", "sampling.group_size=2", "sampling.max_tokens=4")
    with CodeFixEnv(puzzles, scorer) as env:
        history = train(cfg, env=env, progress=False, log=quiet).history
    assert [h.errored for h in history] == [2, 2]  # the broken puzzle's two episodes, every step
    lines = history_lines(cfg.run_dir)
    assert [h["errored"] for h in lines] == [2, 2]
    rollouts = [json.loads(line) for line in (cfg.run_dir / "rollouts.jsonl").read_text().splitlines()]
    broken = [r for r in rollouts if r["puzzle_id"] == "broken_sum"]
    assert len(broken) == 4 and all(r["reward"] == 0.0 and "no_such_module_xyz" in r["error"] for r in broken)
    assert all("error" not in r for r in rollouts if r["puzzle_id"] != "broken_sum")


# ------------------------------------------------------------------------------ 11. pass rates, learnable order, dynamic sampling
@pytest.fixture(scope="module")
def learnable_runs(tmp_path_factory, tiny_model_dir, chosen):
    """As resumed_runs, with the learnable order and dynamic sampling: run A straight, run B
    killed after step 5 (checkpoint 4, its live pass-rate file already at step 5), resumed."""
    root = tmp_path_factory.mktemp("learnable")
    opts = ("train.steps=6", "train.save_every=2", "train.order=learnable", "train.dynamic_sampling.enabled=true",
            "train.dynamic_sampling.max_extra_groups=2")
    cfg_a, cfg_b = synth_cfg(root, tiny_model_dir, "a", *opts), synth_cfg(root, tiny_model_dir, "b", *opts)
    mx.random.seed(99)
    train(cfg_a, env=ChoiceEnv(chosen), progress=False, log=quiet)
    mx.random.seed(99)
    train(cfg_b, env=ChoiceEnv(chosen), progress=False, log=quiet, stop_after=5)
    killed = {name: json.loads((cfg_b.run_dir / name).read_text())["step"]
              for name in ("passrates.json", "checkpoint/passrates.json")}
    train(cfg_b, env=ChoiceEnv(chosen), progress=False, log=quiet, resume=True)
    return cfg_a, cfg_b, killed


def test_pass_rates_and_the_learnable_choice_survive_resume(learnable_runs):
    """(a) A run killed after step 5 and resumed from its step-4 checkpoint equals the
    uninterrupted run: pass-rate files, chosen puzzles, rewards, groups and tokens per step."""
    cfg_a, cfg_b, killed = learnable_runs
    assert killed == {"passrates.json": 5, "checkpoint/passrates.json": 4}
    a_dir, b_dir = cfg_a.run_dir, cfg_b.run_dir
    for name in ("passrates.json", "checkpoint/passrates.json"):
        assert json.loads((a_dir / name).read_text()) == json.loads((b_dir / name).read_text()), name
    rates = json.loads((a_dir / "passrates.json").read_text())
    assert rates["step"] == 6 and rates["decay"] == cfg_a.train.pass_rate_decay
    hist_a, hist_b = history_lines(a_dir), history_lines(b_dir)
    assert [h["step"] for h in hist_b] == [1, 2, 3, 4, 5, 6]
    for key in ("puzzles", "reward_mean", "groups_sampled", "groups_kept", "extra_groups", "sampled_tokens",
                "extra_tokens", "tokens_total"):
        assert [h[key] for h in hist_b] == [h[key] for h in hist_a], key
    assert_same_adapters(a_dir, b_dir)
    # the learnable order is not the epoch order, and a step never repeats a puzzle
    puzzles = training_puzzles(cfg_a)
    per_step = cfg_a.train.puzzles_per_step
    assert any(h["puzzles"][:per_step] != [p.id for p in step_puzzles(puzzles, h["step"], per_step, cfg_a.seed)]
               for h in hist_a)
    assert all(len(set(h["puzzles"])) == len(h["puzzles"]) for h in hist_a)
    totals = [h["tokens_total"] for h in hist_a]
    assert totals == list(np.cumsum([h["sampled_tokens"] for h in hist_a]))


def test_default_runs_record_groups_and_tokens(resumed_runs):
    """(c) Dynamic sampling off: the epoch order, no replacement groups, and the new keys."""
    cfg = resumed_runs["cfg_a"]
    puzzles = training_puzzles(cfg)
    for h in history_lines(cfg.run_dir):
        assert h["puzzles"] == [p.id for p in step_puzzles(puzzles, h["step"], cfg.train.puzzles_per_step, cfg.seed)]
        assert h["extra_groups"] == h["extra_tokens"] == 0 and h["groups_sampled"] == cfg.train.puzzles_per_step
        assert h["groups_kept"] == round((1 - h["zero_var_frac"]) * h["groups_sampled"])
        n = h["groups_sampled"] * cfg.sampling.group_size
        assert h["sampled_tokens"] == round(h["completion_len"] * n)
    # a run resumed from history written before these keys existed counts its tokens all the same
    old = {"step": 1, "completion_len": 2.5, "puzzles": ["a", "b"]}
    assert trainer_module.sampled_tokens(old, cfg) == round(2.5 * 2 * cfg.sampling.group_size)


# A scripted environment whose binary outcomes the test decides, per puzzle: "mixed" puzzles
# alternate solved / not solved over their answers (counted over the run, so a group of G = 8
# is mixed however the scorer's calls split it), "pass" always solve, "phantom" never solve
# but get shaped rewards that differ (format points, say), "error" get error verdicts; the
# rest never solve (reward 0).
OUTCOMES = {"active_usernames": "mixed", "average_score": "pass", "binary_search_index": "phantom",
            "count_vowels": "mixed", "dedupe_keep_order": "error", "digit_sum": "pass",
            "file_extension": "phantom", "fizzbuzz_label": "mixed"}


class OutcomeEnv(ChoiceEnv):
    def __init__(self):
        super().__init__([])
        self.seen = Counter()

    def score(self, items):
        out, seen = [], self.seen
        for pid, _ in items:
            i, kind = seen[pid], OUTCOMES.get(pid, "fail")
            seen[pid] += 1
            solved = kind == "pass" or (kind == "mixed" and i % 2 == 0)
            reward = 1.0 if solved else (0.1 * (i % 3) if kind == "phantom" else 0.0)
            out.append(Verdict(pid, reward, solved, None, None, {"choice": reward}, passed=int(solved), total=1,
                               error="oracle failed" if kind == "error" else None))
        return out


def replacements(ids: list[str], per_step: int, cap: int) -> int:
    """How many spare groups dynamic sampling adds to a step whose chosen puzzles, then spares,
    are `ids`: one for each group that cannot teach (the step's, then the replacements'), while
    the cap and the spares last."""
    extra, most = 0, min(cap, len(ids) - per_step)
    while extra < most and sum(OUTCOMES.get(pid) != "mixed" for pid in ids[:per_step + extra]) > extra:
        extra += 1
    return extra


def test_dynamic_sampling_drops_exactly_the_all_equal_groups_within_its_cap(tmp_path, tiny_model_dir, monkeypatch):
    """(b) Groups whose binary outcomes are all equal (and error verdicts) leave the loss and are
    replaced by spare puzzles, one for each, in order, never beyond the cap; each step samples
    them in one batch (one `dynamic_rollouts` call, never `collect_rollouts`)."""
    from mlx_swe_rl.rl.passrates import PassRates, choose

    calls, losses = [], []
    original_dynamic, original_loss = trainer_module.dynamic_rollouts, trainer_module.loss_inputs

    def dynamic(model, tokenizer, env, puzzles, spare, plan, **kwargs):
        calls.append(([p.id for p in puzzles], [p.id for p in spare], plan.seed))
        return original_dynamic(model, tokenizer, env, puzzles, spare, plan, **kwargs)

    def loss(rollouts, cfg):
        groups, info = original_loss(rollouts, cfg)
        by_prompt = {tuple(prompt): p.id for prompt, p in zip(rollouts.prompts, rollouts.puzzles)}
        losses.append([by_prompt[tuple(g.prompt)] for g in groups])
        return groups, info

    def refuse(*args, **kwargs):
        raise AssertionError("dynamic sampling sampled outside its one batch")

    monkeypatch.setattr(trainer_module, "dynamic_rollouts", dynamic)
    monkeypatch.setattr(trainer_module, "collect_rollouts", refuse)
    monkeypatch.setattr(trainer_module, "loss_inputs", loss)
    cap, per_step = 3, 3
    cfg = synth_cfg(tmp_path, tiny_model_dir, "dynamic", "train.steps=4", f"train.puzzles_per_step={per_step}",
                    "train.dynamic_sampling.enabled=true", f"train.dynamic_sampling.max_extra_groups={cap}")
    history = train(cfg, env=OutcomeEnv(), progress=False, log=quiet).history
    puzzles = training_puzzles(cfg)
    rates = PassRates.start([p.id for p in puzzles], cfg.train.pass_rate_decay)  # the epoch order never reads it
    lines = [json.loads(line) for line in (cfg.run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert len(calls) == len(history)
    replaced = 0
    for h, kept, call in zip(history, losses, calls):
        chosen, spare = choose(cfg, puzzles, rates, h.step)
        ids = [p.id for p in chosen] + [p.id for p in spare]
        assert call == (ids[:per_step], ids[per_step:], step_seed(cfg.seed, h.step))
        sampled = h.puzzles
        extra = h.extra_groups
        assert extra == replacements(ids, per_step, cap) and sampled == ids[:per_step + extra]
        mixed = [pid for pid in sampled if OUTCOMES.get(pid) == "mixed"]
        assert kept == mixed  # exactly the mixed groups enter the loss, phantom ones included out
        assert h.groups_sampled == len(sampled) and h.groups_kept == len(mixed)
        assert h.loss_completions == len(mixed) * cfg.sampling.group_size
        assert extra <= cap
        # stopped only when enough groups were kept, the cap was reached, or no spare was left
        assert len(mixed) >= per_step or extra == cap or extra == len(spare)
        replaced += extra
        step_lines = [line for line in lines if line["step"] == h.step]
        assert [line["puzzle_id"] for line in step_lines][::cfg.sampling.group_size] == sampled
        assert h.sampled_tokens == sum(line["num_tokens"] for line in step_lines)
        assert h.extra_tokens == sum(line["num_tokens"] for line in step_lines[per_step * cfg.sampling.group_size:])
    assert replaced > 0  # the scripted outcomes did make it replace groups


def test_dynamic_sampling_off_samples_exactly_what_collect_rollouts_samples(tmp_path, tiny_model_dir, tiny_model, env,
                                                                           monkeypatch):
    """(d) Off, a step is `collect_rollouts` at the step's seed, whatever spares it is given, and
    the refill policy is never built."""
    def refuse(*args, **kwargs):
        raise AssertionError("dynamic sampling ran while off")

    monkeypatch.setattr(trainer_module, "dynamic_rollouts", refuse)
    cfg = synth_cfg(tmp_path, tiny_model_dir, "dynamic-off", "train.puzzles_per_step=3")
    puzzles = training_puzzles(cfg)
    chosen = step_puzzles(puzzles, 1, cfg.train.puzzles_per_step, cfg.seed)
    spare = [p for p in puzzles if p not in chosen]
    _, batch = run_step(build_policy(cfg), make_optimizer(cfg), env, chosen, 1, spare=spare)
    base, tokenizer = tiny_model  # LoRA starts as the identity: the policy samples as the base model
    plain = collect_rollouts(base, tokenizer, env, chosen, cfg.train_sampling(step_seed(cfg.seed, 1)))
    assert [p.id for p in batch.puzzles] == [p.id for p in chosen]
    assert [[e.sample.token_ids for e in g] for g in batch.groups] == \
        [[e.sample.token_ids for e in g] for g in plain.groups]
    assert [[e.reward for e in g] for g in batch.groups] == [[e.reward for e in g] for g in plain.groups]


def test_phantom_groups_leave_the_loss_only_with_dynamic_sampling(tmp_path, tiny_model_dir):
    """All answers failed, shaped rewards differ: today's loss keeps the group (reward variance),
    dynamic sampling drops it (no correctness signal: verl's phantom gradients)."""
    from mlx_swe_rl.models.sampling import Sample, SampleStats
    from mlx_swe_rl.rl.rollouts import Episode, RolloutBatch
    from mlx_swe_rl.rl.trainer import loss_inputs

    def group(pid: str, rewards: list[float], solved: list[bool]) -> list[Episode]:
        return [Episode.single(Sample(0, [5 + i, 6], "ab", [], "eos"), Verdict(pid, r, s, None, None, {}, int(s), 1))
                for i, (r, s) in enumerate(zip(rewards, solved))]

    batch = RolloutBatch([], [[1, 2], [3, 4]], [group("mixed", [1.0, 0.2], [True, False]),
                                                group("phantom", [0.3, 0.1], [False, False])], SampleStats())
    off = synth_cfg(tmp_path, tiny_model_dir, "phantom-off")
    on = synth_cfg(tmp_path, tiny_model_dir, "phantom-on", "train.dynamic_sampling.enabled=true")
    assert [g.prompt for g in loss_inputs(batch, off)[0]] == [[1, 2], [3, 4]]
    groups, info = loss_inputs(batch, on)
    assert [g.prompt for g in groups] == [[1, 2]] and info.groups_kept == 1 and info.zero_var_frac == 0.5


def test_dynamic_sampling_is_refused_in_data_parallel_runs(tmp_path, monkeypatch):
    cfg = load_config(None, [f"output_dir={tmp_path}", "train.dynamic_sampling.enabled=true", "train.memory_check=false"])
    monkeypatch.setattr(rundir.dist, "size", lambda: 2)
    with pytest.raises(TrainingError, match=r"^train.dynamic_sampling.enabled: not supported in data-parallel") as info:
        rundir.check_before_loading(cfg, [], [], quiet)
    assert "\n" not in str(info.value)
    rundir.check_before_loading(load_config(None, ["train.memory_check=false"]), [], [], quiet)  # off: fine


def test_lora_on_the_top_blocks_trains_the_same_with_the_bottom_run_once(tmp_path, tiny_model_dir, env, monkeypatch):
    """LoRA on the last block of two: the trainer says it runs block 0 once per group, and the
    run (rewards, losses, KL, gradient norms) is the one where every pass runs both blocks, to
    float rounding. Two steps: Adam turns the rounding of near-zero gradients into steps of the
    learning rate's size, so later steps drift apart (6e-4 in the gradient norm at step 3)."""
    runs = {}
    for shared in (True, False):
        if not shared:
            monkeypatch.setattr(policy_module.Policy, "shared_depth", lambda self: 0)
        mx.random.seed(1234)
        cfg = synth_cfg(tmp_path, tiny_model_dir, f"top-{shared}", "grpo.beta=0.04", "train.steps=2",
                        "finetune.lora.num_layers=1", "train.micro_batch_size=2")
        lines: list[str] = []
        history = train(cfg, env=env, progress=False, log=lines.append).history
        assert any("LoRA from block 1 of 2: updates run blocks 0-0 once per group" in line for line in lines) == shared
        runs[shared] = (history, saved_adapter_names(cfg.run_dir))
    (shared, shared_names), (plain, plain_names) = runs[True], runs[False]
    assert any(h.loss_completions > 0 for h in shared) and shared[-1].kl > 0
    for a, b in zip(shared, plain):
        assert a.reward_mean == b.reward_mean  # the same samples: the updates agree to float rounding
        for key in ("loss", "kl", "grad_norm"):
            assert getattr(a, key) == pytest.approx(getattr(b, key), rel=1e-5, abs=1e-7), key
    assert shared_names == plain_names and all(".layers.1." in k for k in shared_names)


def saved_adapter_names(run_dir) -> set[str]:
    return set(mx.load(str(run_dir / "adapters.safetensors")))
