"""Comparison experiments as one command: the experiment file's checks, the pieces it breaks into
(kept, resumed, filtered), the paired report on a hand-checked case, and one real experiment end
to end on SmolLM2 that a rerun then skips."""

import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from mlx_swe_rl.cli.app import main as cli
from mlx_swe_rl.cli.experiment import load, run_pieces
from mlx_swe_rl.env.rewards import ANSWER_KINDS
from mlx_swe_rl.experiments.estimate import measure, memory_line
from mlx_swe_rl.experiments.pieces import DataPiece, EvalPiece, RunPiece, missing_inputs, plan_pieces
from mlx_swe_rl.experiments.report import collect, markdown, overall
from mlx_swe_rl.rl.config import ConfigError, to_dict
from mlx_swe_rl.rl.evaluation import totals
from mlx_swe_rl.rl.rundir import trained_on
from mlx_swe_rl.rl.stats import compare_reports
from mlx_swe_rl.runfiles import run_in_use

REPO = Path(__file__).resolve().parent.parent


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def small(tmp_path: Path, **changes) -> dict:
    """A two-variant, two-seed, two-set experiment (nothing run)."""
    data = {"name": "small", "output_dir": str(tmp_path / "out"),
            "overrides": {"train.steps": 2, "train.final_eval": False, "puzzles.tiers": ["easy"]},
            "seeds": [0, 1],
            "variants": {"onpolicy": {}, "frozen": {"overrides": {"sampling.mode": "frozen"}, "seeds": [0],
                                                    "sets": ["train"]}},
            "sets": {"train": {"tiers": ["easy"], "split": "train", "samples": 2},
                     "heldout": {"tiers": ["easy"], "split": "heldout"}},
            "pairs": [{"variant": "onpolicy", "minus": "frozen"}]}
    if "variants" in changes:  # other variants: the pair of these would not name them
        del data["pairs"]
    data.update(changes)
    return data


# ----------------------------------------------------------------------------------- the file
@pytest.mark.parametrize("change, needle", [
    ({"variant": {}}, "variant: unknown key (did you mean 'variants'?)"),
    ({"variants": {}}, "variants: expected a mapping of named variants"),
    ({"seeds": [0, 0]}, "seeds: seed 0 is listed twice"),
    ({"seeds": "zero"}, "seeds: expected a list of integer seeds"),
    ({"base": "nowhere.yaml"}, "base: no such config file 'nowhere.yaml'"),
    ({"overrides": {"grpo.betta": 0}}, "overrides: grpo.betta: unknown key (did you mean 'grpo.beta'?)"),
    ({"variants": {"a": {"overrides": {"sampling.mode": "frozn"}}}},
     "variants.a.overrides: sampling.mode: 'frozn' is not one of on_policy, frozen; did you mean 'frozen'?"),
    ({"variants": {"a": {"overrides": {"seed": 3}}}}, "variants.a.overrides: seed: set by the experiment (seeds)"),
    ({"overrides": {"run_name": "x"}}, "overrides: run_name: set by the experiment (VARIANT-sSEED)"),
    ({"variants": {"a": {"seed": [1]}}}, "variants.a.seed: unknown key (did you mean 'variants.a.seeds'?)"),
    ({"variants": {"a": {"sets": ["valid"]}}}, "variants.a.sets: 'valid' is not a set of this file"),
    ({"sets": {"x": {"prompt_template": "wrte"}}}, "sets.x.prompt_template: 'wrte' is not one of null, block, seed"),
    ({"variants": {"a": {"soup": 3}}}, "variants.a.soup: only with adapter"),
    ({"variants": {"a": {"adapter": "r", "soup": 1}}}, "variants.a.soup: expected a number of kept adapters (2 or more)"),
    ({"sets": {"train": {"samples": 0}}}, "sets.train.samples: 0 is below the minimum 1"),
    ({"sets": {"train": {"sample": 8}}}, "sets.train.sample: unknown key (did you mean 'sets.train.samples'?)"),
    ({"sets": {"train": {"split": "valid"}}}, "sets.train.split: 'valid' is not one of all, train, heldout"),
    ({"data": [{"sampel": "-n 2 --out x.json"}]}, "data[0].sampel: unknown data command (did you mean 'sample'?)"),
    ({"data": [{"sample": "-n 2 --outt x.json"}]}, "data[0].sample: No such option '--outt'. Did you mean '--out'?"),
    ({"data": [{"sample": "-n 2"}]}, "data[0].sample: Missing option '--out'"),
    ({"data": [{"sample": "-n 2 --out x.json", "forge": "--out d"}]}, "data[0]: expected one command"),
    ({"pairs": [{"variant": "onpolicy", "minus": "frozn"}]}, "pairs[0].minus: 'frozn' is not a variant"),
    ({"pairs": [{"variant": "onpolicy", "minus": "onpolicy"}]}, "pairs[0]: a variant minus itself"),
    ({"data": [{"script": "nowhere.py", "outputs": ["x"]}]}, "data[0].script: expected a Python script"),
    ({"data": [{"script": str(REPO / "scripts/transfer_data.py")}]}, "data[0].outputs: expected the list of paths"),
    ({"data": [{"script": str(REPO / "scripts/transfer_data.py"), "output": ["x"]}]},
     "data[0].output: unknown key (did you mean 'data[0].outputs'?)"),
    ({"data": [{"scrip": "x.py"}]}, "data[0].scrip: unknown data command (did you mean 'script'?)"),
    ({"variants": {"a": {"adapter": "d", "seeds": [0]}}}, "variants.a.seeds: an evaluation-only variant"),
    ({"variants": {"base": {"adapter": "none"}}}, "variants.base: 'base' names the base model's evaluations"),
    ({"variants": {"a": {"adapter": "none", "overrides": {"sampling.stop_after_answr": False}}}},
     "variants.a.overrides: sampling.stop_after_answr: unknown key"),
])
def test_bad_files_are_one_line_errors_naming_the_file_and_key(tmp_path, change, needle):
    path = write(tmp_path / "exp.yaml", small(tmp_path, **change))
    with pytest.raises(ConfigError) as info:
        load(path, cli)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and needle in message and "\n" not in message
    result = CliRunner().invoke(cli, ["experiment", str(path), "--dry-run"])
    assert result.exit_code == 1 and result.output.strip().splitlines() == [f"Error: {message}"]


def test_a_file_reads_into_its_runs_configs(tmp_path):
    experiment = load(write(tmp_path / "exp.yaml", small(
        tmp_path, data=[{"sample": "-n 2 --tier easy --out x.json"}, {"forge": ["puzzles/easy", "--out", "f"]}])), cli)
    assert experiment.name == "small" and list(experiment.variants) == ["onpolicy", "frozen"]
    assert experiment.variants["onpolicy"].seeds == (0, 1) and experiment.variants["frozen"].seeds == (0,)
    cfg = experiment.run_config("frozen", 0)
    assert (cfg.sampling.mode, cfg.seed, cfg.train.steps, cfg.run_dir) == ("frozen", 0, 2, tmp_path / "out/frozen-s0")
    assert [s.outputs for s in experiment.data] == [(Path("x.json"),), (Path("f"),)]
    assert experiment.data[1].line() == "mlx-swe-rl puzzles forge puzzles/easy --out f"
    assert experiment.sets["heldout"].samples == 1 and experiment.sets["train"].split == "train"


@pytest.mark.parametrize("args, message", [
    (["--seeds", "0,a"], "--seeds: expected comma-separated integers, got '0,a'"),
    (["--only", "frozn"], "--only: 'frozn' is not a variant of {path} (onpolicy, frozen)"),
    (["--only", "frozen", "--seeds", "1"], "--seeds: none of 1 is a seed of the chosen variants"),
])
def test_bad_options_are_one_line_errors(tmp_path, args, message):
    path = write(tmp_path / "exp.yaml", small(tmp_path))
    result = CliRunner().invoke(cli, ["experiment", str(path), "--dry-run", *args])
    assert result.exit_code != 0 and result.output.strip().splitlines() == [f"Error: {message.format(path=path)}"]


# ----------------------------------------------------------------------------------- the pieces
def names(pieces) -> list[str]:
    return [p.name for p in pieces]


