"""The `mlx-swe-rl` command line (also `python -m mlx_swe_rl`)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from .puzzles import PuzzleError, default_puzzle_dir, load_puzzle, load_puzzles, puzzle_files


def fail(message: str) -> None:
    """Stop with a one-line error and exit status 1 (user mistakes get no traceback)."""
    raise click.ClickException(message)


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
@click.option("--tier", "tiers", multiple=True, help="Only these tiers (repeatable).")
@click.option("--split", type=click.Choice(["all", "train", "heldout"]), default="all", show_default=True)
def list_puzzles(directory: Path | None, tiers: tuple[str, ...], split: str) -> None:
    """Print a table of the puzzles in DIRECTORY (default: the bundled set)."""
    try:
        found = load_puzzles(directory, list(tiers) or None, split)
    except PuzzleError as exc:
        fail(str(exc))
    width = max(len(p.id) for p in found) if found else 2
    click.echo(f"{'id':<{width}}  {'tier':<6}  {'split':<7}  tests")
    for p in found:
        click.echo(f"{p.id:<{width}}  {p.tier:<6}  {p.split:<7}  {len(p.tests):>5}")
    click.echo(f"{len(found)} puzzles")


@puzzles.command("check")
@PUZZLE_DIR
@click.option("--workers", type=int, default=None, help="Sandbox processes (default: one per core).")
def check(directory: Path | None, workers: int | None) -> None:
    """Validate every puzzle in DIRECTORY: schema, buggy code fails, oracle passes, the same
    verdict twice, and each run within its time budget."""
    from .checks import check_puzzles
    from .scoring import Scorer

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
    start = time.monotonic()
    with Scorer(workers) as scorer:
        reports = check_puzzles(loaded, scorer)
    for report in reports:
        for problem in report.problems:
            errors.append(f"{report.puzzle.path}: {problem}")
    for error in errors:
        click.echo(f"FAIL {error}", err=True)
    good = sum(r.ok for r in reports)
    click.echo(f"{good}/{len(files)} puzzles OK in {time.monotonic() - start:.1f}s "
               f"(schema, buggy fails, oracle passes, stable verdicts, time budgets)")
    if errors:
        raise SystemExit(1)
