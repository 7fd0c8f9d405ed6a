"""The `experiment` command: `mlx-swe-rl experiment FILE [--dry-run] [--only VARIANT] [--seeds S,...]
[--report]` runs a comparison experiment (mlx_swe_rl/experiments/spec.py) piece by piece and
writes its report. Every piece is kept on disk when done, so a rerun, after an interruption or
with more variants, skips what is there and resumes a started run from its checkpoint."""

from __future__ import annotations

import dataclasses
import gc
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import click

from .options import fail


@click.command("experiment")
@click.argument("experiment_file", type=click.Path(path_type=Path))
@click.option("--dry-run", is_flag=True,
              help="List the pieces, what is kept, each run's memory estimate and a time estimate; run nothing.")
@click.option("--only", "only", multiple=True, metavar="VARIANT",
              help="Only this variant (repeatable), with the data and base evaluations it needs.")
@click.option("--seeds", default=None, metavar="S,...", help="Only these seeds, comma-separated.")
@click.option("--report", "report_only", is_flag=True,
              help="Only write the report from the files already there (it is also written after a run).")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def main(experiment_file: Path, dry_run: bool, only: tuple[str, ...], seeds: str | None, report_only: bool,
         quiet: bool) -> None:
    """Run a comparison experiment: its data steps, every variant x seed training run, and the
    evaluations of the base model and of every run, then write report.json, report.md and
    report.png in its output directory (docs/experiments.md)."""
    from ..experiments.pieces import missing_inputs, plan_pieces
    from ..experiments.report import write_report
    from ..rl.config import ConfigError

    chosen_seeds = parse_seeds(seeds)
    commands = click.get_current_context().find_root().command  # `mlx-swe-rl`, whose commands the data steps are
    try:
        experiment = load(experiment_file, commands)
        pieces = plan_pieces(experiment, only, chosen_seeds)
        every = plan_pieces(experiment)  # the report covers the whole experiment, whatever ran now
    except ConfigError as exc:
        fail(str(exc))
    missing = missing_inputs(pieces, every)
    if dry_run:
        return list_pieces(pieces, every, missing)
    if not report_only:
        if missing:
            fail(missing[0] + (f" (and {len(missing) - 1} more: --dry-run lists them)" if len(missing) > 1 else ""))
        run_pieces(pieces, commands, progress=not quiet, log=click.echo)
    written = write_report(experiment, every)
    click.echo((experiment.output_dir / "report.md").read_text())
    click.echo("wrote " + ", ".join(str(p) for p in written))


def load(path: Path, commands: click.Group):
    """The experiment file at `path`, its data steps read by the parsers of `commands` (the
    `mlx-swe-rl` group, handed in: this module is one of its commands)."""
    from ..experiments.spec import load_experiment

    return load_experiment(path, lambda command, args: data_options(commands, command, args))


def data_options(commands: click.Group, command: str, args: list[str]) -> dict[str, Any]:
    """A data command's options as its own parser reads them (a typo fails here, before any
    step runs; the command does not run); ValueError with click's message for a bad one."""
    from ..experiments.spec import TOP_LEVEL

    group = commands if command in TOP_LEVEL else commands.commands["puzzles"]
    cmd = group.commands.get(command)
    if cmd is None:
        raise ValueError("this version of mlx-swe-rl has no such command")
    try:
        with cmd.make_context(command, list(args)) as ctx:
            return dict(ctx.params)
    except click.exceptions.Exit:
        raise ValueError("--help or --version is not a data step") from None
    except click.ClickException as exc:
        raise ValueError(exc.format_message()) from None


def parse_seeds(text: str | None) -> tuple[int, ...]:
    """--seeds 0,1 as (0, 1); a one-line error for anything else."""
    if not text:
        return ()
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        fail(f"--seeds: expected comma-separated integers, got '{text}'")


def list_pieces(pieces: list, every: list, missing: list[str]) -> None:
    """--dry-run: each piece with its state, each run's memory preflight, the time left at the
    rates of this experiment's finished pieces, and the inputs nothing in this sitting makes."""
    from ..experiments.estimate import duration, measure, memory_line
    from ..experiments.pieces import RunPiece

    rates = measure(every)
    total, unknown = 0.0, 0
    for i, piece in enumerate(pieces, 1):
        click.echo(f"[{i}/{len(pieces)}] {piece.name}: {piece.state()}")
        if isinstance(piece, RunPiece) and not piece.done() and not piece.holder():  # a running one uses the memory
            click.echo(f"    {memory_line(piece)}")
        if not piece.done():
            seconds = rates.seconds(piece)
            if seconds is None:
                unknown += 1
            else:
                total += seconds
    todo = sum(not p.done() for p in pieces)
    basis = [f"{rates.step_s:.1f} s per training step ({rates.steps_seen} steps)" if rates.step_s else
             "no training step measured yet",
             f"{rates.completion_s:.2f} s per evaluated completion ({rates.evals_seen} evaluations)"
             if rates.completion_s else "no evaluation measured yet"]
    told = ("nothing left to run" if not todo else
            f"about {duration(total)} at this experiment's rates" if todo > unknown else "no time estimate")
    click.echo(f"{todo} of {len(pieces)} pieces to do; {told} ({'; '.join(basis)})"
               + (f"; {unknown} piece(s) not estimated (nothing to measure them by yet)" if unknown else ""))
    for line in missing:
        click.echo(f"cannot start: {line}")


