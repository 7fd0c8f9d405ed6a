"""Calibration (`mlx-swe-rl calibrate`, once `rollouts`), rollout categories and train-set files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mlx_swe_rl.env import codefix as env_module
from mlx_swe_rl.env.verdict import Verdict
from mlx_swe_rl.cli.app import main
from mlx_swe_rl.cli.eval import main as eval_main
from mlx_swe_rl.puzzles.format import load_puzzles
from mlx_swe_rl.rl.rollouts import ALL_FAILED, ALL_SOLVED, MIXED, Episode, category
from mlx_swe_rl.models.sampling import Sample
from mlx_swe_rl.puzzles.trainset import TrainSetError, load_train_set, source_directory, write_train_set
from mlx_swe_rl.rl.config import SamplingPlan

EPS = 1e-4


def invoke(command, args):
    return CliRunner().invoke(command, [str(a) for a in args])


def rollout_args(model_dir, out, *extra):
    # every easy puzzle (calibrate's default split is the training one), in one round
    return ["calibrate", "--model", model_dir, "-G", 2, "--max-tokens", 8, "--tiers", "easy", "--split", "all",
            "--rounds", 1, "--out", out, "--workers", 2, *extra]


# ---------------------------------------------------------------------------------- categories
def rollout(solved: bool, reward: float | None = None) -> Episode:
    sample = Sample(0, [1, 2], "text", [-0.1, -0.2], "eos")
    return Episode.single(sample, Verdict("p", float(solved) if reward is None else reward, solved, None, None, {}, 0, 1))


def test_category_hand_built():
    assert category([rollout(True), rollout(True), rollout(True)]) == ALL_SOLVED == "all-solved"
    assert category([rollout(False), rollout(False)]) == ALL_FAILED == "all-failed"
    assert category([rollout(True), rollout(False), rollout(False)]) == MIXED == "mixed"
    assert category([rollout(False), rollout(False), rollout(True)]) == MIXED
    # category is about solving, not reward: partial credit without a solve is still a failure
    assert category([rollout(False, 0.8), rollout(False, 0.2)]) == ALL_FAILED


# ---------------------------------------------------------------------------------- calibrate command
@pytest.fixture(scope="module")
def random_rollouts(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("rollouts") / "r.json"
    return invoke(main, rollout_args(tiny_model_dir, out)), out


def test_rollouts_command_report(random_rollouts):
    result, out = random_rollouts
    assert result.exit_code == 0, result.output
    easy = load_puzzles(tiers=["easy"])
    report = json.loads(out.read_text())
    assert set(report) >= {"meta", "settings", "timing", "categories", "puzzles"}
    assert report["settings"]["group_size"] == 2 and report["settings"]["temperature"] == 0.8
    assert report["settings"]["advantage"] == "std"
    assert report["categories"] == {"all-failed": len(easy)}  # a random model solves nothing
    assert [r["id"] for r in report["puzzles"]] == [p.id for p in easy]
    for r in report["puzzles"]:
        assert len(r["rewards"]) == len(r["advantages"]) == len(r["completions"]) == 2
        assert r["category"] == "all-failed" and r["solved"] == 0 and r["solve_rate"] == 0.0
        assert r["advantages"] == [0.0, 0.0]
        assert all(1 <= c["num_tokens"] <= 8 for c in r["completions"])
    assert "all-solved: 0, mixed: 0, all-failed: 18" in result.stdout
    assert f"wrote {out}" in result.stdout


def test_write_train_set_without_mixed_puzzles_fails(tiny_model_dir, tmp_path):
    out, train = tmp_path / "r.json", tmp_path / "train.json"
    result = invoke(main, rollout_args(tiny_model_dir, out, "--write-train-set", train))
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert "Error: no mixed puzzles" in result.output and "train set not written" in result.output
    assert out.is_file()  # the rollouts themselves are kept
    assert not train.exists()


def test_rollouts_rejects_zero_temperature(tiny_model_dir, tmp_path):
    result = invoke(main, rollout_args(tiny_model_dir, tmp_path / "r.json", "--temperature", "0"))
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "--temperature" in result.output and "> 0" in result.output
    assert not (tmp_path / "r.json").exists()


@pytest.fixture
def every_other_puzzle_mixed(monkeypatch):
    """Score so that, with G=2 and puzzles in order, puzzles 0, 2, 4, ... get one solved and one
    failed completion and the others fail twice (a stand-in for a model that sometimes solves)."""

    order = {p.id: i for i, p in enumerate(load_puzzles(tiers=["easy"]))}
    seen: dict[str, int] = {}

    def fake_score(self, items):  # by puzzle and answer, however the answers are batched for scoring
        out = []
        for pid, text in items:
            solved = order[pid] % 2 == 0 and seen.get(pid, 0) == 0
            seen[pid] = seen.get(pid, 0) + 1
            total = len(self.puzzles[pid].tests)
            out.append(Verdict(pid, float(solved), solved, "x = 1" if solved else None, None, {"tests": float(solved)},
                               passed=total if solved else 0, total=total))
        return out

    monkeypatch.setattr(env_module.CodeFixEnv, "score", fake_score)


def test_rollouts_writes_mixed_train_set_usable_by_eval(tiny_model_dir, tmp_path, every_other_puzzle_mixed):
    out, train = tmp_path / "r.json", tmp_path / "sets" / "train.json"
    result = invoke(main, rollout_args(tiny_model_dir, out, "--write-train-set", train))
    assert result.exit_code == 0, result.output
    easy = load_puzzles(tiers=["easy"])
    expected_mixed = [p.id for p in easy[::2]]
    report = json.loads(out.read_text())
    rows = report["puzzles"]
    assert report["categories"] == {"mixed": len(expected_mixed), "all-failed": len(easy) - len(expected_mixed)}
    a = 0.5 / (0.5 + EPS)  # std advantages of rewards [1, 0]
    for i, r in enumerate(rows):
        if i % 2 == 0:
            assert r["category"] == "mixed" and r["rewards"] == [1.0, 0.0]
            assert r["advantages"] == pytest.approx([a, -a], abs=1e-6)
        else:
            assert r["category"] == "all-failed" and r["advantages"] == [0.0, 0.0]

    saved = json.loads(train.read_text())
    assert saved["puzzles"] == expected_mixed and saved["puzzle_dir"] is None
    assert saved["source"]["group_size"] == 2 and saved["source"]["rollouts"] == str(out)
    assert f"({len(expected_mixed)} mixed puzzles)" in result.stdout
    assert [p.id for p in load_train_set(train)] == expected_mixed

    # eval accepts the train set as --puzzles and evaluates exactly those puzzles, in order
    eval_out = tmp_path / "e.json"
    result = invoke(eval_main, ["--model", tiny_model_dir, "--puzzles", train, "--max-tokens", 4,
                                "--out", eval_out, "--workers", 2])
    assert result.exit_code == 0, result.output
    assert [r["id"] for r in json.loads(eval_out.read_text())["puzzles"]] == expected_mixed


# ---------------------------------------------------------------------------------- train sets
def write_puzzle(root: Path, pid: str, tier: str = "easy", split: str = "train") -> None:
    data = {"id": pid, "tier": tier, "split": split, "entry_point": "add_one",
            "description": "Return x plus one.",
            "buggy": "def add_one(x):\n    return x - 1\n",
            "oracle": "def add_one(x):\n    return x + 1\n",
            "tests": ["assert add_one(1) == 2", "assert add_one(-1) == 0"]}
    path = root / tier / f"{pid}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_train_set_roundtrip_keeps_order_and_filters(tmp_path):
    bundled = {p.id: p for p in load_puzzles()}
    easy_train = next(p for p in bundled.values() if (p.tier, p.split) == ("easy", "train"))
    easy_heldout = next(p for p in bundled.values() if (p.tier, p.split) == ("easy", "heldout"))
    hard = next(p for p in bundled.values() if p.tier == "hard")
    chosen = [hard, easy_heldout, easy_train]  # not in the loader's sorted order
    path = tmp_path / "ts.json"
    write_train_set(path, chosen, None, {"why": "test"})
    data = json.loads(path.read_text())
    assert data == {"puzzle_dir": None, "puzzles": [p.id for p in chosen], "source": {"why": "test"}}
    assert [p.id for p in load_train_set(path)] == [p.id for p in chosen]
    assert [p.id for p in load_train_set(path, ["easy"])] == [easy_heldout.id, easy_train.id]
    assert [p.id for p in load_train_set(path, None, "heldout")] == [easy_heldout.id]
    assert [p.id for p in load_train_set(path, ["easy"], "train")] == [easy_train.id]
    assert load_train_set(path, ["medium"]) == []
    loaded = load_train_set(path)[0]
    assert loaded.oracle == hard.oracle and loaded.tests == hard.tests


def test_train_set_with_own_puzzle_dir(tmp_path, monkeypatch):
    root = tmp_path / "pz"
    write_puzzle(root, "p_one")
    write_puzzle(root, "p_two", split="heldout")
    puzzles = load_puzzles(root)
    path = tmp_path / "sets" / "ts.json"
    write_train_set(path, puzzles[::-1], root, {})
    assert json.loads(path.read_text())["puzzle_dir"] == str(root.resolve())
    monkeypatch.chdir(tmp_path / "sets")  # an absolute directory does not depend on the cwd
    assert [p.id for p in load_train_set(path)] == ["p_two", "p_one"]
    # a relative directory is relative to the file
    rel = tmp_path / "rel.json"
    rel.write_text(json.dumps({"puzzle_dir": "pz", "puzzles": ["p_one"]}))
    assert source_directory(rel) == tmp_path / "pz"
    assert [p.id for p in load_train_set(rel)] == ["p_one"]
    assert source_directory(None) is None and source_directory(root) == root


def test_train_set_unknown_id_names_file_and_id(tmp_path):
    path = tmp_path / "ts.json"
    path.write_text(json.dumps({"puzzle_dir": None, "puzzles": ["clamp_value", "no_such_puzzle_id"]}))
    with pytest.raises(TrainSetError) as info:
        load_train_set(path)
    assert str(path) in str(info.value) and "no_such_puzzle_id" in str(info.value)
    # an id filtered away by tier is still checked
    with pytest.raises(TrainSetError, match="no_such_puzzle_id"):
        load_train_set(path, ["hard"])


@pytest.mark.parametrize("text, needle", [
    ("{not json", "not valid JSON"),
    ('["a", "b"]', "expected a list of puzzle ids"),
    ('{"puzzles": "clamp_value"}', "expected a list of puzzle ids"),
])
def test_train_set_bad_files(tmp_path, text, needle):
    path = tmp_path / "ts.json"
    path.write_text(text)
    with pytest.raises(TrainSetError) as info:
        load_train_set(path)
    assert str(path) in str(info.value) and needle in str(info.value)


def test_train_set_missing_file(tmp_path):
    with pytest.raises(TrainSetError, match="cannot read train set"):
        load_train_set(tmp_path / "missing.json")


def test_eval_with_bad_train_set_is_one_line_error(tiny_model_dir, tmp_path):
    path = tmp_path / "ts.json"
    path.write_text("{not json")
    result = invoke(eval_main, ["--model", tiny_model_dir, "--puzzles", path, "--out", tmp_path / "e.json"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "not valid JSON" in lines[0]


# ---------------------------------------------------------------------------------- early stopping
class ScriptedEnv:
    """Solves each puzzle's n-th scored completion as its script says, whatever the text."""

    def __init__(self, scripts: dict[str, list[int]]):
        self.scripts, self.scored = scripts, {pid: 0 for pid in scripts}

    def prompt_for(self, puzzle_id: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"fix {puzzle_id}"}]

    def stop_rule(self, puzzle_id: str) -> None:  # completions run to EOS or the limit
        return None

    def score(self, items):
        out = []
        for pid, _ in items:
            solved = bool(self.scripts[pid][self.scored[pid]])
            self.scored[pid] += 1
            out.append(Verdict(pid, float(solved), solved, None, None, {"tests": float(solved)}, int(solved), 1))
        return out


