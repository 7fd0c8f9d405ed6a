"""Evaluation: pass@k, totals, and `python -m mlx_swe_rl.eval` end to end on the tiny model."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from click.testing import CliRunner

from mlx_swe_rl.cli.eval import main
from mlx_swe_rl.models import fastmath
from mlx_swe_rl.rl.evaluation import pass_at_k, totals
from mlx_swe_rl.puzzles.format import load_puzzles
from mlx_swe_rl.rl.config import SamplingPlan

ROOT = Path(__file__).resolve().parents[1]
COMPLETION_FIELDS = {"text", "num_tokens", "truncated", "finish", "code", "format_ok", "reward", "reward_parts",
                     "solved", "passed", "total", "tests"}


# ---------------------------------------------------------------------------------- pass@k
def test_pass_at_k_hand_values():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # 1 - C(3,3)/C(5,3)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # 1 - C(7,5)/C(10,5)
    assert pass_at_k(5, 0, 1) == 0.0
    assert pass_at_k(5, 0, 5) == 0.0
    assert pass_at_k(5, 4, 2) == 1.0  # n - c = 1 < k: every draw of 2 holds a correct one
    assert pass_at_k(3, 1, 3) == 1.0
    assert pass_at_k(1, 1, 1) == 1.0


@pytest.mark.parametrize("n, c, k", [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6), (0, 0, 1)])
def test_pass_at_k_invalid_arguments(n, c, k):
    with pytest.raises(ValueError, match="pass@k"):
        pass_at_k(n, c, k)


# ---------------------------------------------------------------------------------- totals
def row(pid, tier, split, p1, p2, solved):
    return {"id": pid, "tier": tier, "split": split, "pass@1": p1, "pass@2": p2, "solved": solved}


def test_totals_hand_values_and_order():
    rows = [row("a", "easy", "train", 0.5, 1.0, 1),
            row("b", "easy", "heldout", 0.0, 0.0, 0),
            row("c", "hard", "train", 1.0, 1.0, 2),
            row("d", "custom", "train", 0.0, 0.5, 1)]
    got = totals(rows, 2)
    table = [(t["tier"], t["split"], t["puzzles"], t["pass@1"], t["pass@2"], t["any_solved"]) for t in got]
    expected = [
        ("easy", "heldout", 1, 0.0, 0.0, 0),
        ("easy", "train", 1, 0.5, 1.0, 1),
        ("easy", "all", 2, 0.25, 0.5, 1),
        ("hard", "train", 1, 1.0, 1.0, 1),
        ("hard", "all", 1, 1.0, 1.0, 1),
        ("custom", "train", 1, 0.0, 0.5, 1),  # unknown tiers after the known ones
        ("custom", "all", 1, 0.0, 0.5, 1),
        ("all", "heldout", 1, 0.0, 0.0, 0),
        ("all", "train", 3, 1.5 / 3, 2.5 / 3, 3),
        ("all", "all", 4, 1.5 / 4, 2.5 / 4, 3),
    ]
    assert [t[:3] for t in table] == [e[:3] for e in expected]
    for t, e in zip(table, expected):
        assert t[3] == pytest.approx(e[3]) and t[4] == pytest.approx(e[4]) and t[5] == e[5]


# ---------------------------------------------------------------------------------- the command
def invoke(args):
    return CliRunner().invoke(main, [str(a) for a in args])


def table(stdout: str) -> list[str]:
    """The printed lines from the per-puzzle table's header on (a progress bar may precede it
    on the same line when stderr is mixed in, as with older click)."""
    lines = re.split(r"[\r\n]", stdout)
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["puzzle", "tier"])
    return [line for line in lines[start:] if line.strip()]


@pytest.fixture(scope="module")
def easy_ids() -> list[str]:
    return [p.id for p in load_puzzles(tiers=["easy"])]


@pytest.fixture(scope="module")
def greedy_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "e.json"
    result = invoke(["--model", tiny_model_dir, "--tiers", "easy", "--max-tokens", 8, "--out", out,
                     "--workers", 2])
    return result, out


def test_eval_command_writes_report(greedy_run, easy_ids, tiny_model_dir):
    result, out = greedy_run
    assert result.exit_code == 0, result.output
    lines = table(result.stdout)
    assert lines[0].split() == ["puzzle", "tier", "split", "solved", "pass@1", "reward", "tokens"]
    body = lines[1:1 + len(easy_ids)]
    assert [line.split()[0] for line in body] == easy_ids
    assert all(line.split()[1] == "easy" and line.split()[3] == "0/1" for line in body)  # a random model
    assert lines[1 + len(easy_ids)].split() == ["tier", "split", "puzzles", "pass@1", "95%", "CI", "solved", "(any",
                                                 "sample)"]
    assert any(line.split()[:3] == ["all", "all", str(len(easy_ids))] for line in lines)
    assert f"wrote {out}" in result.stdout

    report = json.loads(out.read_text())
    assert set(report) >= {"meta", "settings", "timing", "totals", "puzzles"}
    meta = report["meta"]
    assert meta["model"] == str(tiny_model_dir)
    assert meta["mlx"] == mx.__version__
    assert meta["blas"] and meta["dtype"] == "float32" and meta["adapter"] is None
    assert meta["model_patches"] == fastmath.patched()  # what the model ran besides mlx-lm's own code
    assert report["settings"] == {"samples": 1, "temperature": 0.0, "max_tokens": 8, "seed": 0,
                                  "stop_after_answer": True}
    assert report["timing"]["generated_tokens"] == sum(
        c["num_tokens"] for r in report["puzzles"] for c in r["completions"])
    assert 0 < report["timing"]["prefill_seconds"] < report["timing"]["sampling_seconds"]

    rows = report["puzzles"]
    assert len(rows) == len(easy_ids) == 18
    assert [r["id"] for r in rows] == easy_ids
    for r in rows:
        assert r["tier"] == "easy" and r["samples"] == 1 and len(r["completions"]) == 1
        assert set(r) >= {"pass@1", "solved", "mean_reward"}
        c = r["completions"][0]
        assert set(c) >= COMPLETION_FIELDS
        assert 1 <= c["num_tokens"] <= 8
        assert isinstance(c["text"], str) and isinstance(c["tests"], list)
        assert c["reward"] == r["mean_reward"]
    overall = next(t for t in report["totals"] if (t["tier"], t["split"]) == ("all", "all"))
    assert overall["puzzles"] == 18
    assert overall["pass@1"] == pytest.approx(sum(r["pass@1"] for r in rows) / 18)


def test_eval_is_deterministic_greedy(greedy_run, tiny_model_dir, tmp_path):
    _, first = greedy_run
    out = tmp_path / "again.json"
    result = invoke(["--model", tiny_model_dir, "--tiers", "easy", "--max-tokens", 8, "--out", out,
                     "--workers", 2])
    assert result.exit_code == 0, result.output
    before, again = json.loads(first.read_text()), json.loads(out.read_text())
    assert again["puzzles"] == before["puzzles"] and again["totals"] == before["totals"]


def test_eval_full_completions_flag(greedy_run, tiny_model_dir, tmp_path):
    _, first = greedy_run
    out = tmp_path / "full.json"
    result = invoke(["--model", tiny_model_dir, "--tiers", "easy", "--max-tokens", 8, "--out", out,
                     "--workers", 2, "--full-completions"])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["settings"]["stop_after_answer"] is False
    # a random model writes no code block, so there was nothing to stop on
    assert report["puzzles"] == json.loads(first.read_text())["puzzles"]


def test_eval_samples_reports_pass_at_k(tiny_model_dir, tmp_path, easy_ids):
    out = tmp_path / "k.json"
    result = invoke(["--model", tiny_model_dir, "--tiers", "easy", "--max-tokens", 6, "--samples", 3,
                     "--out", out, "--workers", 2])
    assert result.exit_code == 0, result.output
    assert table(result.stdout)[0].split() == ["puzzle", "tier", "split", "solved", "pass@1", "pass@3",
                                                     "reward", "tokens"]
    report = json.loads(out.read_text())
    assert report["settings"]["samples"] == 3
    assert report["settings"]["temperature"] == 0.8  # the default when sampling several
    assert len(report["puzzles"]) == len(easy_ids)
    for r in report["puzzles"]:
        assert r["samples"] == 3 and len(r["completions"]) == 3
        assert "pass@3" in r and "pass@1" in r
        assert r["pass@3"] == pass_at_k(3, r["solved"], 3)
    assert all("pass@3" in t for t in report["totals"])
    # at temperature 0.8 the three completions of a puzzle are not all the same
    texts = [tuple(c["text"] for c in r["completions"]) for r in report["puzzles"]]
    assert any(len(set(t)) > 1 for t in texts)


def assert_one_line_error(result, *needles):
    assert result.exit_code != 0
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_eval_unknown_tier(tiny_model_dir, tmp_path):
    result = invoke(["--model", tiny_model_dir, "--tiers", "nosuch", "--out", tmp_path / "x.json"])
    assert_one_line_error(result, "nosuch")
    assert not (tmp_path / "x.json").exists()


def test_eval_missing_model(tmp_path):
    missing = tmp_path / "no_model_here"
    result = invoke(["--model", missing, "--tiers", "easy", "--out", tmp_path / "x.json"])
    assert_one_line_error(result, str(missing))
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("flag", [["--temperature=-0.5"], ["--temperature", "-1"]])
def test_eval_negative_temperature(tiny_model_dir, tmp_path, flag):
    result = invoke(["--model", tiny_model_dir, "--tiers", "easy", *flag, "--out", tmp_path / "x.json"])
    assert_one_line_error(result, "--temperature", ">= 0")


def test_eval_zero_samples_rejected(tiny_model_dir, tmp_path):
    result = invoke(["--model", tiny_model_dir, "--samples", "0", "--out", tmp_path / "x.json"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--samples" in result.output


def test_python_m_eval_help():
    proc = subprocess.run([sys.executable, "-m", "mlx_swe_rl.eval", "--help"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "Usage:" in proc.stdout
    for option in ("--model", "--samples", "--temperature", "--max-tokens", "--tiers", "--out"):
        assert option in proc.stdout


# ---------------------------------------------------------------------------------- a puzzle that cannot be scored
@pytest.mark.parametrize("turns", [1, 2])
def test_evaluation_survives_and_reports_a_puzzle_that_cannot_be_scored(tiny_model, scorer, turns):
    import dataclasses

    from mlx_swe_rl.env.codefix import CodeFixEnv
    from mlx_swe_rl.env.feedback import TestSplit
    from mlx_swe_rl.rl.evaluation import evaluate, format_report

    good = load_puzzles(tiers=["easy"])[:2]
    broken = dataclasses.replace(good[0], id="broken_oracle", oracle=good[0].oracle + "\nraise RuntimeError('down')\n")
    model, tokenizer = tiny_model
    split = TestSplit(public=1) if turns > 1 else None
    with CodeFixEnv(good + [broken], scorer, split=split) as env:
        report = evaluate(model, tokenizer, env, good + [broken], SamplingPlan(2, 1.0, 4, max_turns=turns),
                          progress=False)
    rows = {r["id"]: r for r in report["puzzles"]}
    assert list(rows) == [good[0].id, good[1].id, "broken_oracle"]
    assert report["errored"] == [{"id": "broken_oracle", "completions": 2, "error": rows["broken_oracle"]["error"]}]
    assert "RuntimeError: down" in rows["broken_oracle"]["error"] and rows["broken_oracle"]["solved"] == 0
    assert all("error" not in rows[p.id] for p in good)
    for c in rows["broken_oracle"]["completions"]:
        assert c["reward"] == 0.0 and c["error"] == rows["broken_oracle"]["error"]
        if turns > 1:
            assert len(c["turns"]) == 1  # no feedback to answer: the episode ends at once
    overall = next(t for t in report["totals"] if (t["tier"], t["split"]) == ("all", "all"))
    assert overall["puzzles"] == 3  # counted, as unsolved
    assert "not scored (counted as unsolved): broken_oracle, 2 completion(s): " in format_report(report)


# ---------------------------------------------------------------------------------- the evaluation journal
def test_a_journalled_evaluation_answers_the_same_and_resumes_from_its_journal(tiny_model, scorer, tmp_path):
    """Recording each puzzle as it finishes changes no answer; a killed evaluation's journal
    gives back the puzzles it finished, and only the others are sampled again."""
    from mlx_swe_rl.env.codefix import CodeFixEnv
    from mlx_swe_rl.rl.evaluation import evaluate
    from mlx_swe_rl.rl.journal import Journal, JournalError

    model, tokenizer = tiny_model
    puzzles = load_puzzles(tiers=["easy"])[:4]
    plan = SamplingPlan(2, 1.0, 6, seed=3)
    header = {"model": "tiny", "puzzles": [p.id for p in puzzles]}
    path = tmp_path / "eval.journal.jsonl"
    with CodeFixEnv(puzzles, scorer) as env:
        plain = evaluate(model, tokenizer, env, puzzles, plan, progress=False)
        journalled = evaluate(model, tokenizer, env, puzzles, plan, progress=False,
                              journal=Journal.open(path, header, what="evaluation"))
        assert journalled["puzzles"] == plain["puzzles"]
        assert journalled["timing"]["generated_tokens"] == plain["timing"]["generated_tokens"]
        assert "sessions" not in journalled["timing"]
        lines = path.read_text().splitlines()
        assert [next(iter(json.loads(line))) for line in lines] == ["header", "session"] + ["row"] * 4

        killed = tmp_path / "killed.journal.jsonl"  # a session that finished two puzzles, then died
        killed.write_text("\n".join(lines[:4]) + "\n" + lines[4][:20])
        journal = Journal.open(killed, header, what="evaluation")
        first = [json.loads(line)["row"] for line in lines[2:4]]
        assert sorted(journal.rows) == sorted(r["id"] for r in first)
        resumed = evaluate(model, tokenizer, env, puzzles, plan, progress=False, journal=journal)
    assert [r["id"] for r in resumed["puzzles"]] == [p.id for p in puzzles]
    by_id = {r["id"]: r for r in resumed["puzzles"]}
    assert all(by_id[r["id"]] == r for r in first)  # kept as recorded, not sampled again
    timing = resumed["timing"]
    assert timing["sessions"] == 2 and timing["earlier_sessions"][0]["puzzles"] == 2
    assert timing["seconds"] > timing["earlier_sessions"][0]["seconds"] > 0  # every sitting's time
    assert timing["generated_tokens"] == sum(c["num_tokens"] for r in resumed["puzzles"] for c in r["completions"])
    with pytest.raises(JournalError, match="unfinished evaluation of other model"):
        Journal.open(killed, {**header, "model": "other"}, what="evaluation")
    with pytest.raises(ValueError, match="single-turn"):
        evaluate(model, tokenizer, None, puzzles, plan.but(max_turns=2), journal=journal)


def test_the_eval_command_resumes_a_killed_evaluation_with_the_same_out(tiny_model_dir, tmp_path, easy_ids,
                                                                         journal_killed_after):
    from mlx_swe_rl.rl.journal import journal_path

    out = tmp_path / "e.json"
    args = ["--model", tiny_model_dir, "--tiers", "easy", "--max-tokens", 6, "--out", out, "--workers", 2]
    with journal_killed_after(2):
        assert invoke(args).exit_code != 0 and not out.exists()
    other = invoke([*args[:5], 7, *args[6:]])  # another token limit: not the killed evaluation
    assert other.exit_code == 1 and "unfinished evaluation of other plan" in other.output
    result = invoke(args)
    assert result.exit_code == 0, result.output
    assert f"resuming: 2 of {len(easy_ids)} puzzles finished before" in result.output
    report = json.loads(out.read_text())
    assert [r["id"] for r in report["puzzles"]] == easy_ids and report["timing"]["sessions"] == 2
    assert not journal_path(out).exists()


def test_an_evaluation_journal_is_refused_once_its_adapter_was_rewritten(tmp_path):
    """A run that trained on after a killed evaluation of its adapters rewrote them in place:
    the journal's rows were answers of other weights."""
    import os

    from mlx_swe_rl.rl.evaluation import open_journal
    from mlx_swe_rl.rl.journal import JournalError

    adapter = tmp_path / "run"
    adapter.mkdir()
    (adapter / "adapters.safetensors").write_bytes(b"step 10")
    puzzles = load_puzzles(tiers=["easy"])[:2]
    plan = SamplingPlan(1, 0.0, 8)
    open_journal(tmp_path / "e.json", puzzles, plan, adapter=adapter, model="m").add({"id": puzzles[0].id, "completions": []})
    assert list(open_journal(tmp_path / "e.json", puzzles, plan, adapter=adapter, model="m").rows) == [puzzles[0].id]
    (adapter / "adapters.safetensors").write_bytes(b"step 20")
    os.utime(adapter / "adapters.safetensors", ns=(1, 2))
    with pytest.raises(JournalError, match="of other adapter_files"):
        open_journal(tmp_path / "e.json", puzzles, plan, adapter=adapter, model="m")
