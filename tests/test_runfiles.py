"""The run directory's step logs, read and written in one place (runfiles)."""

import json

import pytest

from mlx_swe_rl.runfiles import HISTORY, RunFileError, append_jsonl, read_history, read_jsonl, truncate_after_step


def test_history_round_trip_and_truncation_on_resume(tmp_path):
    path = tmp_path / HISTORY
    append_jsonl(path, [{"step": 1, "reward_mean": 0.125}])
    append_jsonl(path, [{"step": 2, "reward_mean": 0.1 + 0.2}, {"step": 3, "reward_mean": 1e-17}])
    append_jsonl(path, [])  # nothing to add: the file is left as it was
    assert [r["step"] for r in read_history(tmp_path)] == [1, 2, 3]
    truncate_after_step(path, 2)  # resuming from the step-2 checkpoint drops step 3
    kept = read_history(tmp_path)
    assert kept == [{"step": 1, "reward_mean": 0.125}, {"step": 2, "reward_mean": 0.1 + 0.2}]  # floats exact
    assert path.read_text().count("\n") == 2


def test_missing_history_is_an_error_unless_allowed(tmp_path):
    with pytest.raises(RunFileError, match="no history"):
        read_history(tmp_path)
    assert read_history(tmp_path, missing_ok=True) == []
    truncate_after_step(tmp_path / HISTORY, 0)
    assert not (tmp_path / HISTORY).exists()


def test_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps({"step": 1}) + "\n\n" + json.dumps({"step": 2}) + "\n")
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]
