"""The `mlx-swe-rl puzzles` command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from mlx_swe_rl.cli.app import main
from mlx_swe_rl.puzzles.format import load_puzzles

GOOD = {
    "id": "cli_add_one", "tier": "easy", "split": "train", "entry_point": "add_one",
    "description": "Return x plus one.",
    "buggy": "def add_one(x):\n    return x - 1\n",
    "oracle": "def add_one(x):\n    return x + 1\n",
    "tests": ["assert add_one(1) == 2", "assert add_one(-1) == 0"],
}


def write(root: Path, data: dict) -> Path:
    path = root / data["tier"] / f"{data['id']}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_puzzles_list_bundled(runner):
    result = runner.invoke(main, ["puzzles", "list"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    bundled = load_puzzles()
    assert lines[0].split() == ["id", "tier", "split", "tests"]
    assert lines[-1] == f"{len(bundled)} puzzles"
    rows = [line.split() for line in lines[1:-1]]
    assert [(r[0], r[1], r[2], int(r[3])) for r in rows] == [(p.id, p.tier, p.split, len(p.tests)) for p in bundled]


def test_puzzles_list_filters(runner):
    result = runner.invoke(main, ["puzzles", "list", "--tier", "hard", "--split", "heldout"])
    assert result.exit_code == 0, result.output
    expected = load_puzzles(tiers=["hard"], split="heldout")
    rows = result.output.strip().splitlines()[1:-1]
    assert [r.split()[0] for r in rows] == [p.id for p in expected]
    assert all(r.split()[1:3] == ["hard", "heldout"] for r in rows)
    assert result.output.strip().endswith(f"{len(expected)} puzzles")


def test_puzzles_list_user_dir(runner, tmp_path):
    write(tmp_path, GOOD)
    result = runner.invoke(main, ["puzzles", "list", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "cli_add_one" in result.output and result.output.strip().endswith("1 puzzles")


def test_puzzles_check_reports_bad_file(runner, tmp_path):
    write(tmp_path, GOOD)
    bad = dict(GOOD, id="cli_bad", timeout="soon")
    bad_path = write(tmp_path, bad)
    result = runner.invoke(main, ["puzzles", "check", str(tmp_path), "--workers", "2"])
    assert result.exit_code != 0
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    fail_lines = [line for line in result.output.splitlines() if line.startswith("FAIL")]
    assert len(fail_lines) == 1, result.output
    assert str(bad_path) in fail_lines[0] and "timeout" in fail_lines[0]
    assert "1/2 puzzles OK" in result.output


def test_puzzles_check_good_dir_passes(runner, tmp_path):
    write(tmp_path, GOOD)
    result = runner.invoke(main, ["puzzles", "check", str(tmp_path), "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert "FAIL" not in result.output and "1/1 puzzles OK" in result.output


def test_puzzles_check_reports_behaviour_problem(runner, tmp_path):
    path = write(tmp_path, dict(GOOD, id="cli_weak", buggy="def add_one(x):\n    return 1 + x\n"))
    result = runner.invoke(main, ["puzzles", "check", str(tmp_path), "--workers", "2"])
    assert result.exit_code == 1
    assert f"FAIL {path}: buggy code passes every test" in result.output
    assert "0/1 puzzles OK" in result.output


@pytest.mark.parametrize("command", ["check", "list"])
def test_puzzles_on_missing_dir_is_a_one_line_error(runner, tmp_path, command):
    missing = tmp_path / "does_not_exist"
    result = runner.invoke(main, ["puzzles", command, str(missing)])
    assert result.exit_code != 0
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert str(missing) in lines[0] and "no such puzzle directory" in lines[0]


def test_python_m_help():
    proc = subprocess.run([sys.executable, "-m", "mlx_swe_rl", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Usage: mlx-swe-rl" in proc.stdout
    assert "puzzles" in proc.stdout


def test_import_gguf_and_fetch_errors_are_one_line(runner, tmp_path):
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"not a gguf file")
    cases = [
        ["import-gguf", str(tmp_path / "missing.gguf"), str(tmp_path / "out")],
        ["import-gguf", str(not_gguf), str(tmp_path / "out2")],
        ["import-gguf", str(not_gguf), str(tmp_path)],  # existing output directory
        ["fetch", "no/such/thing"],
    ]
    for args in cases:
        result = runner.invoke(main, args)
        assert result.exit_code == 1, (args, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), (args, result.output)
        assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


# ---------------------------------------------------------------------------------- one vocabulary
def visible_commands(group: click.Group, prefix: tuple[str, ...] = ()):
    """(path, command) of every command `--help` shows, subcommands of groups included."""
    for name, command in group.commands.items():
        if command.hidden:
            continue
        if isinstance(command, click.Group):
            yield from visible_commands(command, prefix + (name,))
        else:
            yield prefix + (name,), command


def visible_options(command: click.Command) -> list[str]:
    return [opt for p in command.params if isinstance(p, click.Option) and not p.hidden
            for opt in p.opts if opt.startswith("--")]


# Singular and plural spellings that name different things (one seed; which seeds of an experiment).
DIFFERENT_MEANINGS = {"--seed"}


def test_one_spelling_for_each_option_across_commands():
    names = {opt for _, command in visible_commands(main) for opt in visible_options(command)}
    doubled = sorted(n for n in names if n + "s" in names and n not in DIFFERENT_MEANINGS)
    assert not doubled, f"spelled both singular and plural across commands: {doubled}"
    with_tiers = {" ".join(path) for path, command in visible_commands(main) if "--tiers" in visible_options(command)}
    assert with_tiers >= {"eval", "calibrate", "puzzles list", "puzzles sample"}


def test_tiers_comma_separated_repeated_or_by_the_old_name(runner):
    expected = [p.id for p in load_puzzles(tiers=["easy", "hard"], split="heldout")]
    spellings = (["--tiers", "easy,hard"], ["--tiers", "easy", "--tiers", "hard"], ["--tier", "easy", "--tier", "hard"])
    for tiers in spellings:
        result = runner.invoke(main, ["puzzles", "list", *tiers, "--split", "heldout"])
        assert result.exit_code == 0, result.output
        assert [r.split()[0] for r in result.output.strip().splitlines()[1:-1]] == expected, tiers


def test_rollouts_is_a_hidden_alias_of_calibrate(runner):
    top = runner.invoke(main, ["--help"])
    assert "calibrate" in top.output and "rollouts" not in top.output
    assert main.commands["rollouts"].callback is main.commands["calibrate"].callback
    old = runner.invoke(main, ["rollouts", "--help"])
    assert old.exit_code == 0 and "--write-train-set" in old.output


# Options whose default must be a config key's default (tests/test_readme.py keeps the keys documented).
CONFIG_KEYS = {
    "--model": "model.spec", "--dtype": "model.dtype", "--seed": "seed", "--workers": "workers",
    "--max-tokens": "sampling.max_tokens", "--batch-size": "sampling.batch_size",
    "--group-size": "sampling.group_size", "--temperature": "sampling.temperature",
    "--samples": "train.eval_samples", "--rounds": "puzzles.calibration.rounds", "--split": "puzzles.split",
    "--format": "prompt.format", "--prompt-template": "prompt.template", "--prompt-system": "prompt.system",
    "--turns": "multi_turn.max_turns", "--public-tests": "multi_turn.public_tests",
    "--feedback": "multi_turn.feedback", "--feedback-chars": "multi_turn.feedback_chars",
    "--reward-on": "multi_turn.reward_on", "--confinement": "sandbox.confinement",
}
NEGATED = {"--full-completions": "sampling.stop_after_answer"}  # a flag that turns the key off
# Options with no config key of the same meaning, and why.
COMMAND_ONLY = {
    "eval": {"--adapter", "--puzzles", "--tiers", "--out", "--baseline", "--best-of-n", "--allow-unconfined",
             "--help",
             "--split",  # an evaluation reads every split by default (the trainer's evaluations do too)
             "--temperature"},  # none: greedy for one sample, else sampling.temperature (tested below)
    "calibrate": {"--adapter", "--puzzles", "--tiers", "--out", "--write-train-set", "--allow-unconfined", "--help"},
}


@pytest.mark.parametrize("name", ["eval", "calibrate"])
def test_command_line_defaults_are_the_config_defaults(name):
    from mlx_swe_rl.rl.config import describe

    defaults = {key: yaml.safe_load(default) for key, default, _ in describe()}
    command = main.commands[name]
    context = click.Context(command)
    checked = 0
    for param in command.params:
        if not isinstance(param, click.Option) or param.hidden:
            continue
        option = max(param.opts, key=len)
        if option in COMMAND_ONLY[name]:
            continue
        default = param.get_default(context)  # what the command receives (a flag's False included)
        if option in NEGATED:
            assert default is (not defaults[NEGATED[option]]), option
        else:
            assert option in CONFIG_KEYS, f"{name} {option}: add its config key to CONFIG_KEYS or it to COMMAND_ONLY"
            assert default == defaults[CONFIG_KEYS[option]], \
                f"{name} {option} defaults to {default!r}, {CONFIG_KEYS[option]} to {defaults[CONFIG_KEYS[option]]!r}"
        checked += 1
    assert checked >= 15


def test_eval_samples_at_the_config_temperature(monkeypatch):
    """`eval -K 2` without --temperature samples at sampling.temperature (Config.eval_sampling's rule)."""
    from mlx_swe_rl.cli import eval as eval_cli
    from mlx_swe_rl.rl.config import Config

    class Planned(Exception):
        """Stops the command once its sampling plan is made: no model is loaded."""

    def plan(*args, **kwargs):
        raise Planned(args)

    monkeypatch.setattr(eval_cli, "SamplingPlan", plan)
    for k, expected in ((1, 0.0), (2, Config().sampling.temperature)):
        result = CliRunner().invoke(eval_cli.main, ["--tiers", "easy", "-K", str(k)])
        assert isinstance(result.exception, Planned), result.output
        assert result.exception.args[0][:2] == (k, expected)