@pytest.mark.parametrize("rounds,batch_size", [(1, 32), (2, 32), (4, 32), (2, 3), (4, 2)])
def test_rounds_stop_mixed_puzzles_and_keep_every_category(tiny_model, rounds, batch_size):
    """Small batches interleave one puzzle's later rounds with other puzzles' earlier ones
    (one continuous batch); the stopping rule is the same."""
    from mlx_swe_rl.rl.calibration import calibrate

    model, tokenizer = tiny_model
    scripts = {"a": [1, 0, 1, 1], "b": [0, 0, 0, 0], "c": [0, 0, 1, 0], "d": [1, 1, 1, 1], "e": [0, 1, 0, 0]}
    puzzles = [p for p in load_puzzles(tiers=["easy"])[:5]]
    env = ScriptedEnv({p.id: script for p, script in zip(puzzles, scripts.values())})
    report = calibrate(model, tokenizer, env, puzzles, SamplingPlan(4, 0.8, 4, batch_size=batch_size), rounds=rounds,
                       progress=False)
    rows = {row["id"]: row for row in report["puzzles"]}
    by_script = {name: rows[p.id] for name, p in zip(scripts, puzzles)}
    # The same category as from all four samples, however many rounds.
    assert {k: r["category"] for k, r in by_script.items()} == {
        "a": "mixed", "b": "all-failed", "c": "mixed", "d": "all-solved", "e": "mixed"}
    # A puzzle stops at the end of the first round that makes it mixed.
    stop = {1: {"a": 4, "c": 4, "e": 4}, 2: {"a": 2, "c": 4, "e": 2}, 4: {"a": 2, "c": 3, "e": 2}}[rounds]
    assert {k: r["samples"] for k, r in by_script.items() if r["category"] == "mixed"} == stop
    assert by_script["b"]["samples"] == by_script["d"]["samples"] == 4
    for r in rows.values():
        assert len(r["rewards"]) == len(r["advantages"]) == len(r["completions"]) == r["samples"]
        assert r["solve_rate"] == r["solved"] / r["samples"]
    assert report["timing"]["completions"] == sum(r["samples"] for r in rows.values())
    assert 0 < report["timing"]["prefill_seconds"] < report["timing"]["sampling_seconds"]
    assert report["settings"]["rounds"] == rounds


