"""The puzzle forge: seed bank, validation of mutants through the scorer, the split by
function, deterministic output in the puzzle format, and forged sets running through
`puzzles check`, `eval` and a training step."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlx_swe_rl.cli.app import main
from mlx_swe_rl.forge.checks import check_puzzles
from mlx_swe_rl.forge.forge import (ForgeSettings, _precheck, candidates, forge, heldout_ids, puzzle_yaml, verdict,
                                    write_forged)
from mlx_swe_rl.forge.mutators import FAMILIES
from mlx_swe_rl.forge.seeds import BUNDLED_SEEDS, Seed, load_seeds
from mlx_swe_rl.puzzles.format import PuzzleError, default_puzzle_dir, load_puzzle, load_puzzles
from mlx_swe_rl.puzzles.trainset import load_train_set
from mlx_swe_rl.sandbox.scorer import TestRun as Run
from mlx_swe_rl.sandbox.verdict import TestResult as Result

SEEDS = {
    "clamp_to_range": """
        id: clamp_to_range
        entry_point: clamp_to_range
        description: Clamp x into [low, high].
        code: |
          def clamp_to_range(x, low, high):
              if x < low:
                  return low
              if x > high:
                  return high
              return x
        tests:
          - assert clamp_to_range(5, 0, 10) == 5
          - assert clamp_to_range(-1, 0, 10) == 0
          - assert clamp_to_range(11, 0, 10) == 10
          - assert clamp_to_range(0, 0, 10) == 0
          - assert clamp_to_range(10, 0, 10) == 10
        """,
    "count_positive": """
        id: count_positive
        entry_point: count_positive
        description: Count the numbers greater than zero.
        code: |
          def count_positive(numbers):
              total = 0
              for n in numbers:
                  if n > 0:
                      total += 1
              return total
        tests:
          - assert count_positive([]) == 0
          - assert count_positive([1, -2, 3]) == 2
          - assert count_positive([0, 0]) == 0
          - assert count_positive([5]) == 1
        """,
    "sum_first_two": """
        id: sum_first_two
        entry_point: sum_first_two
        description: Add the first two numbers of a list (its tests are weak on purpose).
        code: |
          def sum_first_two(xs):
              return xs[0] + xs[1]
        tests:
          - assert sum_first_two([0, 0, 0]) == 0
        """,
    "last_item": """
        id: last_item
        entry_point: last_item
        description: The last element of a non-empty list.
        code: |
          def last_item(xs):
              return xs[-1]
        tests:
          - assert last_item([1, 2, 3]) == 3
          - assert last_item([7]) == 7
        """,
}


@pytest.fixture(scope="module")
def seed_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("seeds") / "small"
    root.mkdir()
    for name, text in SEEDS.items():
        (root / f"{name}.yaml").write_text(textwrap.dedent(text))
    return root


@pytest.fixture(scope="module")
def forged(seed_dir, scorer, tmp_path_factory):
    settings = ForgeSettings(per_seed=3, heldout_frac=0.5, seed=7)
    result = forge(load_seeds([seed_dir]), scorer, settings)
    out = tmp_path_factory.mktemp("forged") / "set"
    write_forged(result, out)
    return result, out


# ------------------------------------------------------------------------------ seeds
def test_bundled_seed_bank():
    """At least 150 written seeds with 4+ tests each, plus the bundled puzzles as seeds."""
    bank = load_seeds([BUNDLED_SEEDS])
    assert len(bank) >= 150
    assert min(len(s.tests) for s in bank) >= 4
    everything = load_seeds([BUNDLED_SEEDS, default_puzzle_dir()])
    assert len(everything) == len(bank) + len(load_puzzles())
    assert {s.id for s in everything if s.heldout} == {p.id for p in load_puzzles(split="heldout")}


def test_every_bundled_seed_passes_its_tests(scorer):
    seeds = load_seeds([BUNDLED_SEEDS])
    checked = scorer.prepare([_as_puzzle(s) for s in seeds])
    failing = {pid: problems for pid, (problems, _) in checked.items() if problems}
    assert failing == {}


def _as_puzzle(seed: Seed):
    from mlx_swe_rl.forge.forge import _seed_puzzle

    return _seed_puzzle(seed, ForgeSettings())


@pytest.mark.parametrize("text, needle", [
    ("id: s\nentry_point: s\ndescription: d\ncode: 'def s(): pass'\ntests: ['assert s() == None']\nbugy: x\n",
     "bugy: unknown field"),
    ("id: s\nentry_point: s\ndescription: d\ntests: ['assert s() == None']\n", "code: missing"),
    ("id: s\nentry_point: s\ndescription: d\ncode: 'def t(): pass'\ntests: ['assert s() == None']\n",
     "code: does not define entry_point 's'"),
    ("id: s\nentry_point: s\ndescription: d\ncode: 'def s(): pass'\ntests: ['assert s() < 1']\n", "tests[0]"),
])
def test_bad_seed_files_name_file_and_key(tmp_path, text, needle):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "s.yaml").write_text(text)
    with pytest.raises(PuzzleError, match=r"s\.yaml: " + needle.replace("[", r"\[").replace("(", r"\(")):
        load_seeds([tmp_path])


# ------------------------------------------------------------------------------ validation rules
def _run(*statuses: str, seconds: float = 0.01) -> Run:
    return Run([Result(i, s) for i, s in enumerate(statuses)], seconds=seconds)


def test_verdicts():
    assert verdict(_run("passed", "failed"), _run("passed", "failed"), 1.0) == "kept"
    assert verdict(_run("passed", "passed"), _run("passed", "passed"), 1.0) == "no_test_fails"
    assert verdict(_run("passed", "failed"), _run("failed", "failed"), 1.0) == "unstable"
    assert verdict(_run("failed", seconds=1.5), _run("failed"), 1.0) == "too_slow"
    # a hanging mutant is a bug like any other: kept, with the forge's short timeout
    assert verdict(_run("timeout", seconds=1.02), _run("timeout", seconds=1.01), 1.0) == "kept"


def test_equivalent_and_duplicate_mutants_are_rejected_before_running():
    seed = load_seeds([default_puzzle_dir()])[0]
    seen = {"placeholder"}
    same = type(candidates(seed, ForgeSettings())[0])("arith_op", "reformatted", "\n\n" + seed.code + "\n", 1)
    assert _precheck(seed, same, seen) == "equivalent"
    first = candidates(seed, ForgeSettings())[0]
    assert _precheck(seed, first, seen) is None
    respaced = type(first)(first.family, first.description, first.code.replace("\n", "\n\n"), first.line)
    assert _precheck(seed, respaced, seen) == "duplicate"
    undefined = type(first)(first.family, first.description, "x = 1\n", first.line)
    assert _precheck(seed, undefined, seen) == "invalid"


def test_weak_tests_let_mutants_through_and_they_are_rejected(forged):
    result, _ = forged
    assert sum(c["no_test_fails"] for c in result.counts.values()) > 0
    kept_from_weak = [p for p in result.puzzles if p.id.startswith("sum_first_two__")]
    for p in kept_from_weak:  # only mutants that break the one test survive
        assert p.buggy != p.oracle


def test_the_split_never_shows_the_only_test_that_catches_a_mutant(scorer):
    """Multi-turn repair's default split must hold for a forged puzzle: a public test that alone
    catches the mutant, or that reads state a hidden assert leaves, joins `hidden_tests`; a
    puzzle whose split already holds comes back as it was (same id, same files)."""
    from mlx_swe_rl.env.feedback import TestSplit
    from mlx_swe_rl.forge.checks import keep_split_sound
    from mlx_swe_rl.puzzles.format import Puzzle

    split = TestSplit()
    base = Puzzle("inc__arith_op_1", "t", "train", "inc", "Add one.", "def inc(x):\n    return x - 1\n",
                  "def inc(x):\n    return x + 1\n", ("assert inc(1) == 2", "assert inc(2) == 3", "assert inc(3) == 4"))
    (public,) = split.public_indices(base)
    alone = ["failed" if i == public else "passed" for i in range(3)]
    both = ["failed" if i in (public, (public + 1) % 3) else "passed" for i in range(3)]
    state = Puzzle("pop__negation_4", "t", "train", "inc", "Add one.", base.buggy, base.oracle,
                   ("items = [1]\nassert inc(items.pop()) == 2", "assert items == []"))
    fixed, unchanged, rebuilt = keep_split_sound([base, base, state], scorer, [alone, both, ["failed", "failed"]])
    assert fixed.hidden_tests == (public,) and public not in split.public_indices(fixed)
    assert unchanged is base
    assert split.public_indices(state) == (1,)  # its public test reads what test 0's assert popped
    assert rebuilt.hidden_tests == (1,) and split.public_indices(rebuilt) == (0,)
    assert load_puzzle_text(puzzle_yaml(fixed)).hidden_tests == (public,)
    assert "hidden_tests" not in puzzle_yaml(base)


def load_puzzle_text(text: str):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t" / "inc__arith_op_1.yaml"
        path.parent.mkdir()
        path.write_text(text)
        return load_puzzle(path)


# ------------------------------------------------------------------------------ output
def test_forged_set_passes_puzzles_check(forged, scorer):
    _, out = forged
    puzzles = load_puzzles(out)
    assert puzzles and all(p.family in FAMILIES and p.mutation and p.timeout == 1.0 for p in puzzles)
    assert all(p.id.startswith(p.entry_point + "__") for p in puzzles)
    reports = check_puzzles(puzzles, scorer)
    assert [(r.puzzle.id, r.problems) for r in reports if r.problems] == []


def test_split_is_by_seed_function(forged):
    result, out = forged
    by_split: dict[str, set[str]] = {"train": set(), "heldout": set()}
    for p in load_puzzles(out):
        by_split[p.split].add(p.id.split("__")[0])
    assert by_split["train"] and by_split["heldout"]
    assert not by_split["train"] & by_split["heldout"]
    summary = json.loads((out / "forge.json").read_text())
    assert summary["puzzles"] == len(result.puzzles) == sum(summary["splits"].values())


def test_heldout_puzzles_stay_heldout():
    seeds = load_seeds([default_puzzle_dir()])
    held = heldout_ids(seeds, 0.0, 0)
    assert held == {s.id for s in seeds if s.heldout}
    assert len(heldout_ids(seeds, 1.0, 0)) == len(seeds)


def test_same_arguments_byte_identical_output(forged, seed_dir, scorer, tmp_path):
    result, out = forged
    again = forge(load_seeds([seed_dir]), scorer, result.settings)
    write_forged(again, tmp_path / "again")
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "again") for p in (tmp_path / "again").rglob("*") if p.is_file())
    assert all((out / f).read_bytes() == (tmp_path / "again" / f).read_bytes() for f in files)


def test_puzzle_file_round_trips(forged, tmp_path):
    result, _ = forged
    p = result.puzzles[0]
    (tmp_path / p.tier).mkdir()
    path = tmp_path / p.tier / f"{p.id}.yaml"
    path.write_text(puzzle_yaml(p))
    back = load_puzzle(path)
    assert (back.buggy, back.oracle, back.tests, back.family, back.mutation) == (p.buggy, p.oracle, p.tests,
                                                                              p.family, p.mutation)


def test_write_refuses_to_replace_what_it_did_not_write(forged, tmp_path):
    result, _ = forged
    (tmp_path / "mine.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not empty"):
        write_forged(result, tmp_path)
    with pytest.raises(FileExistsError, match="not a forged set"):
        write_forged(result, tmp_path, overwrite=True)
    assert (tmp_path / "mine.txt").read_text() == "keep"


def test_families_filter(seed_dir, scorer):
    result = forge(load_seeds([seed_dir]), scorer, ForgeSettings(per_seed=2, families=("compare_flip",)))
    assert result.puzzles and {p.family for p in result.puzzles} == {"compare_flip"}


# ------------------------------------------------------------------------------ command line, eval, training
def test_forge_command(seed_dir, tmp_path):
    out = tmp_path / "cli"
    args = ["puzzles", "forge", str(seed_dir), "--out", str(out), "--per-seed", "2", "--workers", "2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "kept" in result.output and "no_test_fails" in result.output and f"to {out}" in result.output
    listed = CliRunner().invoke(main, ["puzzles", "list", str(out)])
    assert "family" in listed.output.splitlines()[0]
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 1 and "--overwrite" in again.output
    bad = CliRunner().invoke(main, args[:3] + ["--families", "nosuch", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 1 and "unknown family 'nosuch'" in bad.output


def test_forged_set_runs_through_eval_and_a_training_step(forged, tiny_model_dir, tmp_path):
    from mlx_swe_rl.cli.eval import main as eval_main
    from mlx_swe_rl.cli.train import main as train_main

    _, out = forged
    report = tmp_path / "eval.json"
    result = CliRunner().invoke(eval_main, ["--model", str(tiny_model_dir), "--puzzles", str(out), "--max-tokens", "8",
                                            "--workers", "2", "--out", str(report)])
    assert result.exit_code == 0, result.output
    totals = json.loads(report.read_text())["totals"]
    assert {t["family"] for t in totals if "family" in t} == {p.family for p in load_puzzles(out)}
    held = tmp_path / "heldout-sample.json"
    sampled = CliRunner().invoke(main, ["puzzles", "sample", str(out), "-n", "2", "--split", "heldout",
                                        "--out", str(held)])
    assert sampled.exit_code == 0, sampled.output
    sets = [f"model.spec={tiny_model_dir}", f"output_dir={tmp_path}", "run_name=forged", "workers=2",
            f"puzzles.dir={out}", "train.steps=1", "sampling.max_tokens=8", "sampling.group_size=2",
            "train.puzzles_per_step=2", "train.final_eval=true", f"train.eval_set=[{held}]"]
    result = CliRunner().invoke(train_main, [a for s in sets for a in ("--set", s)] + ["--quiet"])
    assert result.exit_code == 0, result.output
    history = (tmp_path / "forged" / "history.jsonl").read_text().splitlines()
    assert len(history) == 1
    evaluated = json.loads((tmp_path / "forged" / "eval-before.json").read_text())["puzzles"]
    assert [r["id"] for r in evaluated] == json.loads(held.read_text())["puzzles"]


def test_sample_command(forged, tmp_path):
    _, out = forged
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    for path in (first, second):
        result = CliRunner().invoke(main, ["puzzles", "sample", str(out), "-n", "3", "--split", "train",
                                           "--seed", "4", "--out", str(path)])
        assert result.exit_code == 0, result.output
    ids = json.loads(first.read_text())["puzzles"]
    assert ids == json.loads(second.read_text())["puzzles"] and len(set(ids)) == 3
    train_ids = {p.id for p in load_puzzles(out, split="train")}
    assert set(ids) <= train_ids
    too_many = CliRunner().invoke(main, ["puzzles", "sample", str(out), "-n", "100000", "--out", str(tmp_path / "c")])
    assert too_many.exit_code == 1 and "-n: 100000 is more than" in too_many.output
    # A subset of a puzzle-set file: its puzzles only, and it still points at the forged directory.
    subset = tmp_path / "subset.json"
    result = CliRunner().invoke(main, ["puzzles", "sample", str(first), "-n", "2", "--out", str(subset)])
    assert result.exit_code == 0, result.output
    assert set(json.loads(subset.read_text())["puzzles"]) < set(ids)
    assert {p.id for p in load_train_set(subset)} == set(json.loads(subset.read_text())["puzzles"])


def test_sample_command_max_lines_keeps_only_short_buggy_code(forged, tmp_path):
    from mlx_swe_rl.puzzles.format import code_lines

    _, out = forged
    sizes = sorted(code_lines(p.buggy) for p in load_puzzles(out))
    limit = sizes[0]  # the shortest buggy code: the longer ones are left out
    fitting = [p.id for p in load_puzzles(out) if code_lines(p.buggy) <= limit]
    assert 0 < len(fitting) < len(sizes)
    path = tmp_path / "short.json"
    result = CliRunner().invoke(main, ["puzzles", "sample", str(out), "-n", str(len(fitting)),
                                       "--max-lines", str(limit), "--out", str(path)])
    assert result.exit_code == 0, result.output
    written = json.loads(path.read_text())
    assert sorted(written["puzzles"]) == sorted(fitting) and written["source"]["max_lines"] == limit
    over = CliRunner().invoke(main, ["puzzles", "sample", str(out), "-n", str(len(fitting) + 1),
                                     "--max-lines", str(limit), "--out", str(tmp_path / "x.json")])
    assert over.exit_code == 1 and f"is more than the {len(fitting)} puzzles" in over.output


def test_seeds_without_tests_are_skipped(scorer):
    """A task without tests (a mined one) cannot tell its mutants from itself: not a seed."""
    from mlx_swe_rl.forge.seeds import Seed

    seed = Seed("no_tests", "t", "f", "d", "def f(x):\n    return x + 1\n", ())
    result = forge([seed], scorer, ForgeSettings(per_seed=1))
    assert result.puzzles == []
    assert result.seed_problems == {"no_tests": "no tests: a seed needs tests that catch its mutants"}


def test_calibrated_command_keeps_a_reports_category_in_the_candidates_order(forged, tmp_path):
    """A train set chosen again from a committed calibration: the report's category, nothing
    sampled, the candidates' order (a seeded run reads the set in file order)."""
    _, out = forged
    candidates = load_puzzles(out, split="train")
    mixed_ids = [p.id for p in candidates][1::2]
    rows = [{"id": p.id, "category": "mixed" if p.id in mixed_ids else "all-failed"} for p in reversed(candidates)]
    report = tmp_path / "calibration.json"
    report.write_text(json.dumps({"puzzles": rows}))
    chosen = tmp_path / "mixed.json"
    result = CliRunner().invoke(main, ["puzzles", "calibrated", str(out), "--report", str(report), "--out", str(chosen)])
    assert result.exit_code == 0, result.output
    written = json.loads(chosen.read_text())
    assert written["puzzles"] == mixed_ids and written["source"] == {"rollouts": str(report), "category": "mixed"}
    assert [p.id for p in load_train_set(chosen)] == mixed_ids
    failed = tmp_path / "failed.json"
    result = CliRunner().invoke(main, ["puzzles", "calibrated", str(chosen), "--report", str(report),
                                       "--category", "all-failed", "--out", str(failed)])
    assert result.exit_code == 1 and "puts none of the" in result.output  # the mixed set holds no failed one
    report.write_text(json.dumps({"puzzles": [{"id": "x"}]}))
    result = CliRunner().invoke(main, ["puzzles", "calibrated", str(out), "--report", str(report), "--out", str(failed)])
    assert result.exit_code == 1 and "expected rows with an id and a category" in result.output
    assert "Traceback" not in result.output and not failed.exists()
