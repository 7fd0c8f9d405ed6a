"""The `mlx-swe-rl puzzles` command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
