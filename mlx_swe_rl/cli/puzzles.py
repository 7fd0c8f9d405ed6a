"""`mlx-swe-rl puzzles ...`: list, sample, forge, mine, harvest, write and check puzzle sets."""

from __future__ import annotations

import time
from pathlib import Path

import click

from ..puzzles.format import PuzzleError, default_puzzle_dir, load_puzzle, load_puzzles, puzzle_files
from .options import fail, open_scorer, sandbox_options, select_puzzles, tier_option


@click.group()
def puzzles() -> None:
    """Inspect and validate puzzle sets."""


PUZZLE_DIR = click.argument("directory", required=False, type=click.Path(path_type=Path))


@puzzles.command("list")
@PUZZLE_DIR
@tier_option
@click.option("--split", type=click.Choice(["all", "train", "heldout"]), default="all", show_default=True)
def list_puzzles(directory: Path | None, tiers: list[str] | None, split: str) -> None:
    """Print a table of the puzzles in DIRECTORY (default: the bundled set)."""
    try:
        found = load_puzzles(directory, tiers, split)
    except PuzzleError as exc:
        fail(str(exc))
    width = max(len(p.id) for p in found) if found else 2
    tier_width = max([len(p.tier) for p in found] + [4])
    family = any(p.family for p in found)  # forged sets: the mutator family of each puzzle
    click.echo(f"{'id':<{width}}  {'tier':<{tier_width}}  {'split':<7}  tests" + ("  family" if family else ""))
    for p in found:
        click.echo(f"{p.id:<{width}}  {p.tier:<{tier_width}}  {p.split:<7}  {len(p.tests):>5}"
                   + (f"  {p.family or '-'}" if family else ""))
    click.echo(f"{len(found)} puzzles")


@puzzles.command("sample")
@PUZZLE_DIR
@click.option("-n", "count", type=click.IntRange(min=1), required=True, help="How many puzzles.")
@click.option("--split", type=click.Choice(["all", "train", "heldout"]), default="all", show_default=True)
@tier_option
@click.option("--max-lines", type=click.IntRange(min=1), default=None,
              help="Only puzzles whose buggy code (imports and helpers included) has at most this many "
                   "non-blank lines: on a CPU a step costs about the longest answer, and an answer is "
                   "about as long as the code it fixes.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Puzzle-set JSON to write.")
def sample_puzzles(directory: Path | None, count: int, split: str, tiers: list[str] | None,
                   max_lines: int | None, seed: int, out: Path) -> None:
    """Write a seeded random sample of the puzzles in DIRECTORY (or of a puzzle-set file) as a
    puzzle-set file (the format of `calibrate --write-train-set`), for calibration, training or
    evaluation subsets."""
    import random

    from ..puzzles.format import code_lines
    from ..puzzles.trainset import source_directory, write_train_set

    found = select_puzzles(directory, tiers, split)
    if max_lines is not None:
        found = [p for p in found if code_lines(p.buggy) <= max_lines]
    if count > len(found):
        fail(f"-n: {count} is more than the {len(found)} puzzles that match")
    chosen = sorted(random.Random(seed).sample(found, count), key=lambda p: p.id)
    write_train_set(out, chosen, source_directory(directory),
                    {"from": str(directory) if directory else None, "sample": count, "of": len(found),
                     "split": split, "tiers": tiers, "max_lines": max_lines, "seed": seed})
    click.echo(f"wrote {out} ({count} of {len(found)} puzzles)")


@puzzles.command("calibrated")
@click.argument("candidates", type=click.Path(path_type=Path))
@click.option("--report", type=click.Path(path_type=Path), required=True,
              help="A calibration report (`calibrate --out`, or a run's calibration.json).")