def test_pieces_in_order_shared_base_evaluations_and_filters(tmp_path):
    data = small(tmp_path, data=[{"sample": "-n 2 --out x.json"}])
    data["sets"]["valid"] = {"tiers": ["easy"], "samples": 2}  # asked as train is: its own base evaluation all the same
    data["variants"]["qwen"] = {"overrides": {"model.spec": "qwen2.5-coder-0.5b"}, "seeds": [0], "sets": ["train"]}
    experiment = load(write(tmp_path / "exp.yaml", data), cli)
    pieces = plan_pieces(experiment)
    assert names(pieces) == [
        "mlx-swe-rl puzzles sample -n 2 --out x.json",
        "onpolicy-s0", "onpolicy-s1", "frozen-s0", "qwen-s0",
        "eval base on train", "eval base on heldout", "eval base on valid",
        "eval base-qwen on train",  # the other model: its own base
        "eval onpolicy-s0 on train", "eval onpolicy-s0 on heldout", "eval onpolicy-s0 on valid",
        "eval onpolicy-s1 on train", "eval onpolicy-s1 on heldout", "eval onpolicy-s1 on valid",
        "eval frozen-s0 on train", "eval qwen-s0 on train"]
    out = tmp_path / "out"
    evals = {p.name: p for p in pieces if isinstance(p, EvalPiece)}
    assert evals["eval frozen-s0 on train"].baseline == out / "eval-base-train.json"  # frozen sampling: same asking
    assert evals["eval qwen-s0 on train"].baseline == out / "eval-base-qwen-train.json"
    assert evals["eval onpolicy-s1 on train"].adapter == out / "onpolicy-s1"
    assert evals["eval onpolicy-s1 on train"].plan().temperature == 0.8  # K = 2: the config's temperature
    assert evals["eval onpolicy-s1 on heldout"].plan().temperature == 0.0  # K = 1: greedy
    only = plan_pieces(experiment, ("frozen",), ())
    assert names(only) == ["mlx-swe-rl puzzles sample -n 2 --out x.json", "frozen-s0", "eval base on train",
                           "eval frozen-s0 on train"]
    assert names(plan_pieces(experiment, ("onpolicy",), (1,)))[1:] == [
        "onpolicy-s1", "eval base on train", "eval base on heldout", "eval base on valid",
        "eval onpolicy-s1 on train", "eval onpolicy-s1 on heldout", "eval onpolicy-s1 on valid"]
    with pytest.raises(ConfigError, match="--only: 'frozn' is not a variant"):
        plan_pieces(experiment, ("frozn",), ())
    with pytest.raises(ConfigError, match="--seeds: none of 7"):
        plan_pieces(experiment, (), (7,))


def test_an_input_no_earlier_piece_makes_is_named_before_anything_runs(tmp_path):
    chosen = tmp_path / "out/calib-s0/train-set.json"  # the calibrating variant's choice, read by the other
    variants = {"calib": {"overrides": {"puzzles.select": "mixed"}},
                "reuse": {"overrides": {"puzzles.train_set": str(chosen)}}}
    data = small(tmp_path, variants=variants, seeds=[0], data=[{"sample": f"-n 2 --out {tmp_path / 'x.json'}"}],
                 sets={"made": {"puzzles": str(tmp_path / "x.json")}, "typo": {"puzzles": str(tmp_path / "y.json")}})
    experiment = load(write(tmp_path / "exp.yaml", data), cli)
    every = plan_pieces(experiment)
    nowhere = "not there yet, and no piece of this experiment makes it"
    assert missing_inputs(every, every) == [f"eval {m} on typo reads {tmp_path / 'y.json'}, {nowhere}"
                                            for m in ("base", "calib-s0", "reuse-s0")]
    del data["sets"]["typo"]
    path = write(tmp_path / "exp.yaml", data)
    experiment = load(path, cli)
    every = plan_pieces(experiment)
    assert missing_inputs(every, every) == []  # the data step and the calibrating run come first
    only = plan_pieces(experiment, ("reuse",))
    needs = (f"reuse-s0 reads {chosen}, not there yet, which calib-s0 writes when it calibrates, before its "
             "first step: run its variant too (--only calib)")
    assert missing_inputs(only, every) == [needs]
    result = CliRunner().invoke(cli, ["experiment", str(path), "--only", "reuse"])
    assert result.exit_code == 1 and result.output.strip().splitlines() == [f"Error: {needs}"]
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "out").exists()  # refused before any piece ran
    dry = CliRunner().invoke(cli, ["experiment", str(path), "--only", "reuse", "--dry-run"])
    assert dry.exit_code == 0 and dry.output.strip().splitlines()[-1] == f"cannot start: {needs}"
    chosen.parent.mkdir(parents=True)
    chosen.write_text(json.dumps({"puzzle_dir": None, "puzzles": ["average_score"], "source": {}}))
    assert missing_inputs(only, every) == []
    chosen.unlink()
    data["variants"] = dict(reversed(variants.items()))  # the reader first: its maker runs too late
    experiment = load(write(tmp_path / "exp.yaml", data), cli)
    every = plan_pieces(experiment)
    assert missing_inputs(every, every) == [f"reuse-s0 reads {chosen}, not there yet, and calib-s0, which makes "
                                            "it, comes later: put its variant first in the file"]


def test_a_set_may_ask_with_its_own_wording(tmp_path):
    """A writing-task set (`puzzles stubs`) asks with the write template, the others with the
    config's; the base model's evaluation of it is asked the same way as every run's."""
    data = small(tmp_path, data=[{"stubs": "--tiers medium --split heldout --out stubs"}])
    data["sets"]["write"] = {"puzzles": "stubs", "prompt_template": "write"}
    experiment = load(write(tmp_path / "exp.yaml", data), cli)
    pieces = plan_pieces(experiment)
    assert names(pieces)[0] == "mlx-swe-rl puzzles stubs --tiers medium --split heldout --out stubs"
    evals = {p.name: p for p in pieces if isinstance(p, EvalPiece)}
    assert evals["eval onpolicy-s0 on write"].baseline == tmp_path / "out" / "eval-base-write.json"
    assert {p.asked.prompt.template for n, p in evals.items() if n.endswith("on write")} == {"write"}
    assert {p.asked.prompt.template for n, p in evals.items() if not n.endswith("on write")} == {"seed"}
    assert evals["eval base on write"].config.prompt.template == "seed"  # the config itself is untouched


def test_evaluation_only_variants_and_script_steps(tmp_path):
    """An adapter made elsewhere and the base model asked otherwise are evaluated, not trained,
    paired with the shared base evaluation; a script step runs with this Python and is kept once
    its declared outputs exist, and one that fails stops the command."""
    script = tmp_path / "make.py"
    script.write_text("import sys, pathlib\npathlib.Path(sys.argv[1]).write_text(sys.argv[2])\n")
    made = tmp_path / "made.txt"
    data = small(tmp_path, data=[{"script": f"{script} {made} 'two words'", "outputs": [str(made)]}])
    data["variants"]["narrow"] = {"adapter": str(tmp_path / "elsewhere"), "sets": ["heldout"]}
    data["variants"]["full"] = {"adapter": "none", "overrides": {"sampling.stop_after_answer": False}}
    experiment = load(write(tmp_path / "exp.yaml", data), cli)
    assert experiment.variants["full"].adapter is None and not experiment.variants["full"].trains
    assert experiment.data[0].line() == f"python {script} {made} 'two words'"
    pieces = plan_pieces(experiment)
    out = tmp_path / "out"
    assert "narrow-s0" not in names(pieces) and names(pieces)[-3:] == [
        "eval narrow on heldout", "eval full on train", "eval full on heldout"]
    evals = {p.name: p for p in pieces if isinstance(p, EvalPiece)}
    narrow, full = evals["eval narrow on heldout"], evals["eval full on train"]
    assert (narrow.adapter, narrow.out, narrow.baseline) == (
        tmp_path / "elsewhere", out / "eval-narrow-heldout.json", out / "eval-base-heldout.json")
    assert narrow.state() == f"to evaluate (K = 1); needs {tmp_path / 'elsewhere'}, not there yet"
    assert full.adapter is None and full.baseline == out / "eval-base-train.json"  # asked otherwise, paired alike
    assert not full.plan().stop_after_answer and evals["eval base on train"].plan().stop_after_answer
    assert "eval narrow on heldout" in names(plan_pieces(experiment, (), (1,)))  # --seeds keeps them
    assert names(plan_pieces(experiment, ("full",), ()))[1:] == [
        "eval base on train", "eval base on heldout", "eval full on train", "eval full on heldout"]

    lines = []
    run_pieces(pieces[:1], cli, progress=False, log=lines.append)
    assert made.read_text() == "two words" and pieces[0].done() and lines[1].startswith("[1/1] python ")
    made.unlink()
    script.write_text("raise SystemExit(3)\n")
    with pytest.raises(click.ClickException, match="failed"):
        run_pieces(pieces[:1], cli, progress=False, log=lines.append)
    with pytest.raises(click.ClickException, match="eval narrow on heldout: no adapters at"):
        run_pieces([narrow], cli, progress=False, log=lines.append)

    out.mkdir()
    for model, rates in {"base": [0, .25, .5, .75], "full": [.25, .25, .5, .75]}.items():
        (out / f"eval-{model}-train.json").write_text(json.dumps(report(rates)))
    result = collect(experiment, pieces)
    assert result["evaluated"]["full"]["change"]["train"]["change"] == 0.0625
    assert result["evaluated"]["full"]["puzzles"]["train"]["newly_solved"] == ["p0"]
    assert "narrow" not in result["evaluated"] and "full" not in result["runs"]
    assert "| full | train (4) | 4 | 37.5 | 43.8 | +6.2" in markdown(result)
    assert result["evaluated"]["full"]["by_split"] == {}  # every puzzle of the set is a training one

    # a set of both splits, evaluated at once: its change per split too
    for model, rates in {"base": [0, .25, .5, .75], "full": [.25, .25, .5, 1.0]}.items():
        evaluated = report(rates)
        for row in evaluated["puzzles"][2:]:
            row["split"] = "heldout"
        (out / f"eval-{model}-train.json").write_text(json.dumps(evaluated))
    result = collect(experiment, pieces)
    parts = result["evaluated"]["full"]["by_split"]["train"]
    assert list(parts) == ["heldout", "train"]
    assert (parts["train"]["puzzles"], parts["train"]["before"], parts["train"]["after"]) == (2, 0.125, 0.25)
    assert (parts["heldout"]["change"], parts["heldout"]["improved"], parts["heldout"]["worsened"]) == (0.125, 1, 0)
    assert "| full | train | heldout | 2 | 62.5 | 75.0 | +12.5 [" in markdown(result)


