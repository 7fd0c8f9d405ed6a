"""The `train` command: `mlx-swe-rl train --config FILE [--set key=value ...] [--resume]`, also
`python -m mlx_swe_rl.train` (the same command)."""

from __future__ import annotations

from pathlib import Path

import click

from .options import exit_on_sigterm, fail


@click.command("train")
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
              help="YAML config (see configs/ and docs/configuration.md).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a config key, e.g. --set grpo.beta=0 (repeatable).")
@click.option("--resume", is_flag=True, help="Continue the run from its last checkpoint.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
@click.option("--dry-run", is_flag=True, help="Print the run's memory estimate and exit without training.")
def main(config_path: Path | None, overrides: tuple[str, ...], resume: bool, quiet: bool, dry_run: bool) -> None:
    """Train a model with on-policy GRPO on the puzzles."""
    from ..rl.config import ConfigError, load_config
    from ..models.specs import ModelError
    from ..puzzles.format import PuzzleError
    from ..rl.trainer import TrainingError, train
    from ..sandbox.pool import ConfinementError
    from ..puzzles.trainset import TrainSetError
    from ..rl.memory import MemoryCheckError

    exit_on_sigterm()  # also as `python -m mlx_swe_rl.train`, which bypasses the group
    try:
        cfg = load_config(config_path, list(overrides))
        if dry_run:
            return estimate_only(cfg, str(config_path or "the default config"))
        result = train(cfg, resume=resume, progress=not quiet, log=click.echo)
    except (ConfigError, ConfinementError, ModelError, PuzzleError, TrainSetError, TrainingError,
            MemoryCheckError) as exc:
        fail(str(exc))
    from ..rl.distributed import is_main

    if not is_main():  # rank 0 reports for the whole data-parallel run
        return
    history = result.history
    if history:
        first, last = history[0], history[-1]
        steps_s = sum(h.step_s for h in history) / len(history)
        peak = max(h.peak_memory_gb for h in history)
        click.echo(f"steps {first.step}-{last.step}: reward mean {first.reward_mean:.3f} -> "
                   f"{last.reward_mean:.3f}, {steps_s:.1f}s/step, peak memory {peak:.2f} GB")
    click.echo(f"run directory: {result.run_dir} (adapters load with --adapter-path {result.run_dir})")


def estimate_only(cfg, title: str) -> None:
    """--dry-run: the memory estimate of the run's phases, and whether it fits (exit 1 if not)."""
    from ..rl.memory import dry_run
    from ..rl.rundir import eval_puzzles, training_puzzles

    puzzles = training_puzzles(cfg)
    dry_run(cfg, puzzles, eval_puzzles(cfg, puzzles), title, click.echo)