@click.option("--category", type=click.Choice(["mixed", "all-failed", "all-solved"]), default="mixed", show_default=True)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Puzzle-set JSON to write.")
def calibrated_puzzles(candidates: Path, report: Path, category: str, out: Path) -> None:
    """Write the puzzles of CANDIDATES (a directory or a puzzle-set file) that a calibration
    REPORT put in --category, in CANDIDATES' order: a train set from a committed calibration,
    without sampling again."""
    import json

    from ..puzzles.trainset import TrainSetError, of_category, source_directory, write_train_set

    found = select_puzzles(candidates, None, "all")
    try:
        chosen = of_category(found, json.loads(report.read_text()), category)
    except OSError as exc:
        fail(f"--report: cannot read {report} ({exc.strerror})")
    except ValueError as exc:  # TrainSetError too
        fail(f"--report: {report}: {exc}" if isinstance(exc, TrainSetError) else f"--report: {report} is not valid JSON")
    if not chosen:
        fail(f"--report: {report} puts none of the {len(found)} puzzles of {candidates} in '{category}'")
    write_train_set(out, chosen, source_directory(candidates), {"rollouts": str(report), "category": category})
    click.echo(f"wrote {out} ({len(chosen)} {category} puzzles of {len(found)}, from {report})")


@puzzles.command("stubs")
@PUZZLE_DIR
@tier_option
@click.option("--split", type=click.Choice(["all", "train", "heldout"]), default="all", show_default=True)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Directory for the writing tasks.")
@click.option("--overwrite", is_flag=True, help="Replace an earlier set of writing tasks in --out.")
def stubs_command(directory: Path | None, tiers: list[str] | None, split: str, out: Path, overwrite: bool) -> None:
    """Write a writing task for each function of DIRECTORY's puzzles (or a puzzle-set file's):
    its signature and description with the body left to write, scored by the puzzle's tests.
    Evaluate them with `--prompt-template write`: the capability gate of issue 53."""
    from ..forge.puzzleset import write_puzzle_set
    from ..forge.stubs import stub_puzzles

    found = select_puzzles(directory, tiers, split)
    stubs = stub_puzzles(found)
    summary = {"from": str(directory) if directory else None, "tiers": tiers, "split": split,
               "puzzles": len(found), "functions": len(stubs)}
    try:
        write_puzzle_set(stubs, out, "stubs.json", summary, overwrite, kind="set of writing tasks")
    except (FileExistsError, OSError) as exc:
        fail(str(exc))
    click.echo(f"wrote {len(stubs)} writing tasks (one per function of {len(found)} puzzles) to {out}")