def test_a_soup_variant_evaluates_the_mean_of_a_runs_last_kept_adapters(tmp_path):
    import mlx.core as mx
    import numpy as np

    from mlx_swe_rl.cli.experiment import make_soup

    run = tmp_path / "run"
    data = small(tmp_path)
    data["variants"]["soup"] = {"adapter": str(run), "soup": 2, "sets": ["heldout"]}
    experiment = load(write(tmp_path / "exp.yaml", data), cli)
    (piece,) = [p for p in plan_pieces(experiment) if isinstance(p, EvalPiece) and p.model == "soup"]
    assert piece.adapter == tmp_path / "out" / "soup-adapter" and piece.soup == (run, 2)
    assert piece.state() == f"to evaluate (K = 1); needs the last 2 adapters {run} keeps (made into {piece.adapter})"
    with pytest.raises(click.ClickException, match="kept 0 adapter"):
        make_soup(piece, print)
    for step in (10, 20, 30):  # as train.keep_every writes them
        kept = run / "kept" / f"step-{step:05d}"
        kept.mkdir(parents=True)
        mx.save_safetensors(str(kept / "adapters.safetensors"), {"w": mx.full((2, 2), float(step))})
        (kept / "adapter_config.json").write_text('{"fine_tune_type": "lora"}')
        (kept / "state.json").write_text(json.dumps({"step": step}))
    lines = []
    make_soup(piece, lines.append)
    assert np.array_equal(np.array(mx.load(str(piece.adapter / "adapters.safetensors"))["w"]), np.full((2, 2), 25.0))
    assert lines == [f"eval soup on heldout: the soup of step-00020, step-00030 of {run} -> {piece.adapter}"]


@pytest.mark.parametrize("name, renamed", [("learn-stop", {}), ("transfer", {}),
                                           ("qwen05", {"grpo-s0": "s0", "grpo-s1": "s1"})])
def test_committed_experiments_are_their_results_settings(name, renamed, monkeypatch):
    """Each committed experiment file has its committed result's runs (their names and steps),
    sets, K, temperature and token limit, asked with the pinned prompt."""
    monkeypatch.chdir(REPO)
    experiment = load(REPO / f"configs/experiments/{name}.yaml", cli)
    committed = json.loads((REPO / f"docs/results/{name}.json").read_text())
    pieces = plan_pieces(experiment)
    steps = {renamed.get(p.name, p.name): p.config.train.steps for p in pieces if isinstance(p, RunPiece)}
    steps.update({v.name: 0 for v in experiment.variants.values() if not v.trains})
    assert steps == {run: entry["steps"] for run, entry in committed["runs"].items()}
    asked = {p.set_name: {"samples": p.eval_set.samples, "temperature": p.plan().temperature,
                          "max_tokens": p.plan().max_tokens} for p in pieces if isinstance(p, EvalPiece)}
    assert asked == {s: {k: row[k] for k in ("samples", "temperature", "max_tokens")}
                     for s, row in committed["sets"].items()}
    assert {(p.config.prompt.template, p.config.prompt.system) for p in pieces if isinstance(p, EvalPiece)} \
        == {("block", "expert")}


def test_the_quick_starts_comparison_is_an_experiment_and_compare_runs_it(monkeypatch):
    """quickstart-vs-frozen.yaml (once configs/compare.yaml) trains configs/quickstart.yaml twice,
    differing only in the sampler, and evaluates as the quick start does (avg@4 on the 18 easy
    puzzles) instead of the runs' own evaluations; `compare` is `experiment` under its old name."""
    from mlx_swe_rl.rl.config import load_config

    monkeypatch.chdir(REPO)
    path = REPO / "configs/experiments/quickstart-vs-frozen.yaml"
    pieces = plan_pieces(load(path, cli))
    runs = {p.name: to_dict(p.config) for p in pieces if isinstance(p, RunPiece)}
    quickstart = to_dict(load_config(REPO / "configs/quickstart.yaml"))
    assert set(runs) == {"onpolicy-s0", "frozen-s0"}
    for name, cfg in runs.items():
        differs = {(s, k) for s in quickstart if isinstance(quickstart[s], dict)
                   for k in quickstart[s] if cfg[s][k] != quickstart[s][k]}
        assert differs == {("train", "final_eval")} | ({("sampling", "mode")} if name == "frozen-s0" else set())
        assert cfg["seed"] == quickstart["seed"]
    assert runs["frozen-s0"]["sampling"]["mode"] == "frozen"
    evals = [p for p in pieces if isinstance(p, EvalPiece)]
    assert {p.model for p in evals} == {"base", "onpolicy-s0", "frozen-s0"}
    assert {(p.eval_set.samples, tuple(p.eval_set.tiers), p.plan().temperature, p.plan().max_tokens)
            for p in evals} == {(quickstart["train"]["eval_samples"], ("easy",), 0.8, 192)}
    def listed(command: str) -> list[str]:  # the pieces (the memory lines under them move with free memory)
        result = CliRunner().invoke(cli, [command, str(path), "--dry-run"])
        assert result.exit_code == 0, result.output
        return [line for line in result.output.splitlines() if line.startswith("[")]

    assert listed("compare") == listed("experiment")
    assert listed("compare")[0] == "[1/5] onpolicy-s0: to train (16 steps)"


def test_answer_end_evaluates_the_base_model_with_and_without_the_stop(monkeypatch):
    monkeypatch.chdir(REPO)
    experiment = load(REPO / "configs/experiments/answer-end.yaml", cli)
    committed = json.loads((REPO / "docs/results/answer-end.json").read_text())
    pieces = plan_pieces(experiment)
    assert not any(isinstance(p, RunPiece) for p in pieces)  # nothing trained
    evals = {(p.model, p.set_name): p for p in pieces if isinstance(p, EvalPiece)}
    assert {s for _, s in evals} == set(committed) and {m for m, _ in evals} == {"base", "full"}
    for (model, set_name), piece in evals.items():
        plan = piece.plan()
        assert plan.stop_after_answer == (model == "base") and piece.adapter is None
        assert f"-k{plan.group_size}" in set_name and plan.max_tokens == (384 if "easy-medium" in set_name else 192)


def test_mine_is_the_measured_run(monkeypatch):
    monkeypatch.chdir(REPO)
    experiment = load(REPO / "configs/experiments/mine.yaml", cli)
    committed = json.loads((REPO / "docs/results/mine.json").read_text())
    pieces = plan_pieces(experiment)
    (run,) = [p for p in pieces if isinstance(p, RunPiece)]
    assert run.config.train.steps == committed["training"]["steps"] == 6
    assert run.config.reward_without_tests == {"similarity": 1.0}
    assert experiment.data[0].argv[:2] == ["puzzles", "mine"] and "--no-repo-tests" in experiment.data[0].args
    args = experiment.data[0].args  # the repository and commit measured, cloned by the step itself
    assert args[0] == "https://github.com/more-itertools/more-itertools"
    assert args[args.index("--commit") + 1] == committed["repository"]["head"]
    for piece in (p for p in pieces if isinstance(p, EvalPiece)):
        plan = piece.plan()
        assert (plan.group_size, plan.max_tokens, plan.temperature, piece.eval_set.split) == (2, 384, 0.8, "heldout")


