"""scripts/seeded_check.py: a run against a committed results file or against a reference run."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "scripts" / "seeded_check.py"


def run_dir(tmp_path: Path, name: str, rewards: list[float]) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    lines = [json.dumps({"step": i + 1, "reward_mean": r, "completion_len": 10.0 + i}) for i, r in enumerate(rewards)]
    (directory / "history.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def check(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_a_run_against_a_reference_run(tmp_path):
    before = run_dir(tmp_path, "before", [0.5, 0.25])
    same = check(run_dir(tmp_path, "same", [0.5, 0.25]), "--against", before)
    assert same.returncode == 0 and "2 of 2 committed steps compared; all equal" in same.stdout
    moved = check(run_dir(tmp_path, "moved", [0.5, 0.375]), "--against", before)
    assert moved.returncode == 1 and "1 differ (first: step 2)" in moved.stdout
    short = check(run_dir(tmp_path, "short", [0.5]), "--against", before)  # a run stopped early: not a pass
    assert short.returncode == 1 and "1 of 2 committed steps compared; all equal" in short.stdout


def test_a_run_against_a_results_file(tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"runs": {"r": {"curves": {"reward_mean": [0.5], "completion_len": [10.0]}}}}))
    assert check(run_dir(tmp_path, "run", [0.5]), "--results", results, "--run", "r").returncode == 0
    both = check(run_dir(tmp_path, "both", [0.5]), "--results", results, "--run", "r", "--against", tmp_path / "run")
    assert both.returncode == 2 and "--against" in both.stderr
