"""scripts/groups_report.py: wasted groups and learning per sampled token, compared at equal
sampled tokens between runs written today and runs kept in a committed results file."""

import json

import yaml

from script_module import load_script

report = load_script("groups_report")


def step(n: int, tokens_total: int, sampled: int, kept: int, reward: float = 0.5) -> dict:
    return {"step": n, "tokens_total": tokens_total, "groups_sampled": sampled, "groups_kept": kept,
            "extra_groups": sampled - 5, "reward_mean": reward, "step_s": 60.0, "sampled_tokens": 0}


def test_a_committed_run_gets_the_tokens_and_kept_groups_its_curves_imply():
    curves = {"completion_len": [100.0, 50.5], "zero_var_frac": [0.4, 0.0], "reward_mean": [0.1, 0.2],
              "step_s": [30.0, 40.0]}
    history = report.committed_history(curves, puzzles_per_step=5, group_size=8)
    assert [h["tokens_total"] for h in history] == [4000, 4000 + 2020]
    assert [h["groups_kept"] for h in history] == [3, 5] and all(h["groups_sampled"] == 5 for h in history)


def test_totals_at_equal_tokens_count_only_the_steps_within_them():
    history = [step(1, 1000, 5, 2), step(2, 2000, 7, 5), step(3, 3000, 5, 5)]
    cut = report.totals(report.upto(history, 2500))
    assert cut["steps"] == 2 and cut["groups_sampled"] == 12 and cut["groups_kept"] == 7
    assert abs(cut["wasted_share"] - 5 / 12) < 1e-12 and cut["kept_per_100k_tokens"] == 1e5 * 7 / 2000
    assert cut["steps_over_10pct_wasted"] == 2  # 3 of 5 wasted, then 2 of 7
    assert report.upto(history, 10)[0]["step"] == 1  # the first step always counts


def test_the_report_pairs_a_run_with_the_base_evaluations_beside_it(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    run = runs / "learnable-s0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"seed": 0, "sampling": {"group_size": 8},
                                                     "train": {"steps": 2, "puzzles_per_step": 5, "order": "learnable"}}))
    (run / "history.jsonl").write_text("".join(json.dumps(h) + "\n" for h in [step(1, 3000, 5, 5), step(2, 6000, 6, 5)]))

    def evaluation(rates: list[float]) -> dict:
        return {"puzzles": [{"id": f"p{i}", "split": "train", "pass@1": r} for i, r in enumerate(rates)]}

    (runs / "eval-base-valid.json").write_text(json.dumps(evaluation([0.0, 0.25, 0.5, 0.0])))
    (runs / "eval-learnable-s0-valid.json").write_text(json.dumps(evaluation([0.5, 0.25, 0.5, 0.5])))
    committed = tmp_path / "transfer.json"
    committed.write_text(json.dumps({"runs": {"breadth-s0": {
        "curves": {"completion_len": [100.0, 100.0], "zero_var_frac": [0.6, 0.2], "reward_mean": [0.2, 0.3],
                   "step_s": [60.0, 60.0]},
        "change": {"valid": {"change": 0.1, "ci95": [0.0, 0.2], "puzzles": 4}, "train": {"change": 0.5, "ci95": [0.4, 0.6]}}}}}))
    out = tmp_path / "out" / "groups"
    monkeypatch.setattr("sys.argv", ["groups_report.py", str(run), "--committed", f"{committed}:breadth-s0", "--out", str(out)])
    report.main()
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["equal_tokens"] == 6000 and out.with_suffix(".png").is_file()
    mine, theirs = data["runs"]["learnable-s0"], data["runs"]["breadth-s0"]
    assert mine["change"]["valid"]["change"] == 0.25 and mine["change"]["valid"]["improved"] == 2
    assert mine["change"]["valid"]["per_100k_tokens"][0] == 1e5 * 0.25 / 6000
    assert abs(mine["whole_run"]["wasted_share"] - 1 / 11) < 1e-12
    assert theirs["whole_run"]["groups_kept"] == 2 + 4 and set(theirs["change"]) == {"valid"}  # train is not compared