# ---------------------------------------------------------------------------------- the journal
class Killed(Exception):
    pass


def scripted(rounds_of: dict[str, list[int]]):
    puzzles = load_puzzles(tiers=["easy"])[:len(rounds_of)]
    return puzzles, {p.id: script for p, script in zip(puzzles, rounds_of.values())}


SCRIPTS = {"a": [1, 0, 1, 1], "b": [0, 0, 0, 0], "c": [0, 0, 1, 0], "d": [1, 1, 1, 1], "e": [0, 1, 0, 0],
           "f": [1, 1, 0, 1]}


def journal_calibration(tiny_model, puzzles, scripts, journal, batch_size=3):
    from mlx_swe_rl.rl.calibration import calibrate

    model, tokenizer = tiny_model
    env = ScriptedEnv(scripts)
    report = calibrate(model, tokenizer, env, puzzles, SamplingPlan(4, 0.8, 4, batch_size=batch_size), rounds=2,
                       progress=False, journal=journal)
    return report, env


def test_a_journal_changes_nothing_an_uninterrupted_calibration_draws(tiny_model, tmp_path):
    from mlx_swe_rl.rl.calibration import calibrate
    from mlx_swe_rl.rl.journal import Journal

    puzzles, scripts = scripted(SCRIPTS)
    model, tokenizer = tiny_model
    plain = calibrate(model, tokenizer, ScriptedEnv(scripts), puzzles, SamplingPlan(4, 0.8, 4, batch_size=3),
                      rounds=2, progress=False)
    journal = Journal.open(tmp_path / "c.journal.jsonl", {"puzzles": [p.id for p in puzzles]})
    journalled, _ = journal_calibration(tiny_model, puzzles, scripts, journal)
    assert journalled["puzzles"] == plain["puzzles"] and journalled["settings"] == plain["settings"]
    assert "earlier_sessions" not in journalled["timing"]
    lines = [json.loads(line) for line in journal.path.read_text().splitlines()]
    assert [next(iter(line)) for line in lines] == ["header", "session"] + ["row"] * len(puzzles)
    assert sorted(line["row"]["id"] for line in lines[2:]) == sorted(p.id for p in puzzles)
    journal.close()
    assert not journal.path.exists()