def test_no_wasted_groups_runs_are_the_committed_settings(monkeypatch):
    monkeypatch.chdir(REPO)
    experiment = load(REPO / "configs/experiments/no-wasted-groups.yaml", cli)
    committed = json.loads((REPO / "docs/results/no-wasted-groups.json").read_text())["runs"]
    runs = [p for p in plan_pieces(experiment) if isinstance(p, RunPiece)]
    assert {r.name for r in runs} == {"learnable-s0", "dynamic-s0", "dynamic-s1"}
    for run in runs:
        cfg, want = run.config, committed[run.name]["settings"]
        assert (cfg.seed, cfg.train.steps, cfg.train.puzzles_per_step, cfg.sampling.group_size, cfg.train.order,
                cfg.train.dynamic_sampling.enabled) == (want["seed"], want["steps"], want["puzzles_per_step"],
                                                        want["group_size"], want["order"],
                                                        want["dynamic_sampling"]["enabled"])


def finish(run: RunPiece, step: int) -> None:
    """Leave what the trainer leaves after `step` (its config, a checkpoint)."""
    (run.run_dir / "checkpoint").mkdir(parents=True, exist_ok=True)
    (run.run_dir / "config.yaml").write_text("{}\n")
    (run.run_dir / "checkpoint" / "state.json").write_text(json.dumps({"step": step}))


def test_kept_pieces_are_skipped_and_started_runs_resume(tmp_path):
    experiment = load(write(tmp_path / "exp.yaml", small(
        tmp_path, data=[{"sample": f"-n 2 --out {tmp_path / 'x.json'}"}])), cli)
    pieces = plan_pieces(experiment)
    runs = {p.name: p for p in pieces if isinstance(p, RunPiece)}
    data = next(p for p in pieces if isinstance(p, DataPiece))
    assert not data.done()
    (tmp_path / "x.json").write_text("{}")
    assert data.done() and data.state() == "kept"
    finish(runs["onpolicy-s0"], 2)  # finished
    finish(runs["onpolicy-s1"], 1)  # killed after its first checkpoint
    (runs["frozen-s0"].run_dir).mkdir(parents=True)
    (runs["frozen-s0"].run_dir / "config.yaml").write_text("{}\n")  # killed before any checkpoint
    assert [runs[n].state() for n in runs] == ["kept", "resumes after step 1 of 2", "resumes after step 0 of 2"]
    from mlx_swe_rl.rl.journal import Journal

    journal = Journal.open(runs["frozen-s0"].run_dir / "calibration.journal.jsonl", {"puzzles": ["a", "b", "c"]})
    journal.add({"id": "b", "completions": []})  # killed while calibrating
    assert runs["frozen-s0"].state() == "resumes its calibration (1 of 3 puzzles done)"
    with run_in_use(runs["frozen-s0"].run_dir):
        assert runs["frozen-s0"].state() == f"calibrating now (pid {os.getpid()} on {platform.node()}), 1 of 3 puzzles done"
    with run_in_use(runs["onpolicy-s1"].run_dir):  # its trainer is still going (a background run)
        assert runs["onpolicy-s1"].state() == \
            f"training now (pid {os.getpid()} on {platform.node()}), step 1 of 2 saved"
    evaluation = next(p for p in pieces if isinstance(p, EvalPiece))
    evaluation.out.parent.mkdir(parents=True, exist_ok=True)
    evaluation.out.write_text("{}")
    assert evaluation.done()

    calls = []

    def trainer(cfg, resume, progress, log):
        calls.append((cfg.run_name, resume))
        finish(next(r for r in runs.values() if r.name == cfg.run_name), cfg.train.steps)

    lines = []
    run_pieces([data, *runs.values(), evaluation], cli, progress=False, log=lines.append, train_fn=trainer)
    assert calls == [("onpolicy-s1", True), ("frozen-s0", True)]
    assert lines[0] == "3 of 5 pieces kept from earlier; 2 to do"
    assert lines[1] == "[1/2] onpolicy-s1 (resumes after step 1 of 2; 1 left after it)"
    for name in ("onpolicy-s1", "frozen-s0"):  # each sitting's time is kept
        assert json.loads((runs[name].run_dir / "wall_time.json").read_text())["seconds"] >= 0
    calls.clear()
    run_pieces([data, *runs.values(), evaluation], cli, progress=False, log=lines.append, train_fn=trainer)
    assert calls == []


def tiny_run_file(tmp_path: Path, model_dir: Path, steps: int, workers: int) -> Path:
    """An experiment of one run of the tiny model (variant a, seed 0: out/a-s0), a checkpoint every
    step, evaluated on the easy held-out puzzles."""
    return write(tmp_path / "tiny.yaml", {
        "name": "tiny", "output_dir": str(tmp_path / "out"),
        "overrides": {"model.spec": str(model_dir), "puzzles.tiers": ["easy"], "sampling.max_tokens": 6,
                      "sampling.group_size": 2, "train.steps": steps, "train.puzzles_per_step": 1,
                      "train.save_every": 1, "train.final_eval": False, "workers": workers},
        "variants": {"a": {}}, "sets": {"easy": {"tiers": ["easy"], "split": "heldout"}}})


def test_a_run_killed_mid_way_resumes_and_nothing_is_done_twice(tmp_path, tiny_model_dir):
    """The real trainer on the tiny model: killed after its first step (the checkpoint of step 1
    kept), the command run again resumes it, and a third time does nothing."""
    from mlx_swe_rl.rl.trainer import train

    path = tiny_run_file(tmp_path, tiny_model_dir, steps=2, workers=2)
    pieces = plan_pieces(load(path, cli))
    run_dir, out = tmp_path / "out" / "a-s0", tmp_path / "out"
    calls = []

    def killed(cfg, **kwargs):
        calls.append(kwargs["resume"])
        train(cfg, stop_after=1, **kwargs)
        raise KeyboardInterrupt  # Ctrl-C after step 1

    with pytest.raises(KeyboardInterrupt):
        run_pieces(pieces, cli, progress=False, log=lambda _: None, train_fn=killed)

    def steps() -> list[int]:
        return [json.loads(line)["step"] for line in (run_dir / "history.jsonl").read_text().splitlines()]

    assert steps() == [1] and not list(out.glob("eval-*.json"))
    assert json.loads((run_dir / "wall_time.json").read_text())["seconds"] > 0

    def whole(cfg, **kwargs):
        calls.append(kwargs["resume"])
        return train(cfg, **kwargs)

    run_pieces(pieces, cli, progress=False, log=lambda _: None, train_fn=whole)
    assert calls == [False, True] and steps() == [1, 2]  # resumed after step 1: no step twice
    assert sorted(p.name for p in out.glob("eval-*.json")) == ["eval-a-s0-easy.json", "eval-base-easy.json"]
    run_pieces(pieces, cli, progress=False, log=lambda _: None, train_fn=whole)
    assert calls == [False, True]


def test_an_evaluation_killed_mid_way_resumes_from_the_puzzles_it_finished(tmp_path, tiny_model_dir,
                                                                           journal_killed_after):
    """The base model's evaluation killed after its first finished puzzle: a dry run says so, and
    the command run again samples only the others, into one report of every puzzle."""
    from mlx_swe_rl.rl.journal import journal_path

    path = tiny_run_file(tmp_path, tiny_model_dir, steps=1, workers=2)
    piece = next(p for p in plan_pieces(load(path, cli)) if isinstance(p, EvalPiece) and p.model == "base")
    with journal_killed_after(1), pytest.raises(KeyboardInterrupt):
        run_pieces([piece], cli, progress=False, log=lambda _: None)
    total = len(piece.puzzles())
    assert not piece.done() and piece.state() == f"resumes its evaluation (K = 1, 1 of {total} puzzles done)"
    lines = []
    run_pieces([piece], cli, progress=False, log=lines.append)
    assert f"{piece.name}: resuming, 1 of {total} puzzles finished before" in lines
    report = json.loads(piece.out.read_text())
    assert report["timing"]["sessions"] == 2 and [r["id"] for r in report["puzzles"]] == [p.id for p in piece.puzzles()]
    assert not journal_path(piece.out).exists()  # the report is written: the journal has served