def run_pieces(pieces: list, commands: click.Group, progress: bool, log: Callable[[str], None],
               train_fn: Callable[..., Any] | None = None) -> None:
    """Run every piece not done yet, in order, saying which one and how many are left; data
    steps are commands of `commands` (`mlx-swe-rl`). `train_fn` replaces the trainer (tests
    watch which runs start and which resume)."""
    from ..experiments.pieces import DataPiece, RunPiece
    from ..rl.trainer import train

    todo = [p for p in pieces if not p.done()]
    log(f"{len(pieces) - len(todo)} of {len(pieces)} pieces kept from earlier; {len(todo)} to do")
    for i, piece in enumerate(todo, 1):
        log(f"[{i}/{len(todo)}] {piece.name} ({piece.state()}; {len(todo) - i} left after it)")
        if isinstance(piece, DataPiece):
            make_data(piece, commands, log)
        elif isinstance(piece, RunPiece):
            train_run(piece, train_fn or train, progress, log)
        else:
            evaluate_piece(piece, progress, log)
        _release_memory()


def make_data(piece, commands: click.Group, log: Callable[[str], None]) -> None:
    """A data step: the command as typed, in this process (a script in a child process of this
    Python, so its imports and globals stay its own); its outputs must appear."""
    from ..experiments.spec import SCRIPT

    log(f"$ {piece.step.line()}")
    if piece.step.command == SCRIPT:
        if subprocess.run([sys.executable, *piece.step.argv]).returncode != 0:
            fail(f"{piece.step.line()}: failed (its messages are above)")
    else:
        commands.main(args=piece.step.argv, prog_name="mlx-swe-rl", standalone_mode=False)
    missing = [str(p) for p in piece.step.outputs if not p.exists()]
    if missing:
        fail(f"{piece.step.line()}: did not write {', '.join(missing)}")


def train_run(piece, train_fn: Callable[..., Any], progress: bool, log: Callable[[str], None]) -> None:
    """A training run through the trainer, resumed from its checkpoint when it was started
    before; the time it takes is added to the run's wall_time.json."""
    from ..models.specs import ModelError
    from ..puzzles.format import PuzzleError
    from ..puzzles.trainset import TrainSetError
    from ..runfiles import add_wall_time
    from ..rl.trainer import TrainingError
    from ..sandbox.pool import ConfinementError

    start = time.perf_counter()
    try:
        train_fn(piece.config, resume=piece.started(), progress=progress, log=log)
    except (ConfinementError, ModelError, PuzzleError, TrainSetError, TrainingError) as exc:
        fail(f"{piece.name}: {exc}")
    finally:
        if piece.run_dir.is_dir():  # also for a sitting cut short: wall time counts every sitting
            add_wall_time(piece.run_dir, time.perf_counter() - start)


def evaluate_piece(piece, progress: bool, log: Callable[[str], None]) -> None:
    """One evaluation, asked as the piece's config asks (model, dtype, prompt, test split) and
    sampled as its set says; the report goes to the piece's file, written atomically."""
    from ..experiments.report import overall
    from ..rl.evaluation import evaluate, open_journal
    from ..rl.journal import JournalError
    from ..runfiles import write_json_atomic
    from .options import model_report, select_puzzles

    cfg, s = piece.asked, piece.eval_set
    if piece.soup is not None and not piece.adapter.is_dir():
        make_soup(piece, log)
    if piece.adapter is not None and not piece.adapter.is_dir():  # another experiment's run, not made yet
        fail(f"{piece.name}: no adapters at {piece.adapter} (run what makes them first)")
    puzzles = select_puzzles(Path(s.puzzles) if s.puzzles else None, s.tiers, s.split)  # as `eval --puzzles`
    plan = piece.plan()
    sandbox = {"workers": cfg.workers, "confinement": cfg.sandbox.confinement,
               "allow_unconfined": not cfg.sandbox.require_confinement}
    journal = None
    if piece.journalled:  # a killed evaluation resumes from the puzzles it finished
        try:
            journal = open_journal(piece.out, puzzles, plan, model=cfg.model.spec,
                                   adapter=piece.adapter, dtype=cfg.model.dtype,
                                   prompt=dataclasses.asdict(cfg.prompt))
        except JournalError as exc:
            fail(f"{piece.name}: {exc}")
        if journal.rows:
            log(f"{piece.name}: resuming, {len(journal.rows)} of {len(puzzles)} puzzles finished before")
    report = model_report(cfg.model.spec, piece.adapter, cfg.model.dtype, puzzles, sandbox,
                          lambda model, tokenizer, env: evaluate(model, tokenizer, env, puzzles, plan,
                                                                 best_of_n=s.best_of_n and s.turns > 1,
                                                                 progress=progress, journal=journal),
                          cfg.prompt.format, cfg.multi_turn.split(s.turns), cfg.prompt.style())
    report["meta"]["experiment"] = {"model": piece.model, "set": piece.set_name}
    write_json_atomic(piece.out, report)
    if journal:
        journal.close()
    rate, low, high = overall(report)
    log(f"{piece.name}: avg@{s.samples} {100 * rate:.1f}% [{100 * low:.1f}, {100 * high:.1f}] -> {piece.out}")


def make_soup(piece, log: Callable[[str], None]) -> None:
    """A soup variant's adapter: the mean of the last K adapters its run kept (`models.soup`)."""
    from ..models.soup import SoupError, soup
    from ..rl.rundir import TrainingError, last_kept_adapters

    run, k = piece.soup
    try:
        kept = last_kept_adapters(run, k)
        soup(kept, piece.adapter)  # written beside it and renamed when whole: a crash leaves no half soup
    except (SoupError, TrainingError) as exc:
        fail(f"{piece.name}: {exc}")
    log(f"{piece.name}: the soup of {', '.join(p.name for p in kept)} of {run} -> {piece.adapter}")


def _release_memory() -> None:
    """Give the last piece's arrays back before the next piece loads its model (one process
    runs them all)."""
    import mlx.core as mx

    gc.collect()
    mx.clear_cache()