def test_a_killed_calibration_resumes_from_its_journal(tiny_model, tmp_path):
    from mlx_swe_rl.rl.journal import Journal, progress

    puzzles, scripts = scripted(SCRIPTS)
    path, header = tmp_path / "c.journal.jsonl", {"model": "tiny", "puzzles": [p.id for p in puzzles]}
    first = Journal.open(path, header)
    add = first.add

    def add_then_die(row):
        add(row)
        if len(first.rows) == 3:
            raise Killed
    first.add = add_then_die
    with pytest.raises(Killed):
        journal_calibration(tiny_model, puzzles, scripts, first)
    kept = dict(first.rows)
    assert progress(path) == (3, len(puzzles))

    again = Journal.open(path, header)
    assert again.rows == kept and len(again.earlier) == 1 and again.earlier[0]["puzzles"] == 3
    report, env = journal_calibration(tiny_model, puzzles, scripts, again)
    # the finished puzzles are taken from the journal, never sampled again; the others are, from their start
    assert all(env.scored[pid] == 0 for pid in kept)
    rows = {row["id"]: row for row in report["puzzles"]}
    assert [row["id"] for row in report["puzzles"]] == [p.id for p in puzzles]
    assert all(rows[pid] == row for pid, row in kept.items())
    by_script = {name: rows[p.id]["category"] for name, p in zip(SCRIPTS, puzzles)}
    assert by_script == {"a": MIXED, "b": ALL_FAILED, "c": MIXED, "d": ALL_SOLVED, "e": MIXED, "f": MIXED}
    # the totals count both sessions: the earlier one's up to its last finished puzzle
    timing = report["timing"]
    assert timing["completions"] == sum(r["samples"] for r in rows.values())
    assert timing["generated_tokens"] == sum(c["num_tokens"] for r in rows.values() for c in r["completions"])
    assert timing["earlier_sessions"] == again.earlier and timing["sampling_seconds"] > again.earlier[0]["seconds"]
    assert report["categories"] == {MIXED: 4, ALL_FAILED: 1, ALL_SOLVED: 1}