def test_a_terminated_sitting_still_counts_its_wall_time(tmp_path, tiny_model_dir):
    """SIGTERM (a `kill`, a session's end) stops the command through its `finally` blocks: the
    sitting's time reaches wall_time.json, the exit status is 143, and nothing is printed as a crash."""
    path = tiny_run_file(tmp_path, tiny_model_dir, steps=500, workers=1)
    history = tmp_path / "out" / "a-s0" / "history.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "mlx_swe_rl", "experiment", str(path), "--quiet"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (history.is_file() and history.read_text()) and proc.poll() is None:
            assert time.monotonic() < deadline, "no training step within 2 minutes"
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143
    assert "Traceback" not in err, err
    assert json.loads((history.parent / "wall_time.json").read_text())["seconds"] > 0


# ----------------------------------------------------------------------------------- the report
def report(rates: list[float], samples: int = 4) -> dict:
    """An evaluation report of puzzles p0, p1, ... with these avg@K rates."""
    rows = [{"id": f"p{i}", "tier": "easy", "split": "train", "family": None, "samples": samples,
             "solved": round(r * samples), "pass@1": r, f"pass@{samples}": float(r > 0), "mean_reward": r,
             "completions": []} for i, r in enumerate(rates)]
    return {"settings": {"samples": samples, "temperature": 0.8, "max_tokens": 8, "seed": 0,
                         "stop_after_answer": True},
            "timing": {"seconds": 90.0, "generated_tokens": 30 * samples * len(rows), "truncated": 1,
                       "stopped": 2},
            "totals": totals(rows, samples), "puzzles": rows}


def test_evaluation_only_variants_pair_with_each_other_and_with_every_seed(tmp_path):
    """An adapter made elsewhere (kl30: a run's step 30) compared per puzzle with another adapter
    (one row, no seed), and a trained variant's every seed compared with it."""
    data = small(tmp_path, sets={"train": {"samples": 1}},
                 variants={"a": {}, "x": {"adapter": "dx"}, "y": {"adapter": "dy"}},
                 pairs=[{"variant": "x", "minus": "y"}, {"variant": "a", "minus": "y"}])
    experiment = load(write(tmp_path / "exp.yaml", data), cli)
    out = tmp_path / "out"
    out.mkdir()
    for model, rates in {"base": [0, 0, 1, 1], "x": [1, 1, 1, 0], "y": [0, 1, 0, 0],
                         "a-s0": [1, 1, 1, 1], "a-s1": [0, 1, 0, 0]}.items():
        (out / f"eval-{model}-train.json").write_text(json.dumps(report(rates)))
    result = collect(experiment, plan_pieces(experiment))
    xy = result["pairs"]["x minus y"]["train"]
    assert list(xy["seeds"]) == ["adapter"] and xy["runs"] == 1
    assert (xy["before"], xy["after"], xy["mean_change"]) == (0.25, 0.75, 0.5)
    assert (xy["seeds"]["adapter"]["improved"], xy["seeds"]["adapter"]["worsened"]) == (2, 0)
    ay = result["pairs"]["a minus y"]["train"]
    assert list(ay["seeds"]) == [0, 1] and ay["mean_change"] == (0.75 + 0.0) / 2
    text = markdown(result)
    assert "| x minus y | train | 1 | 25.0 | 75.0 | +50.0 | adapter +50.0 [" in text
    assert "| a minus y | train | 2 | 25.0 | 62.5 | +37.5 | s0 +75.0 [" in text
    from mlx_swe_rl.experiments.figure import _changes
    from mlx_swe_rl.reports.figures import plt

    fig, ax = plt.subplots()
    _changes(ax, result, ["a"], [0, 1])
    bars = [c.get_label() for c in ax.containers if not c.get_label().startswith("_")]  # not the error bars
    assert bars == ["a-s0", "a-s1", "x", "y"]  # the adapters' bars beside the runs'
    plt.close(fig)