@puzzles.command("forge")
@click.argument("seeds", nargs=-1, type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Directory for the forged puzzle set.")
@click.option("--per-seed", type=click.IntRange(min=1), default=4, show_default=True,
              help="Puzzles kept per seed function (at most).")
@click.option("--families", default=None, help="Comma-separated mutator families (default: all).")
@click.option("--heldout-frac", type=click.FloatRange(0.0, 1.0), default=0.25, show_default=True,
              help="Share of seed functions held out (besides those from held-out puzzles).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the choice of mutants and the split.")
@click.option("--timeout", type=click.FloatRange(0.05, 60.0), default=1.0, show_default=True,
              help="Seconds per run: the validation budget and every forged puzzle's timeout.")
@click.option("--overwrite", is_flag=True, help="Replace an earlier forged set in --out.")
@sandbox_options
def forge_command(seeds: tuple[Path, ...], out: Path, per_seed: int, families: str | None, heldout_frac: float,
                  seed: int, timeout: float, overwrite: bool, sandbox: dict) -> None:
    """Mutate correct SEEDS (seed or puzzle files or directories; default: the bundled seed
    bank and puzzles) into validated bug-fix puzzles under --out, split by function."""
    from tqdm.auto import tqdm

    from ..forge.forge import ForgeSettings, format_summary, forge, write_forged
    from ..forge.mutators import FAMILIES
    from ..forge.seeds import BUNDLED_SEEDS, load_seeds

    chosen = tuple(f.strip() for f in families.split(",") if f.strip()) if families else FAMILIES
    unknown = [f for f in chosen if f not in FAMILIES]
    if unknown:
        fail(f"--families: unknown family '{unknown[0]}' (valid: {', '.join(FAMILIES)})")
    if out.exists() and any(out.iterdir()) and not overwrite:
        fail(f"--out: {out} is not empty; pass --overwrite to replace a forged set")
    try:
        found = load_seeds(list(seeds) or [BUNDLED_SEEDS, default_puzzle_dir()])
    except PuzzleError as exc:
        fail(str(exc))
    settings = ForgeSettings(per_seed, chosen, heldout_frac, seed, timeout)
    start = time.monotonic()
    with open_scorer(**sandbox) as scorer, tqdm(desc="forge", unit="mutant") as bar:
        result = forge(found, scorer, settings, progress=bar.update)
    try:
        write_forged(result, out, overwrite)
    except (FileExistsError, OSError) as exc:
        fail(str(exc))
    click.echo(format_summary(result))
    click.echo(f"wrote {len(result.puzzles)} puzzles to {out} in {time.monotonic() - start:.1f}s")


@puzzles.command("mine")
@click.argument("repo")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Directory for the mined task set.")
@click.option("--commit", default=None,
              help="With a URL for REPO: mine the history up to this commit (the clone is checked out there).")
@click.option("--clone-dir", type=click.Path(path_type=Path), default=None,
              help="With a URL for REPO: where the clone goes (made once, then reused) [default: outputs/repos/NAME].")
@click.option("--max-lines", type=click.IntRange(min=1), default=30, show_default=True,
              help="Most changed lines (added + deleted) a commit may have in its one source file.")
@click.option("--heldout-frac", type=click.FloatRange(0.0, 1.0), default=0.2, show_default=True,
              help="Share of the tasks, newest first, held out (with every task of a function they change).")
@click.option("--max-commits", type=click.IntRange(min=1), default=None,
              help="Only the newest N commits (for a quick look).")
@click.option("--since", default=None, help="Only commits after this date (anything `git log --since` takes).")
@click.option("--no-tests", is_flag=True,
              help="Run no tests: no doctest tests, no repository tests (no sandbox needed).")
@click.option("--no-repo-tests", is_flag=True,
              help="Do not run the repository's own tests (FAIL_TO_PASS from each commit's test changes).")
@click.option("--snapshots", type=click.Path(path_type=Path), default=None,
              help="Cache of commit snapshots the repository tests run in [default: .REPO-snapshots beside REPO].")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Runs of each side (fix, bug put back) of a FAIL_TO_PASS candidate; differing verdicts are flaky.")
@click.option("--test-timeout", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
              help="Seconds one pytest run of a candidate's tests may take; a slower one drops it (too_slow).")
@click.option("--overwrite", is_flag=True, help="Replace an earlier mined set in --out.")
@sandbox_options
def mine_command(repo: str, out: Path, commit: str | None, clone_dir: Path | None, max_lines: int,
                 heldout_frac: float, max_commits: int | None, since: str | None, no_tests: bool, no_repo_tests: bool,
                 snapshots: Path | None, repeats: int, test_timeout: float, overwrite: bool, sandbox: dict) -> None:
    """Mine bug-fix tasks from the git history of REPO (a local repository, or a URL to clone):
    commits that change one function in one non-test .py file, the function before as buggy
    code and after as the oracle, the commit message as the description; doctest examples
    become tests where they can."""
    from tqdm.auto import tqdm

    from ..forge import history
    from ..forge.mine import (MineError, MineSettings, attach_repo_tests, attach_tests, build_puzzles, collect,
                              format_funnel, test_candidates, write_mined)

    if history.is_remote(repo):
        try:
            repo = history.clone(repo, clone_dir or Path("outputs") / "repos" / history.remote_name(repo), commit)
        except (history.GitError, OSError) as exc:
            fail(str(exc))
    elif commit is not None or clone_dir is not None:
        fail(f"--{'commit' if commit is not None else 'clone-dir'}: only with a URL for REPO "
             f"(check out a local repository yourself)")
    repo = Path(repo)
    if not history.is_repository(repo):
        fail(f"{repo}: not a git repository")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        fail(f"--out: {out} is not empty; pass --overwrite to replace a mined set")
    settings = MineSettings(max_lines, heldout_frac, max_commits, since, not no_tests, not (no_tests or no_repo_tests),
                            str(snapshots) if snapshots else None, repeats, test_timeout)
    try:
        total = history.count_commits(repo, max_commits, since) if history.head(repo) else 0
        with tqdm(desc="mine", unit="commit", total=total) as bar:
            mined = collect(repo, settings, progress=bar.update)
    except (MineError, history.GitError) as exc:
        fail(str(exc))
    doctests = settings.tests and any(test_candidates(c) for c in mined.changes)
    repo_tests = settings.repo_tests and any(c.test_files for c in mined.changes)
    if doctests or repo_tests:
        with open_scorer(**sandbox) as scorer:
            if doctests:
                attach_tests(mined, scorer)
            if repo_tests:
                with tqdm(desc="repository tests", unit="task", total=len(mined.changes)) as bar:
                    attach_repo_tests(mined, scorer, progress=bar.update)
            puzzles = build_puzzles(mined, scorer)
    else:
        puzzles = build_puzzles(mined)
    try:
        summary = write_mined(mined, puzzles, out, overwrite)
    except (FileExistsError, OSError) as exc:
        fail(str(exc))
    click.echo(format_funnel(summary))
    click.echo(f"wrote {len(puzzles)} tasks to {out} in {summary['timing']['seconds']:.1f}s "
               f"({summary['timing']['commits_per_second']} commits/s)")


@puzzles.command("harvest")
@click.argument("sources", nargs=-1, required=True)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Directory for the harvested seeds.")
@click.option("--max-functions", type=click.IntRange(min=1), default=None,
              help="Per source, a seeded sample of this many candidates (default: all).")
@click.option("--probe-mutants", type=click.IntRange(min=1), default=8, show_default=True,
              help="Forge mutants tried per seed; a seed is kept when one fails its tests.")
@click.option("--helper-lines", type=click.IntRange(min=0), default=40, show_default=True,
              help="Lines of its module's helpers (functions, classes, constants) a function may carry along, "
                   "all together (0: none).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the inputs, the sample and the forge.")
@click.option("--timeout", type=click.FloatRange(0.05, 60.0), default=1.0, show_default=True,
              help="Seconds: every seed's timeout (and the forge's validation budget).")
@click.option("--fingerprints", type=click.Path(path_type=Path), default=None,
              help="Benchmark fingerprints to decontaminate against [default: the committed HumanEval + MBPP list].")
@click.option("--forge", "forge_out", type=click.Path(path_type=Path), default=None,
              help="Also forge the seeds into this directory and count mutants kept per source.")
@click.option("--per-seed", type=click.IntRange(min=1), default=4, show_default=True,
              help="With --forge: puzzles kept per seed function (at most).")
@click.option("--heldout-frac", type=click.FloatRange(0.0, 1.0), default=0.25, show_default=True,
              help="With --forge: share of seed functions held out.")
@click.option("--overwrite", is_flag=True, help="Replace an earlier harvest in --out (and forged set in --forge).")
@sandbox_options
def harvest_command(sources: tuple[str, ...], out: Path, max_functions: int | None, probe_mutants: int,
                    helper_lines: int, seed: int,
                    timeout: float, fingerprints: Path | None, forge_out: Path | None, per_seed: int,
                    heldout_frac: float, overwrite: bool, sandbox: dict) -> None:
    """Harvest seed functions from SOURCES (source trees, installed distributions, or `stdlib`)
    under permissive licences: self-contained public functions of 5-40 lines, tested by their
    doctests or by outputs recorded in the sandbox, kept when a forge mutant fails the tests,
    none of them a HumanEval/MBPP function. Prints the funnel per source (docs/harvest.md)."""
    from tqdm.auto import tqdm

    from ..forge.decontam import FINGERPRINTS, load_benchmarks
    from ..forge.forge import ForgeSettings, format_summary, forge, write_forged
    from ..forge.harvest import HarvestSettings, add_forged, format_funnel, harvest, write_harvest
    from ..forge.sources import SourceError, resolve_source

    for target, option in ((out, "--out"), (forge_out, "--forge")):
        if target is not None and target.exists() and any(target.iterdir()) and not overwrite:
            fail(f"{option}: {target} is not empty; pass --overwrite to replace it")
    try:
        benchmarks = load_benchmarks(fingerprints or FINGERPRINTS)
        resolved = [resolve_source(spec) for spec in sources]
    except (SourceError, ValueError) as exc:
        fail(str(exc))
    names = [s.name for s in resolved]
    if len(set(names)) < len(names):
        fail(f"SOURCES: two sources are both named '{next(n for n in names if names.count(n) > 1)}'")
    for s in resolved:
        click.echo(f"{s.name}: {len(s.files)} files, licence {s.licence}"
                   + ("" if s.permissive else " (not permissive: skipped)"), err=True)
    settings = HarvestSettings(seed, max_functions, probe_mutants=probe_mutants, timeout=timeout,
                               max_helper_lines=helper_lines)
    with open_scorer(**sandbox) as scorer:
        result = harvest(resolved, scorer, benchmarks, settings,
                         bar=lambda desc, total: tqdm(desc=desc, total=total, unit="item"))
        forged = None
        if forge_out is not None and result.seeds:
            with tqdm(desc="forge", unit="mutant") as bar:
                forged = forge(result.seeds, scorer, ForgeSettings(per_seed, heldout_frac=heldout_frac, seed=seed,
                                                                   timeout=timeout), progress=bar.update)
            add_forged(result, forged.puzzles)
    try:
        write_harvest(result, out, overwrite)
        if forged is not None:
            write_forged(forged, forge_out, overwrite)
    except (FileExistsError, OSError) as exc:
        fail(str(exc))
    if forged is not None:
        click.echo(format_summary(forged))
    click.echo(format_funnel(result))
    click.echo(f"wrote {len(result.seeds)} seeds to {out}" + (f", {len(forged.puzzles)} puzzles to {forge_out}"
                                                              if forged is not None else "")
               + f" in {result.seconds:.0f}s of harvest")


@puzzles.command("check")
@PUZZLE_DIR
@click.option("--public-tests", type=click.FloatRange(min=0.0), default=1.0, show_default=True,
              help="The multi-turn split checked for puzzles with two tests or more: public tests per puzzle, a "
                   "count (>= 1) or a fraction (< 1); 0 skips the split check.")
@sandbox_options
def check(directory: Path | None, public_tests: float, sandbox: dict) -> None:
    """Validate every puzzle in DIRECTORY: schema, buggy code fails, oracle passes, the same
    verdict twice, and each run within its time budget; and multi-turn repair's split (puzzles
    with two tests or more): the public tests, run with their set-up, pass with the oracle, and
    the buggy code fails a hidden test. Tasks without tests (`tests: []`): the code parses,
    defines the entry point, and the fix changes more than docstrings, comments and formatting."""
    from ..env.feedback import TestSplit
    from ..forge.checks import check_puzzles

    root = directory if directory is not None else default_puzzle_dir()
    try:
        files = puzzle_files(root)
    except PuzzleError as exc:
        fail(str(exc))
    if not files:
        fail(f"{root}: no puzzle files (*.yaml) found")
    loaded, errors = [], []
    for path in files:
        try:
            loaded.append(load_puzzle(path))
        except PuzzleError as exc:
            errors.append(str(exc))
    ids: dict[str, Path] = {}
    for p in loaded:
        if p.id in ids:
            errors.append(f"{p.path}: id: '{p.id}' is also used by {ids[p.id]}")
        ids[p.id] = p.path
    split = TestSplit(public_tests) if public_tests > 0 else None
    start = time.monotonic()
    with open_scorer(**sandbox) as scorer:
        reports = check_puzzles(loaded, scorer, split)
    for report in reports:
        for problem in report.problems:
            errors.append(f"{report.puzzle.path}: {problem}")
    for error in errors:
        click.echo(f"FAIL {error}", err=True)
    good = sum(r.ok for r in reports)
    untested = sum(not p.tests for p in loaded)
    split_checked = sum(bool(split.public_indices(p)) for p in loaded) if split is not None else 0
    checks = "schema, buggy fails, oracle passes, stable verdicts, time budgets"
    if split_checked:
        checks += (f"; {split_checked} split with {public_tests:g} public test{'s' if public_tests != 1 else ''}: "
                   "oracle passes the public view, buggy fails a hidden test")
    if untested:
        checks += f"; {untested} without tests: parse, entry point, a change beyond docstrings and formatting"
    click.echo(f"{good}/{len(files)} puzzles OK in {time.monotonic() - start:.1f}s ({checks})")
    if errors:
        raise SystemExit(1)