def test_a_journal_finished_before_samples_nothing(tiny_model, tmp_path):
    from mlx_swe_rl.rl.journal import Journal

    puzzles, scripts = scripted(SCRIPTS)
    header = {"puzzles": [p.id for p in puzzles]}
    first, _ = journal_calibration(tiny_model, puzzles, scripts, Journal.open(tmp_path / "j.jsonl", header))
    report, env = journal_calibration(tiny_model, puzzles, scripts, Journal.open(tmp_path / "j.jsonl", header))
    assert sum(env.scored.values()) == 0 and report["puzzles"] == first["puzzles"]
    assert report["timing"]["completions"] == first["timing"]["completions"]


def test_a_journal_of_another_calibration_is_refused(tmp_path):
    from mlx_swe_rl.rl.journal import Journal, JournalError

    path = tmp_path / "c.journal.jsonl"
    Journal.open(path, {"model": "a", "settings": {"rounds": 2}, "puzzles": ["x"]})
    # it finished nothing (killed while loading, say): nothing is lost by starting another calibration there
    Journal.open(path, {"model": "a", "settings": {"rounds": 3}, "puzzles": ["x"]}).add({"id": "x", "completions": []})
    with pytest.raises(JournalError) as info:
        Journal.open(path, {"model": "a", "settings": {"rounds": 4}, "puzzles": ["x"]})
    assert str(path) in str(info.value) and "of other settings" in str(info.value) and "\n" not in str(info.value)
    assert list(Journal.open(path, {"model": "a", "settings": {"rounds": 3}, "puzzles": ["x"]}).rows) == ["x"]
    path.write_text("{not json\n{}\n")
    with pytest.raises(JournalError, match="line 1 is not JSON"):
        Journal.open(path, {"puzzles": ["x"]})


def test_a_line_cut_off_by_the_kill_is_dropped(tmp_path):
    from mlx_swe_rl.rl.journal import Journal

    path, header = tmp_path / "c.journal.jsonl", {"puzzles": ["x", "y"]}
    journal = Journal.open(path, header)
    journal.add({"id": "x", "completions": [{"num_tokens": 3}]})
    journal.add({"id": "y", "completions": [{"num_tokens": 4}]})
    path.write_text(path.read_text()[:-20])  # the kill came while "y" was written
    again = Journal.open(path, header)
    assert list(again.rows) == ["x"] and again.earlier == [
        {"seconds": again.earlier[0]["seconds"], "puzzles": 1, "generated_tokens": 3, "completions": 1}]
    assert all(json.loads(line) for line in path.read_text().splitlines())  # appended after whole lines


def test_calibrate_command_resumes_and_refuses_another_journal(tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "cal.json"
    journal = tmp_path / "cal.journal.jsonl"
    journal.write_text(json.dumps({"header": {"model": "another"}}) + "\n"
                       + json.dumps({"row": {"id": "x", "completions": []}, "elapsed": 1.0}) + "\n")
    result = invoke(main, rollout_args(tiny_model_dir, out))
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert str(journal) in result.output and "unfinished calibration of other" in result.output
    journal.unlink()
    result = invoke(main, rollout_args(tiny_model_dir, out))
    assert result.exit_code == 0, result.output
    assert out.is_file() and not journal.exists()  # the report written, the journal gone