def test_the_report_pairs_by_puzzle_and_averages_seeds(tmp_path):
    data = small(tmp_path, sets={"train": {"samples": 4}})
    experiment = load(write(tmp_path / "exp.yaml", data), cli)
    pieces = plan_pieces(experiment)
    out = tmp_path / "out"
    out.mkdir()
    evals = {"base": [0, .25, .5, .75],
             "onpolicy-s0": [.25, .5, .75, 1.0],  # every puzzle +0.25: the CI is a point
             "onpolicy-s1": [.75, .25, .5, 0.0],  # +0.75, 0, 0, -0.75: mean 0, one up, one down
             "frozen-s0": [0, .25, .5, .75]}  # no change
    for model, rates in evals.items():
        (out / f"eval-{model}-train.json").write_text(json.dumps(report(rates)))
    run_dir = out / "onpolicy-s0"
    run_dir.mkdir()
    steps = [{"step": 1, "reward_mean": 0.1, "completion_len": 50.0, "kl": None, "step_s": 30.0,
              "peak_memory_gb": 1.5, "sampled_tokens": 800, "tokens_total": 800},
             {"step": 2, "reward_mean": 0.3, "completion_len": 40.0, "kl": None, "step_s": 20.0,
              "peak_memory_gb": 1.7, "sampled_tokens": 640, "tokens_total": 1440}]
    (run_dir / "history.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    (run_dir / "wall_time.json").write_text(json.dumps({"seconds": 75.0}))
    rollouts = [(1, "p1", True), (1, "p1", False), (1, "p2", False), (1, "p2", False),
                (2, "p1", False), (2, "p1", False), (2, "p3", True), (2, "p3", True)]
    (run_dir / "rollouts.jsonl").write_text("".join(json.dumps({"step": step, "puzzle_id": p, "solved": solved}) + "\n"
                                                    for step, p, solved in rollouts))
    (run_dir / "calibration.json").write_text(json.dumps({"categories": {"mixed": 2, "all-solved": 1, "all-failed": 1},
                                                          "puzzles": []}))
    (run_dir / "train-set.json").write_text(json.dumps({"puzzles": ["p1", "p2"]}))

    result = collect(experiment, pieces)
    s0, s1 = (result["runs"][f"onpolicy-s{i}"]["change"]["train"] for i in (0, 1))
    assert (s0["before"], s0["after"], s0["change"], s0["ci95"]) == (0.375, 0.625, 0.25, [0.25, 0.25])
    assert (s0["improved"], s0["worsened"]) == (4, 0)
    assert (s1["change"], s1["improved"], s1["worsened"]) == (0.0, 1, 1)
    assert -0.75 <= s1["ci95"][0] < 0 < s1["ci95"][1] <= 0.75
    assert result["runs"]["frozen-s0"]["change"]["train"]["change"] == 0.0
    assert result["variants"]["onpolicy"]["train"]["mean_change"] == 0.125  # (0.25 + 0) / 2
    assert result["variants"]["onpolicy"]["train"]["runs"] == 2
    pair = result["pairs"]["onpolicy minus frozen"]["train"]
    assert list(pair["seeds"]) == [0] and pair["seeds"][0]["ci95"] == [0.25, 0.25]  # frozen has seed 0 only
    assert result["runs"]["onpolicy-s0"]["puzzles"]["train"]["newly_solved"] == ["p0"]
    assert result["runs"]["onpolicy-s1"]["puzzles"]["train"]["lost"] == ["p3"]
    assert result["runs"]["onpolicy-s1"]["puzzles"]["train"]["rates"]["p3"] == [0.75, 0.0]
    run = result["runs"]["onpolicy-s0"]
    assert (run["steps"], run["sampled_tokens"], run["train_seconds"], run["wall_seconds"], run["peak_memory_gb"]) \
        == (2, 1440, 50.0, 75.0, 1.7)
    assert run["curves"]["reward_mean"] == [0.1, 0.3] and run["curves"]["completion_len"] == [50.0, 40.0]
    assert run["curves"]["step_s"] == [30.0, 20.0] and run["curves"]["sample_s"] == [None, None]
    assert run["curves"]["tokens_total"] == [800, 1440]  # the x-axis of the figure's reward-per-token panel
    from mlx_swe_rl.experiments.figure import _per_token
    from mlx_swe_rl.reports.figures import plt

    fig, ax = plt.subplots()
    result["runs"]["onpolicy-s1"]["curves"]["tokens_total"] = [None, None]  # a history from before the key
    _per_token(ax, result, ["onpolicy", "frozen"], [0, 1])
    assert [(line.get_label(), list(line.get_xdata())) for line in ax.lines] == [("onpolicy-s0", [800, 1440])]
    plt.close(fig)
    assert run["calibration"] == {"categories": {"mixed": 2, "all-solved": 1, "all-failed": 1},
                                  "bands": {}, "train_set": ["p1", "p2"]}
    assert result["runs"]["onpolicy-s1"]["calibration"] is None
    assert run["visits"] == {"p1": [[1, 1, 2], [2, 0, 2]], "p2": [[1, 0, 2]], "p3": [[2, 2, 2]]}
    assert result["runs"]["onpolicy-s1"]["visits"] == {}
    assert result["runs"]["onpolicy-s0"]["puzzles"]["train"]["splits"] == {f"p{i}": "train" for i in range(4)}
    assert result["levels"]["base"]["train"] == overall(report(evals["base"]))
    assert result["costs"]["base"]["train"] == {"answers": 16, "generated_tokens": 480, "truncated": 1, "stopped": 2,
                                              "seconds": 90.0}
    text = markdown(result)
    assert "| onpolicy-s1 | train | 4 | 37.5 [" in text and "] | 16 | 480 | 30 | 1 | 2 | 1.5 |" in text
    assert "| onpolicy-s0 | train (4) | 4 | 37.5 | 62.5 | +25.0 [+25.0, +25.0] | 4 / 0 |" in text
    assert "| onpolicy | train | 2 | 37.5 | 50.0 | +12.5 |" in text
    assert "| onpolicy-s1 | train | 1: p0 | 1: p3 |" in text
    assert "| puzzle | split | base | onpolicy-s0 | onpolicy-s1 | frozen-s0 |" in text  # the seed's table
    assert "| p0 | train | 0.0 | 25.0 new | 75.0 new | 0.0 |" in text
    assert "| p3 | train | 75.0 | 100.0 | 0.0 lost | 75.0 |" in text
    assert "| onpolicy-s0 | 2 of 2 | 1,440 | 0.8 min | 1.2 min | 1.70 GB | 0.100 -> 0.300 |" in text
    assert "- onpolicy-s0: mixed 2, all-solved 1, all-failed 1; trained on 2: p1, p2" in text
    assert "| onpolicy-s0 | p1 | 1/2 | 0/2 | 1: 1, 2: 0 |" in text
    assert "| onpolicy-s0 | p2 |" not in text  # one visit: nothing to compare

    rates = measure(pieces)  # the dry run's time estimate: rates of the pieces done
    assert (rates.step_s, rates.steps_seen, rates.completion_s, rates.evals_seen) == (25.0, 2, 90.0 / 16, 4)
    runs = {p.name: p for p in pieces if isinstance(p, RunPiece)}
    assert rates.seconds(runs["onpolicy-s1"]) == 50.0  # 2 steps to go


def write_puzzles(root: Path, puzzles: list[tuple[str, str, dict]]) -> Path:
    """Easy puzzles (id, function name, other fields) in `root`, each adding one to its argument."""
    (root / "easy").mkdir(parents=True)
    for pid, name, more in puzzles:
        write(root / "easy" / f"{pid}.yaml", {
            "id": pid, "tier": "easy", "split": "train", "entry_point": name, "description": "Add one.",
            "buggy": f"def {name}(x):\n    return x - 1\n", "oracle": f"def {name}(x):\n    return x + 1\n",
            "tests": [f"assert {name}(1) == 2"], **more})
    return root


def test_the_change_is_split_by_the_functions_the_model_trained_on(tmp_path):
    """A run and an exported adapter, each evaluated on five puzzles: the puzzles of a function
    it trained on (p0 and p1 are two bugs in one function) against the rest."""
    puzzles = write_puzzles(tmp_path / "puzzles", [(f"p{i}", name, {}) for i, name in enumerate("ffghk")])
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "export.json").write_text(json.dumps({"trained_on": {"steps": 9, "puzzles": ["p3"],
                                                                    "functions": ["h"]}}))
    data = small(tmp_path, overrides={"train.steps": 2, "puzzles.dir": str(puzzles)}, seeds=[0],
                 variants={"onpolicy": {}, "made": {"adapter": str(adapter)},
                           "soupy": {"adapter": str(tmp_path / "out/onpolicy-s0"), "soup": 2}},
                 sets={"train": {"puzzles": str(puzzles), "samples": 4}})
    experiment = load(write(tmp_path / "exp.yaml", data), cli)
    pieces = plan_pieces(experiment)
    run = next(p for p in pieces if isinstance(p, RunPiece))
    run.run_dir.mkdir(parents=True)
    (run.run_dir / "history.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2)))
    given_back, fixed = "def f(x):\n    return x - 1\n", "def g(x):\n    return x + 1\n"
    (run.run_dir / "rollouts.jsonl").write_text("".join(  # step 3's line: written by a step that never finished
        json.dumps({"step": step, "puzzle_id": p, "solved": solved, "code": code}) + "\n"
        for step, p, code, solved in ((1, "p1", given_back, False), (1, "p1", None, False), (2, "p2", fixed, True),
                                      (3, "p3", None, False))))
    (run.run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(run.config)))
    for name in ("adapter_config.json", "adapters.safetensors"):  # what makes it a run to export.run_config
        (run.run_dir / name).write_text("{}")
    assert trained_on(run.run_dir, run.config) == {"steps": 2, "puzzles": ["p1", "p2"], "functions": ["f", "g"]}
    assert trained_on(run.run_dir, run.config, steps=1) == {"steps": 1, "puzzles": ["p1"], "functions": ["f"]}
    for model, rates in {"base": [0, .25, .5, .75, 0], "onpolicy-s0": [.5, .5, .5, .75, .25],
                         "made": [0, .25, .5, 1.0, 0], "soupy": [.25, .25, .5, .75, 0]}.items():
        (tmp_path / "out" / f"eval-{model}-train.json").write_text(json.dumps(report(rates)))

    result = collect(experiment, pieces)
    assert result["runs"]["onpolicy-s0"]["curves"]["unchanged"] == [0.5, 0.0]  # step 1: the buggy code, no answer
    split = result["runs"]["onpolicy-s0"]["by_training"]["train"]
    trained, rest = split["trained"], split["not_trained"]  # p0, p1, p2 (functions f, g) against p3, p4
    assert (trained["puzzles"], trained["before"], trained["after"], trained["improved"]) == (3, 0.25, 0.5, 2)
    assert (rest["puzzles"], rest["before"], rest["after"], rest["improved"]) == (2, 0.375, 0.5, 1)
    made = result["evaluated"]["made"]["by_training"]["train"]  # what its export.json says it trained on: h
    assert (made["trained"]["puzzles"], made["trained"]["change"]) == (1, 0.25)
    assert (made["not_trained"]["puzzles"], made["not_trained"]["change"]) == (4, 0.0)
    soup = result["evaluated"]["soupy"]["by_training"]["train"]  # its run's: f and g, as the run's own
    assert (soup["trained"]["puzzles"], soup["not_trained"]["puzzles"], soup["not_trained"]["change"]) == (3, 2, 0.0)
    assert "| onpolicy-s0 | train | not trained | 2 | 37.5 | 50.0 | +12.5 [" in markdown(result)
    (adapter / "export.json").write_text(json.dumps({"trained_on": None}))  # exported before it was recorded
    assert collect(experiment, pieces)["evaluated"]["made"]["by_training"] == {}


def test_the_calibration_is_counted_per_family_and_per_source(tmp_path):
    """Where the learnable band lies in a pool forged from several sources (issue 53)."""
    fields = {"a1": ("arith_op", "toolz"), "a2": ("arith_op", "six"), "c1": ("compare_op", "toolz"),
              "c2": ("compare_op", "toolz")}
    puzzles = write_puzzles(tmp_path / "puzzles", [
        (pid, f"f_{pid}", {"family": family, "mutation": "x", "source": {"harvest": source}})
        for pid, (family, source) in fields.items()])
    data = small(tmp_path, overrides={"train.steps": 2, "puzzles.dir": str(puzzles), "puzzles.select": "mixed"},
                 seeds=[0], variants={"kl": {}}, sets={"train": {"puzzles": str(puzzles)}})
    experiment = load(write(tmp_path / "exp.yaml", data), cli)
    pieces = plan_pieces(experiment)
    run = next(p for p in pieces if isinstance(p, RunPiece))
    run.run_dir.mkdir(parents=True)
    categories = {"a1": "mixed", "a2": "all-solved", "c1": "mixed", "c2": "all-failed"}
    (run.run_dir / "calibration.json").write_text(json.dumps({
        "categories": {"mixed": 2, "all-solved": 1, "all-failed": 1},
        "puzzles": [{"id": pid, "category": c} for pid, c in categories.items()]}))
    result = collect(experiment, pieces)
    assert result["runs"]["kl-s0"]["calibration"]["bands"] == {
        "family": {"arith_op": {"mixed": 1, "all-solved": 1}, "compare_op": {"mixed": 1, "all-failed": 1}},
        "source": {"six": {"all-solved": 1}, "toolz": {"mixed": 2, "all-failed": 1}}}
    text = markdown(result)
    assert "| toolz | 3 | 2 | 0 | 1 | 66.7% |" in text and "| six | 1 | 0 | 1 | 0 | 0.0% |" in text
    a2 = puzzles / "easy" / "a2.yaml"  # one source left: by source says nothing that the categories do not
    a2.write_text(a2.read_text().replace("harvest: six", "harvest: toolz"))
    assert list(collect(experiment, pieces)["runs"]["kl-s0"]["calibration"]["bands"]) == ["family"]


