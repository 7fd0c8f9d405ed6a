"""Evaluation that can see a change: avg@K with bootstrap intervals over puzzles, and paired
comparisons of two evaluations (the eval command's --baseline, the trainer's before/after)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from mlx_swe_rl.rl.stats import bootstrap_ci, compare_reports, paired_change


def test_bootstrap_interval_brackets_the_mean_and_narrows_with_more_puzzles():
    rng = np.random.default_rng(1)
    few = list(rng.random(20))
    many = list(rng.random(500))
    mean, low, high = bootstrap_ci(few)
    assert mean == pytest.approx(np.mean(few)) and low < mean < high
    _, low_many, high_many = bootstrap_ci(many)
    assert high_many - low_many < (high - low) / 3
    assert bootstrap_ci(few) == bootstrap_ci(few)  # seeded


def test_bootstrap_interval_matches_the_normal_approximation():
    """For a mean of n Bernoulli(0.3) rates the 95% interval is about +-1.96 sd/sqrt(n)."""
    values = [1.0] * 60 + [0.0] * 140
    mean, low, high = bootstrap_ci(values)
    half = 1.96 * np.std(values) / np.sqrt(len(values))
    assert mean == 0.3
    assert (high - low) / 2 == pytest.approx(half, rel=0.1)


def test_constant_values_and_no_values():
    assert bootstrap_ci([0.5] * 10) == (0.5, 0.5, 0.5)
    assert all(np.isnan(bootstrap_ci([])))


def test_paired_change_uses_common_puzzles_and_cancels_difficulty():
    before = {f"p{i}": i / 10 for i in range(10)}
    after = {f"p{i}": i / 10 + 0.1 for i in range(10)} | {"new": 1.0}
    change = paired_change(before, after)
    assert change["puzzles"] == 10 and change["improved"] == 10 and change["worsened"] == 0
    assert change["change"] == pytest.approx(0.1)
    # every puzzle moved by the same amount: no doubt about the change, although the puzzles
    # themselves range from 0 to 1
    assert change["ci95"] == pytest.approx([0.1, 0.1])
    same = paired_change(before, before)
    assert same["change"] == 0 and same["ci95"] == [0, 0]


def _report(rates: dict[str, float], split: str = "train") -> dict:
    return {"puzzles": [{"id": pid, "split": split if pid != "h" else "heldout", "pass@1": r}
                        for pid, r in rates.items()]}


def test_compare_reports_per_split():
    changes = compare_reports(_report({"a": 0.0, "b": 0.5, "h": 0.25}), _report({"a": 0.5, "b": 0.5, "h": 0.0}))
    assert set(changes) == {"train", "heldout", "all"}
    assert changes["train"]["change"] == pytest.approx(0.25)
    assert changes["heldout"]["change"] == pytest.approx(-0.25) and changes["heldout"]["worsened"] == 1
    assert changes["all"]["puzzles"] == 3


def test_eval_baseline_prints_the_paired_change(tiny_model_dir, tmp_path):
    from mlx_swe_rl.cli.eval import main

    args = ["--model", str(tiny_model_dir), "--tiers", "easy", "--max-tokens", "6", "--samples", "2",
            "--workers", "2"]
    first = CliRunner().invoke(main, args + ["--out", str(tmp_path / "a.json")])
    assert first.exit_code == 0, first.output
    assert "avg@2" in first.output and "95% CI" in first.output
    report = json.loads((tmp_path / "a.json").read_text())
    overall = next(t for t in report["totals"] if (t.get("tier"), t["split"]) == ("all", "all"))
    low, high = overall["ci95"]
    assert low <= overall["pass@1"] <= high
    again = CliRunner().invoke(main, args + ["--out", str(tmp_path / "b.json"), "--baseline", str(tmp_path / "a.json")])
    assert again.exit_code == 0, again.output
    assert "paired change from" in again.output
    change = json.loads((tmp_path / "b.json").read_text())["change_vs_baseline"]
    assert change["all"]["change"] == 0.0 and change["all"]["ci95"] == [0.0, 0.0]  # same seed, same samples
    (tmp_path / "bad.json").write_text("{}")
    bad = CliRunner().invoke(main, args + ["--baseline", str(tmp_path / "bad.json")])
    assert bad.exit_code == 1 and bad.output.strip().splitlines() == [
        f"Error: --baseline: {tmp_path / 'bad.json'}: not an evaluation report (no 'puzzles' list)"]


def test_trainer_evaluates_avg_at_k_and_reports_the_change(tiny_model_dir, tmp_path):
    from mlx_swe_rl.cli.train import main

    sets = [f"model.spec={tiny_model_dir}", f"output_dir={tmp_path}", "run_name=avg", "workers=2",
            "train.steps=1", "puzzles.tiers=[easy]", "sampling.max_tokens=6", "sampling.group_size=2",
            "train.puzzles_per_step=2", "train.final_eval=true", "train.eval_tiers=[easy]", "train.eval_samples=2"]
    result = CliRunner().invoke(main, [a for s in sets for a in ("--set", s)] + ["--quiet"])
    assert result.exit_code == 0, result.output
    assert "avg@2 eval before" in result.output and "change from before training" in result.output
    after = json.loads((tmp_path / "avg" / "eval-after.json").read_text())
    assert after["settings"]["samples"] == 2 and after["settings"]["temperature"] == 0.8
    assert set(after["change_vs_before"]) == {"train", "heldout", "all"}
