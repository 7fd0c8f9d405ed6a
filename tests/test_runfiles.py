"""The run directory's step logs, read and written in one place (runfiles)."""

import json
import os
import platform
import signal
import subprocess
import sys

import pytest

from mlx_swe_rl.runfiles import (HISTORY, RunFileError, RunInUseError, StepRecord, append_jsonl, read_history,
                                 read_jsonl, read_steps, default_mode, run_holder, run_in_use, staged_directory,
                                 truncate_after_step, upgrade_history_line)


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


# A history.jsonl line of the quick start as the trainer wrote it before StepRecord existed
# (step 1, with the alarms' one-time LoRA check).
QUICKSTART_LINE = (
    '{"step": 1, "reward_mean": 0.041666666666666664, "solve_rate": 0.041666666666666664, "loss": 2.12341'
    '5470123291e-07, "policy_loss": 2.123415470123291e-07, "kl": null, "entropy": 0.6391427516937256, "cl'
    'ip_frac": 0.0, "grad_norm": 1.281108021736145, "zero_var_frac": 0.6666666666666667, "loss_completion'
    's": 8, "groups_sampled": 3, "groups_kept": 1, "extra_groups": 0, "sampled_tokens": 1444, "extra_toke'
    'ns": 0, "completion_len": 60.166666666666664, "turns": 1.0, "truncation_rate": 0.0, "errored": 0, "t'
    'okens_per_s": 42.50088556783531, "lr": 9.999999747378752e-06, "sample_s": 33.975762638998276, "prefi'
    'll_s": 5.665936214001704, "score_s": 0.08260928299932857, "reference_s": 0.002440954998746747, "opti'
    'mizer_s": 0.09696379099841579, "update_s": 9.359008426999935, "step_s": 43.423283529999026, "peak_me'
    'mory_gb": 1.656153791, "puzzles": ["digit_sum", "flatten_nested", "fizzbuzz_label"], "tokens_total":'
    ' 1444, "lora_b_zero": false}')


def test_a_step_record_writes_the_line_it_read_byte_for_byte():
    record = StepRecord.from_json(json.loads(QUICKSTART_LINE))
    assert record.lora_b_zero is False and record.alarms is None and record.sampled_tokens == 1444
    assert json.dumps(record.to_json()) == QUICKSTART_LINE  # keys, their order and the values


def test_a_step_record_leaves_out_the_alarm_fields_until_they_are_set():
    record = StepRecord.from_json(json.loads(QUICKSTART_LINE))
    record.lora_b_zero = None
    assert "lora_b_zero" not in record.to_json() and "alarms" not in record.to_json()
    record.alarms = [{"name": "kl", "message": "too far"}]
    assert list(record.to_json())[-2:] == ["tokens_total", "alarms"]


def test_older_history_lines_are_upgraded_where_their_value_is_known(tmp_path):
    old = {"step": 1, "reward_mean": 0.5, "completion_len": 2.5, "puzzles": ["a", "b"], "retired_key": 1}
    append_jsonl(tmp_path / HISTORY, [old])
    [record] = read_steps(tmp_path, group_size=4)
    assert record.sampled_tokens == round(2.5 * 2 * 4)  # mean length x episodes
    assert record.errored == 0  # no error verdicts before `errored` was recorded
    assert record.reward_mean == 0.5 and record.prefill_s is None and record.tokens_total is None
    assert StepRecord.from_json(old).sampled_tokens is None  # the group size unknown: no estimate
    assert read_steps(tmp_path / "nothing", missing_ok=True) == []
    # readers of the JSON form get the same values, the line otherwise as it was
    assert upgrade_history_line(old) == {**old, "errored": 0}
    assert upgrade_history_line(old, 4) == {**old, "errored": 0, "sampled_tokens": 20}
    assert upgrade_history_line(json.loads(QUICKSTART_LINE), 4) == json.loads(QUICKSTART_LINE)


def test_a_staged_directory_appears_whole_or_not_at_all(tmp_path):
    out = tmp_path / "set"
    with pytest.raises(RuntimeError):
        with staged_directory(out) as staging:
            (staging / "half").write_text("x")
            raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []  # no out, no staging left behind
    with staged_directory(out) as staging:
        (staging / "a").write_text("1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"] and (out / "a").read_text() == "1"
    assert out.stat().st_mode & 0o777 == default_mode(directory=True)  # not mkdtemp's private 0700
    with pytest.raises(OSError):  # a full directory is never replaced unless asked
        with staged_directory(out) as staging:
            (staging / "b").write_text("2")
    assert [p.name for p in out.iterdir()] == ["a"] and len(list(tmp_path.iterdir())) == 1
    with staged_directory(out, overwrite=True) as staging:
        (staging / "b").write_text("2")
    assert [p.name for p in out.iterdir()] == ["b"]


def test_a_staged_directory_goes_where_a_symlink_points_and_refuses_a_file_up_front(tmp_path):
    disk = tmp_path / "disk"
    for target in (disk / "set", disk / "set"):  # dangling, then pointing at the full directory
        link = tmp_path / "link"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        with staged_directory(link, overwrite=True) as staging:
            (staging / "a").write_text("1")
        assert link.is_symlink() and (target / "a").read_text() == "1"
    assert sorted(p.name for p in disk.iterdir()) == ["set"]  # no staging left beside it
    file = tmp_path / "file"
    file.write_text("x")
    ran = []
    with pytest.raises(NotADirectoryError, match="file: a file is there, not a directory"):
        with staged_directory(file) as staging:
            ran.append(staging)  # the work a late failure would waste
    assert ran == [] and file.read_text() == "x"


def test_a_run_directory_is_trained_by_one_process_at_a_time(tmp_path):
    run = tmp_path / "runs" / "a"
    assert run_holder(run) is None  # no directory yet
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from mlx_swe_rl.runfiles import run_in_use\n"
        f"with run_in_use(Path({str(run)!r})):\n    print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert run_holder(run).startswith(f"pid {holder.pid} on ")
        with pytest.raises(RunInUseError, match=f"{run} is being trained by another process \\(pid {holder.pid} "):
            with run_in_use(run):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)  # killed, not ended: the kernel still drops the lock
        holder.wait()
    assert run_holder(run) is None
    with run_in_use(run):
        assert run_holder(run) == f"pid {os.getpid()} on {platform.node()}"
    assert run_holder(run) is None