def test_the_report_holds_the_pools_funnel_per_source(tmp_path):
    """A harvest data step (issue 53's pool): its harvest.json funnel and its forge.json counts."""
    seeds, forged = tmp_path / "seeds", tmp_path / "forged"
    data = small(tmp_path, data=[{"harvest": f"toolz six --out {seeds} --forge {forged}"}])
    experiment = load(write(tmp_path / "exp.yaml", data), cli)
    step = experiment.data[0]
    assert step.outputs == (seeds, forged)  # done only when both are there
    funnel = {"toolz": {"files": 16, "functions": 87, "kept": 19, "mutants_kept": 118},
              "six": {"files": 1, "functions": 12, "kept": 0, "mutants_kept": 0}}
    seeds.mkdir()
    (seeds / "harvest.json").write_text(json.dumps({
        "sources": {name: {"spec": name, "version": "1.0", "root": "/x", "licence": "MIT", "permissive": True,
                           "funnel": counts} for name, counts in funnel.items()},
        "total": {k: funnel["toolz"][k] + funnel["six"][k] for k in funnel["toolz"]}, "seconds": 9.0}))
    assert collect(experiment, plan_pieces(experiment))["data"][step.line()] == {  # the forge not written yet
        "harvest": {"sources": {name: {"licence": "MIT", "version": "1.0", "funnel": counts}
                                for name, counts in funnel.items()},
                    "total": {"files": 17, "functions": 99, "kept": 19, "mutants_kept": 118}, "seconds": 9.0}}
    forged.mkdir()
    (forged / "forge.json").write_text(json.dumps({
        "settings": {}, "seeds": 19, "puzzles": 118, "splits": {"train": 90, "heldout": 28},
        "seed_functions": {"train": 15, "heldout": 4}, "families": {"arith_op": {"kept": 118, "invalid": 2}}}))
    result = collect(experiment, plan_pieces(experiment))
    assert result["data"][step.line()]["forge"]["splits"] == {"train": 90, "heldout": 28}
    text = markdown(result)
    assert "| source | licence | version | files | functions | kept | mutants_kept |" in text
    assert "| toolz | MIT | 1.0 | 16 | 87 | 19 | 118 |" in text and "| **all** | | | **17** | **99** |" in text
    assert "118 puzzles from 19 seed functions: train 90 (15 functions), heldout 28 (4 functions)" in text


