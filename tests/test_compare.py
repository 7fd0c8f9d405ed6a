"""Comparison experiments: every variant runs once, an interrupted one resumes, and the
summary is drawn from the runs' files."""

import json

import pytest
import yaml
from click.testing import CliRunner

from mlx_swe_rl.cli.app import main
from mlx_swe_rl.reports.compare import load_comparison, run_comparison, variant_config
from mlx_swe_rl.rl.config import ConfigError
from mlx_swe_rl.rl.trainer import train


@pytest.fixture
def comparison_file(tmp_path, tiny_model_dir):
    path = tmp_path / "compare.yaml"
    path.write_text(yaml.safe_dump({
        "name": "tiny", "output_dir": str(tmp_path / "out"),
        "overrides": {"model.spec": str(tiny_model_dir), "puzzles.tiers": ["easy"], "sampling.max_tokens": 6,
                      "sampling.group_size": 2, "train.steps": 2, "train.puzzles_per_step": 2,
                      "train.save_every": 1, "train.eval_tiers": ["easy"], "workers": 2},
        "variants": {"on_policy": {"sampling.mode": "on_policy"}, "frozen": {"sampling.mode": "frozen"}},
    }, sort_keys=False))
    return path


def test_runs_each_variant_once_and_resumes_an_interrupted_one(comparison_file):
    comparison = load_comparison(comparison_file)
    frozen = variant_config(comparison, "frozen")
    assert frozen.sampling.mode == "frozen" and frozen.run_dir.name == "frozen"
    train(frozen, progress=False, stop_after=1, log=lambda _: None)  # killed after step 1

    calls = []

    def spy(cfg, **kwargs):
        calls.append((cfg.run_name, kwargs["resume"]))
        return train(cfg, **kwargs)

    summary = run_comparison(comparison, train_fn=spy, log=lambda _: None, progress=False)
    assert calls == [("on_policy", False), ("frozen", True)]
    root = comparison.output_dir / comparison.name
    for name in ("summary.md", "summary.json", "comparison.png", "comparison.pdf", "comparison_tokens.png"):
        assert (root / name).is_file(), name
    assert sorted(summary["figures"]) == sorted(str(root / n) for n in ("comparison.png", "comparison.pdf",
                                                                        "comparison_tokens.png", "comparison_tokens.pdf"))
    for variant, row in summary["results"].items():
        history = [json.loads(line) for line in (root / variant / "history.jsonl").read_text().splitlines()]
        assert [h["step"] for h in history] == [1, 2]
        assert row["last_reward"] == history[-1]["reward_mean"]
        after = json.loads((root / variant / "eval-after.json").read_text())
        train_rate = next(t["pass@1"] for t in after["totals"] if (t["tier"], t["split"]) == ("all", "train"))
        assert row["train_after"] == train_rate
        assert row["wall_seconds"] > 0 and row["peak_memory_gb"] > 0
    assert "| on_policy |" in (root / "summary.md").read_text()

    calls.clear()
    run_comparison(comparison, train_fn=spy, log=lambda _: None, progress=False)
    assert calls == []  # finished variants are not rerun


def test_bad_comparison_files(tmp_path, comparison_file):
    one = tmp_path / "one.yaml"
    one.write_text("variants: {a: {}}\n")
    with pytest.raises(ConfigError, match="at least two"):
        load_comparison(one)
    bad = tmp_path / "bad.yaml"
    data = yaml.safe_load(comparison_file.read_text())
    data["variants"]["frozen"] = {"sampling.mod": "frozen"}
    bad.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError, match="variant 'frozen'.*did you mean"):
        load_comparison(bad)
    result = CliRunner().invoke(main, ["compare", str(bad)])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
