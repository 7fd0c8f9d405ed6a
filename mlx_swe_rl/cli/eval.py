"""The `eval` command: `mlx-swe-rl eval --model SPEC [...]`, also `python -m mlx_swe_rl.eval` (see
`rl.evaluation`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from ..env.prompts import PromptStyle
from ..rl.config import SamplingPlan
from ..rl.evaluation import evaluate, format_report, open_journal, read_report
from ..rl.journal import JournalError
from ..rl.stats import compare_reports, format_changes
from ..runfiles import default_out_path, write_json_atomic
from .options import (config_default, fail, model_options, model_report, multi_turn_options, puzzle_options,
                      sampling_options, sandbox_options, select_puzzles)


@click.command("eval")
@model_options
@puzzle_options
@click.option("--samples", "-K", type=click.IntRange(min=1), default=config_default("train.eval_samples"),
              show_default=True, help="Completions per puzzle; above 1 reports pass@1 and pass@K.")
@sampling_options({"temperature": None})
@multi_turn_options
@click.option("--best-of-n", is_flag=True,
              help="With --turns N: also the compute-matched baseline, N independent answers per episode, the "
                   "first that passes the public tests judged on the hidden ones.")
@sandbox_options
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Result JSON (default: outputs/eval/eval-<time>.json). A named one keeps a journal beside it, "
                   "so the same command after a kill resumes from the puzzles it finished.")
@click.option("--baseline", type=click.Path(path_type=Path), default=None,
              help="An earlier eval JSON of the same puzzles: print the paired change with its 95% CI.")
def main(model_spec: str, adapter: Path | None, dtype: str, puzzle_dir: Path | None, tiers: list[str] | None,
         split: str, samples: int, temperature: float | None, max_tokens: int, seed: int, batch_size: int,
         full_completions: bool, answer_format: str, style, turns: int, test_split, best_of_n: bool, sandbox: dict,
         out: Path | None, baseline: Path | None) -> None:
    """Evaluate a model (optionally with LoRA adapters) on the puzzles. Greedy by default;
    --samples K draws K completions at --temperature (default: sampling.temperature, 0.8, when K > 1)."""
    if temperature is None:  # as a run's evaluations choose (Config.eval_sampling)
        temperature = 0.0 if samples == 1 else config_default("sampling.temperature")
    if temperature < 0:
        fail(f"--temperature: {temperature} must be >= 0")
    puzzles = select_puzzles(puzzle_dir, tiers, split)
    try:
        earlier = read_report(baseline) if baseline is not None else None
    except ValueError as exc:
        fail(f"--baseline: {exc}")
    plan = SamplingPlan(samples, temperature, max_tokens, seed=seed, batch_size=batch_size,
                        stop_after_answer=not full_completions, max_turns=turns)
    journal = None
    if out is not None and turns == 1:  # a killed evaluation with a named report resumes from its journal
        try:
            journal = open_journal(out, puzzles, plan, model=model_spec, adapter=adapter, dtype=dtype,
                                   format=answer_format, prompt=dataclasses.asdict(style or PromptStyle()))
        except JournalError as exc:
            fail(str(exc))
        if journal.rows:
            click.echo(f"resuming: {len(journal.rows)} of {len(puzzles)} puzzles finished before ({journal.path})")
    report = model_report(model_spec, adapter, dtype, puzzles, sandbox, lambda model, tokenizer, env: evaluate(
        model, tokenizer, env, puzzles, plan, best_of_n=best_of_n and turns > 1, journal=journal), answer_format,
        test_split, style)
    click.echo(format_report(report))
    if earlier is not None:
        changes = compare_reports(earlier, report)
        if not changes:
            fail(f"--baseline: {baseline} shares no puzzle with this evaluation")
        report["change_vs_baseline"] = {"baseline": str(baseline), **changes}
        click.echo("\n" + format_changes(changes, f"paired change from {baseline} (per-puzzle pass@1, bootstrap "
                                                   "over puzzles)"))
    out = out or default_out_path("eval")
    write_json_atomic(out, report)
    if journal:
        journal.close()
    click.echo(f"wrote {out}")