# ----------------------------------------------------------------------------------- end to end
def test_an_experiment_end_to_end_on_smollm2_then_a_rerun_skips_it(tmp_path, monkeypatch):
    """Two variants x two seeds x two sets, on SmolLM2-135M at tiny settings: two data steps, four
    runs, ten evaluations and the report; the report's numbers are the evaluations' own; a
    rerun does nothing but the report."""
    from mlx_swe_rl.models.specs import ModelError, resolve_model

    try:
        resolve_model("smollm2-135m")
    except ModelError as exc:
        pytest.skip(f"SmolLM2 is not fetched and cannot be: {exc}")
    monkeypatch.chdir(REPO)  # the bundled puzzles, as the committed experiment files run
    path = write(tmp_path / "tiny.yaml", {
        "name": "tiny", "output_dir": str(tmp_path / "out"), "base": "configs/learn.yaml",
        "overrides": {"puzzles.train_set": str(tmp_path / "train2.json"), "sampling.group_size": 2,
                      "sampling.max_tokens": 8, "sampling.batch_size": 4, "train.steps": 1,
                      "train.puzzles_per_step": 1, "train.micro_batch_size": 2, "workers": 2},
        "seeds": [0, 1],
        "variants": {"onpolicy": {}, "frozen": {"overrides": {"sampling.mode": "frozen"}}},
        "sets": {"train": {"puzzles": str(tmp_path / "train2.json"), "samples": 2},
                 "heldout": {"puzzles": str(tmp_path / "held1.json"), "max_tokens": 6}},
        "pairs": [{"variant": "onpolicy", "minus": "frozen"}],
        "data": [{"sample": f"--tier easy --split train -n 2 --seed 0 --out {tmp_path / 'train2.json'}"},
                 {"sample": ["--tier", "easy", "--split", "heldout", "-n", "1", "--out", str(tmp_path / "held1.json")]}]})
    dry = CliRunner().invoke(cli, ["experiment", str(path), "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "[1/16] mlx-swe-rl puzzles sample" in dry.output
    assert "memory: estimated once its puzzles are made" in dry.output
    assert "16 of 16 pieces to do; no time estimate (no training step measured yet" in dry.output

    result = CliRunner().invoke(cli, ["experiment", str(path), "--quiet"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    written = json.loads((out / "report.json").read_text())
    assert set(written["runs"]) == {"onpolicy-s0", "onpolicy-s1", "frozen-s0", "frozen-s1"}
    for run, entry in written["runs"].items():
        assert entry["steps"] == 1 and entry["sampled_tokens"] > 0 and entry["peak_memory_gb"] > 0
        for set_name in ("train", "heldout"):
            before = json.loads((out / f"eval-base-{set_name}.json").read_text())
            after = json.loads((out / f"eval-{run}-{set_name}.json").read_text())
            assert after["meta"]["adapter"] == str(out / run) and after["settings"]["max_tokens"] == \
                (8 if set_name == "train" else 6)
            assert entry["change"][set_name] == compare_reports(before, after)["all"]
    assert written["variants"]["frozen"]["train"]["mean_change"] == pytest.approx(
        (written["runs"]["frozen-s0"]["change"]["train"]["change"]
         + written["runs"]["frozen-s1"]["change"]["train"]["change"]) / 2)
    assert set(written["pairs"]["onpolicy minus frozen"]["heldout"]["seeds"]) == {"0", "1"}
    for model, by_set in written["answers"].items():  # what the answers did: every completion once
        for set_name, shares in by_set.items():
            assert sum(shares[k] for k in ANSWER_KINDS) == pytest.approx(1.0)
            assert shares["solved"] == pytest.approx(written["levels"][model][set_name][0])
            edit = shares["edit"]  # edit sizes: over the completions with code, each once
            answers = json.loads((out / f"eval-{model}-{set_name}.json").read_text())["puzzles"]
            assert edit is None or edit["answers"] == sum(bool(c["code"]) for r in answers for c in r["completions"])
    assert set(written["answers"]) == {"base", *written["runs"]}
    assert (out / "report.md").is_file() and (out / "report.png").is_file()
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("eval-*.json")}

    again = CliRunner().invoke(cli, ["experiment", str(path), "--quiet"])
    assert again.exit_code == 0, again.output
    assert "16 of 16 pieces kept from earlier; 0 to do" in again.output
    assert {p: p.stat().st_mtime_ns for p in out.glob("eval-*.json")} == stamps
    only = CliRunner().invoke(cli, ["experiment", str(path), "--report"])  # the report alone, nothing run
    assert only.exit_code == 0 and "# Experiment tiny" in only.output and "pieces kept" not in only.output
    run = next(p for p in plan_pieces(load(path, cli)) if isinstance(p, RunPiece))
    assert memory_line(run).startswith("memory: peak ")  # the preflight, once the data is there
    dry = CliRunner().invoke(cli, ["experiment", str(path), "--dry-run"])
    assert "0 of 16 pieces to do; nothing left to run" in dry.output
    assert "s per training step (4 steps)" in dry.output


@pytest.mark.parametrize("name, model, runs", [
    ("qwen15", "qwen2.5-coder-1.5b", {"kl-s0", "nokl-s0", "frozen-s0", "lr5e-6-s0"}),
    ("qwen05-arms", "qwen2.5-coder-0.5b", {"kl-s0", "kl-s1", "nokl-s0", "frozen-s0", "top8-s0"})])
def test_the_missions_experiment_trains_the_shipped_config_in_three_arms(monkeypatch, name, model, runs):
    """qwen05-arms.yaml's kl arm is configs/grpo.yaml as `mlx-swe-rl train` runs it, on the 0.5B
    with a second on-policy seed; the other arms differ only by the KL term and the sampler, and
    top8 (issue 45's paired run) only by the number of adapted blocks.
    qwen15.yaml's kl arm is the 1.5B's first run, at the first shipped lr (2e-5); its lr5e-6 arm is
    configs/grpo.yaml as shipped now, and it, nokl and frozen take the kl arm's calibrated puzzles
    as a file and differ from each other only by the KL term and the sampler; the evaluations are
    greedy and avg@4 on the 54 bundled puzzles and greedy on the held-out functions, asked with the
    shipped prompt, and the same functions written from their signature (the write template: the
    capability gate)."""
    from mlx_swe_rl.rl.config import load_config, to_dict

    monkeypatch.chdir(REPO)
    experiment = load(REPO / f"configs/experiments/{name}.yaml", cli)
    pieces = plan_pieces(experiment)
    configs = {p.name: to_dict(p.config) for p in pieces if isinstance(p, RunPiece)}
    assert set(configs) == runs
    shipped = to_dict(load_config(REPO / "configs/grpo.yaml"))
    shipped["model"]["spec"] = model
    for run, cfg in configs.items():
        assert cfg["train"]["steps"] == 60 and cfg["train"]["save_every"] == 1
        differs = {(s, k) for s in shipped if isinstance(shipped[s], dict)
                   for k in shipped[s] if cfg[s][k] != shipped[s][k] and (s, k) != ("train", "save_every")}
        arm, seed = run.rsplit("-s", 1)
        assert cfg["seed"] == int(seed) and (seed == "0" or arm == "kl")
        given = {("puzzles", "select"), ("puzzles", "train_set"), ("train", "final_eval")}  # puzzles as a file
        expected = {"kl": set(), "nokl": {("grpo", "beta")}, "frozen": {("grpo", "beta"), ("sampling", "mode")},
                    "top8": {("finetune", "lora")}}
        if name == "qwen15":  # kl ran at the first shipped lr; the others take its calibrated puzzles as a file
            expected = {"kl": {("optim", "lr")}, "lr5e-6": given, "nokl": expected["nokl"] | given,
                        "frozen": expected["frozen"] | given}
            assert shipped["optim"]["lr"] == 5.0e-6
            assert cfg["optim"]["lr"] == (2.0e-5 if arm == "kl" else 5.0e-6)
            if arm != "kl":
                assert cfg["puzzles"]["train_set"] == "outputs/qwen15/kl-s0/train-set.json"
        assert differs == expected[arm]
        assert arm in ("kl", "lr5e-6", "top8") or cfg["grpo"]["beta"] == 0.0
        assert cfg["finetune"]["lora"] == dict(shipped["finetune"]["lora"], **({"num_layers": 8} if arm == "top8" else {}))
    asked = {p.set_name: (p.eval_set.samples, p.plan().temperature, p.plan().max_tokens, p.eval_set.puzzles)
             for p in pieces if isinstance(p, EvalPiece)}
    assert asked == {"bundled": (1, 0.0, 384, None), "bundled4": (4, 0.8, 384, None),
                     "heldout": (1, 0.0, 384, "outputs/transfer/heldout.json"),
                     "write": (1, 0.0, 384, "outputs/stubs-heldout")}
    assert {(p.set_name == "write", p.asked.prompt.template, p.asked.prompt.system)
            for p in pieces if isinstance(p, EvalPiece)} \
        == {(False, shipped["prompt"]["template"], shipped["prompt"]["system"]),
            (True, "write", shipped["prompt"]["system"])}


def test_transfer15_is_the_run_issue_53_asks_for(monkeypatch):
    """At least 150 steps of 4 puzzles x G 8 with LoRA, KL and dynamic sampling on the calibrated
    harvest pool, every 10th adapter kept and the soup of the last three as the final adapter,
    evaluated greedy on 300 held-out puzzles, avg@4 on 100, on the bundled puzzles and on writing
    the held-out functions."""
    monkeypatch.chdir(REPO)
    experiment = load(REPO / "configs/experiments/transfer15.yaml", cli)
    pieces = plan_pieces(experiment)
    (run,) = [p for p in pieces if isinstance(p, RunPiece)]
    cfg = run.config
    assert cfg.model.spec == "qwen2.5-coder-1.5b" and cfg.finetune.mode == "lora" and cfg.grpo.beta > 0
    assert (cfg.train.steps, cfg.train.puzzles_per_step, cfg.sampling.group_size) == (150, 4, 8)
    assert cfg.train.dynamic_sampling.enabled and cfg.train.order == "epoch" and cfg.puzzles.select == "mixed"
    assert (cfg.train.keep_every, cfg.train.save_every) == (10, 1)
    assert experiment.variants["soup"].soup == 3 and experiment.variants["soup"].adapter == run.run_dir
    sets = {name: experiment.sets[name] for name in experiment.variants["soup"].sets}
    draws = {step.outputs[0].name: step.args for step in experiment.data if step.command == "sample"}
    assert sets["heldout"].samples == 1 and draws["heldout300.json"][2] == "300"
    # the training pool is drawn from short functions only (a CPU step costs its longest answer);
    # the held-out draws keep every length
    assert "--max-lines" in draws["pool550.json"] and not any("--max-lines" in args for name, args in draws.items()
                                                                if name.startswith("heldout"))
    assert sets["heldout4"].samples == 4 and draws["heldout100.json"][2] == "100"
    assert all("--split" in args and args[args.index("--split") + 1] == "heldout"
               for name, args in draws.items() if name.startswith("heldout"))
    assert sets["write"].prompt_template == "write" and sets["bundled"].puzzles is None


def test_multi_turn_is_the_committed_comparison(monkeypatch):
    """multi-turn.yaml: the multi-turn run's 8 steps and the single-turn run, which trains
    configs/learn.yaml as learn-stop's onpolicy-s0 does (the driver continued that run for it);
    2-answer avg@4 evaluations, the generic-feedback ablation for the base model and the
    multi-turn run, and the best of 2 for the base model only, made once."""
    from mlx_swe_rl.rl.config import load_config, to_dict

    monkeypatch.chdir(REPO)
    experiment = load(REPO / "configs/experiments/multi-turn.yaml", cli)
    committed = json.loads((REPO / "docs/results/multi-turn.json").read_text())
    pieces = plan_pieces(experiment)
    runs = {p.name: p.config for p in pieces if isinstance(p, RunPiece)}
    assert {"multi-turn-s0": 8, "single-turn-s0": 16} == {n: c.train.steps for n, c in runs.items()} == \
        {f"{n}-s0": t["steps"] for n, t in committed["training"].items()}
    single, learn = to_dict(runs["single-turn-s0"]), to_dict(load_config(REPO / "configs/learn.yaml"))
    assert {s for s in learn if single[s] != learn[s]} == {"run_name", "output_dir", "multi_turn"}
    assert single["multi_turn"]["max_turns"] == learn["multi_turn"]["max_turns"] == 1  # the rest plays no part
    evals = {(p.model, p.set_name): p for p in pieces if isinstance(p, EvalPiece)}
    assert set(evals) == {("base", "train"), ("base", "train-best"), ("multi-turn-s0", "train"),
                          ("single-turn-s0", "train"), ("generic", "train"), ("multi-turn-generic", "train")}
    for (model, set_name), piece in evals.items():
        plan = piece.plan()
        assert (plan.group_size, plan.max_turns, plan.max_tokens, plan.temperature) == (4, 2, 192, 0.8)
        assert piece.eval_set.best_of_n == (set_name == "train-best")
        assert piece.config.multi_turn.feedback == ("generic" if "generic" in model else "detailed")
        assert (piece.config.prompt.template, piece.config.prompt.system) == ("block", "expert")
        assert piece.out.name == f"eval-{model}-{set_name}.json"  # what multi_turn_report.py reads
    assert evals[("generic", "train")].baseline == evals[("base", "train")].out


def test_a_curve_with_steps_that_recorded_nothing_still_shows_the_others():
    from mlx_swe_rl.experiments.figure import recorded

    # the mission's KL: steps 2 and 4 had no group to learn from, so no update and no KL
    assert recorded([0.0, None, 0.006, None, 0.011]) == ([1, 3, 5], [0.0, 0.006, 0.011])
    assert recorded([None, None]) == ([], [])  # beta 0: nothing to draw



@pytest.mark.parametrize("path", sorted((REPO / "configs/experiments").glob("*.yaml")), ids=lambda p: p.stem)
def test_committed_experiments_ask_built_in_models(path, monkeypatch):
    """Every run and evaluation of a committed experiment file names a built-in model (offline, no
    hub): configs/grpo.yaml names the hub's repo id, which a machine without the hub cannot load
    (prompts-qwen15.yaml did, and stopped at its first evaluation)."""
    from mlx_swe_rl.models.specs import BUILTIN_MODELS

    monkeypatch.chdir(REPO)
    pieces = plan_pieces(load(path, cli))
    specs = {p.config.model.spec for p in pieces if isinstance(p, (RunPiece, EvalPiece))}
    assert specs and specs <= set(BUILTIN_MODELS), specs
