"""Figures render from recorded files; the numbers come from those files."""

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlx_swe_rl.reports import figures
from mlx_swe_rl.runfiles import read_history
from mlx_swe_rl.cli.app import main

DATA = Path(__file__).parent / "data" / "figures"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_image(path: Path) -> None:
    assert path.is_file(), path
    head = path.read_bytes()[:8]
    if path.suffix == ".png":
        assert head == PNG_MAGIC and path.stat().st_size > 5000
    else:
        assert head.startswith(b"%PDF") and path.stat().st_size > 1000


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(DATA / "run", run)
    return run


def test_every_figure_renders_from_files(run_dir, tmp_path):
    out = tmp_path / "figs"
    written = figures.run_figures(run_dir, out, DATA / "eval-before.json", DATA / "eval-after.json",
                                  DATA / "rollouts.json")
    names = {p.stem for p in written}
    assert names == {"training_curve", "before_after", "puzzle_changes", "rollouts"}
    for path in written:
        assert_image(path)


def test_changes_come_from_the_eval_files():
    before, after = figures.read_json(DATA / "eval-before.json"), figures.read_json(DATA / "eval-after.json")
    assert figures.puzzle_changes(before, after) == {
        "newly_solved": ["b_easy", "c_med"], "regressed": ["d_med"], "kept": ["a_easy"], "never": []}


def test_training_curve_plots_the_recorded_values(run_dir, tmp_path, monkeypatch):
    seen = {}
    original = figures._series

    def spy(history, key, *x):
        seen[key] = original(history, key, *x)
        return seen[key]

    monkeypatch.setattr(figures, "_series", spy)
    figures.training_curve(read_history(run_dir), tmp_path / "curve", "footer")
    assert seen["reward_mean"] == ([1, 2, 3, 4, 5], [0.25, 0.375, 0.5, 0.5, 0.625])
    assert seen["kl"][1] == [0.0, 0.001, 0.002, 0.004, 0.003]
    assert figures.smooth([0.0, 1.0], 0.5) == [0.0, 0.5]


def test_figures_command(run_dir):
    shutil.copy(DATA / "eval-before.json", run_dir / "eval-before.json")
    shutil.copy(DATA / "eval-after.json", run_dir / "eval-after.json")
    result = CliRunner().invoke(main, ["figures", str(run_dir), "--rollouts", str(DATA / "rollouts.json")])
    assert result.exit_code == 0, result.output
    assert (run_dir / "figures" / "training_curve.png").is_file()
    assert (run_dir / "figures" / "rollouts.pdf").is_file()
    bad = CliRunner().invoke(main, ["figures", str(run_dir.parent / "nope")])
    assert bad.exit_code == 1 and bad.output.startswith("Error: ") and len(bad.output.strip().splitlines()) == 1


def test_architecture_figure(tmp_path):
    for path in figures.architecture(tmp_path / "architecture"):
        assert_image(path)


def test_curves_against_sampled_tokens(run_dir, tmp_path, monkeypatch):
    """A history with `tokens_total` also gets its curves against the tokens sampled; records
    written before the key existed have no place on that axis (and an old run draws as before)."""
    import json

    lines = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    for h, total in zip(lines[2:], (300, 700, 1000)):  # steps 1-2 recorded before tokens_total existed
        h["tokens_total"] = total
    (run_dir / "history.jsonl").write_text("".join(json.dumps(h) + "\n" for h in lines))
    history = read_history(run_dir)
    assert figures._series(history, "reward_mean", "tokens") == ([300, 700, 1000], [0.5, 0.5, 0.625])
    assert figures._series(history, "reward_mean") == ([1, 2, 3, 4, 5], [0.25, 0.375, 0.5, 0.5, 0.625])
    written = figures.run_figures(run_dir, tmp_path / "figs")
    assert {p.stem for p in written} == {"training_curve", "training_curve_tokens"}
    for path in written:
        assert_image(path)
    old = [{k: v for k, v in h.items() if k != "tokens_total"} for h in history]
    assert figures.has_tokens(history) and not figures.has_tokens(old)