def test_seeds_of_one_setting_are_averaged_and_kept_side_by_side():
    def run(wasted: float, kept: int, steps: int, change: float, per_100k: float) -> dict:
        return {"at_equal_tokens": {"wasted_share": wasted, "groups_kept": kept, "steps": steps},
                "change": {"valid": {"change": change, "per_100k_tokens": [per_100k, 0.0, 1.0]}}}

    settings = report.by_setting({"dynamic-s0": run(0.4, 48, 12, 0.2, 0.3), "dynamic-s1": run(0.2, 36, 12, 0.1, 0.1),
                                  "breadth-s0": run(0.3, 70, 20, 0.15, 0.2), "kl": run(0.5, 10, 10, 0.0, 0.0)})
    assert list(settings) == ["dynamic", "breadth", "kl"]
    dynamic = settings["dynamic"]
    assert dynamic["runs"] == ["dynamic-s0", "dynamic-s1"] and dynamic["change"]["valid"]["change"] == [0.2, 0.1]
    assert abs(dynamic["mean"]["valid"]["change"] - 0.15) < 1e-12 and abs(dynamic["mean"]["valid"]["per_100k_tokens"] - 0.2) < 1e-12
    assert abs(dynamic["mean"]["wasted_share"] - 0.3) < 1e-12 and dynamic["mean"]["kept_per_update"] == 3.5
    assert settings["kl"]["runs"] == ["kl"]


def test_a_run_of_an_earlier_report_reads_back_with_its_totals_and_changes(tmp_path, monkeypatch):
    """The second seed joins the first when only the first one's report survives: the earlier
    report's steps are cut at the new equal tokens, its whole-run totals and changes kept."""
    run = tmp_path / "runs" / "dynamic-s1"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"seed": 1, "sampling": {"group_size": 8},
                                                     "train": {"steps": 1, "puzzles_per_step": 5, "order": "learnable"}}))
    (run / "history.jsonl").write_text(json.dumps(step(1, 2500, 6, 5)) + "\n")
    earlier_steps = [step(1, 2000, 5, 2), step(2, 4000, 5, 5)]
    for h in earlier_steps:  # written before per-step times and extra tokens were kept
        del h["step_s"], h["sampled_tokens"]
    earlier = tmp_path / "no-wasted-groups.json"
    whole = {**report.totals([{**h, "step_s": 90.0, "extra_tokens": 10} for h in earlier_steps])}
    earlier.write_text(json.dumps({"runs": {"dynamic-s0": {
        "settings": {"seed": 0, "order": "learnable"}, "whole_run": whole, "per_step": earlier_steps,
        "change": {"valid": {"change": 0.2, "ci95": [0.1, 0.3], "puzzles": 4, "per_100k_tokens": [5.0, 2.5, 7.5]}}}}}))
    out = tmp_path / "groups"
    monkeypatch.setattr("sys.argv", ["groups_report.py", str(run), "--committed", f"{earlier}:dynamic-s0", "--out", str(out)])
    report.main()
    data = json.loads(out.with_suffix(".json").read_text())
    theirs = data["runs"]["dynamic-s0"]
    assert data["equal_tokens"] == 2500
    assert theirs["whole_run"] == whole and theirs["settings"]["seed"] == 0
    assert theirs["at_equal_tokens"]["steps"] == 1 and theirs["at_equal_tokens"]["groups_kept"] == 2
    assert theirs["at_equal_tokens"]["hours"] is None  # unknown, not invented
    assert theirs["change"]["valid"]["per_hour"][0] == 0.2 / whole["hours"]
    assert data["by_setting"]["dynamic"]["runs"] == ["dynamic-s1", "dynamic-s0"]
    assert data["runs"]["dynamic-s1"]["per_step"][0]["step_s"] == 60.0  # kept now, for the next read-back
