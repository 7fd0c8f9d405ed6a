"""Pieces shared by the command lines: one-line errors and the model / puzzle options.

An option that has a config key takes its default from the config dataclasses (`config_default`),
so `eval`, `calibrate` and `train` start from the same settings; `tests/test_cli.py` checks
every such pair.
"""

from __future__ import annotations

import dataclasses
import functools
import signal
import threading
import typing
from pathlib import Path
from typing import Any, Callable, Iterable

import click


def fail(message: str) -> None:
    """Stop with a one-line error and exit status 1 (user mistakes get no traceback)."""
    raise click.ClickException(message)


def exit_on_sigterm() -> None:
    """Let SIGTERM (`kill`, a scheduler's stop, the end of a session) end a command through
    SystemExit instead of on the spot, so its `finally` blocks run: a training sitting's wall time
    is recorded and the sandbox's workers are stopped. Exit status 143 as before, no traceback."""
    if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
        signal.signal(signal.SIGTERM, _raise_exit)


def _raise_exit(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def config_default(key: str) -> Any:
    """The default of config key `key` ("sampling.max_tokens"), read from the field declarations
    of `rl.config.Config`. Not from an instance: `model.dtype: auto` is resolved to the device's
    dtype when a ModelConfig is built, and the command line must still offer "auto"."""
    from ..rl.config import Config

    cls: Any = Config
    *sections, name = key.split(".")
    for section in sections:
        cls = typing.get_type_hints(cls)[section]
    found = {f.name: f for f in dataclasses.fields(cls)}[name]
    if found.default_factory is not dataclasses.MISSING:
        return found.default_factory()
    return found.default


def parse_tiers(values: Iterable[str]) -> list[str] | None:
    """Tier names from option values that may each hold several, comma-separated, in order and
    without repeats; None (every tier) when none is named."""
    tiers: list[str] = []
    for value in values:
        tiers += [t.strip() for t in value.split(",") if t.strip() and t.strip() not in tiers]
    return tiers or None


def tier_option(func: Callable) -> Callable:
    """--tiers, comma-separated or repeated (`--tiers easy,medium` = `--tiers easy --tiers medium`),
    handed to the command as `tiers` (a list, or None for all). `--tier` is the same option under
    the spelling `puzzles list/sample` once had: hidden from help, so one spelling is shown
    everywhere, and kept so that old command lines still run."""

    @functools.wraps(func)
    def command(*args: Any, tiers: tuple[str, ...], tier_alias: tuple[str, ...], **kwargs: Any) -> Any:
        return func(*args, tiers=parse_tiers(tiers + tier_alias), **kwargs)

    options = [
        click.option("--tiers", "tiers", multiple=True, metavar="TIER[,TIER...]",
                     help="Only these tiers, comma-separated or repeated, e.g. easy,medium (default: all)."),
        click.option("--tier", "tier_alias", multiple=True, hidden=True),
    ]
    return functools.reduce(lambda f, opt: opt(f), reversed(options), command)


def model_options(func: Callable) -> Callable:
    """--model, --adapter and --dtype."""
    from ..models.specs import DTYPE_CHOICES

    options = [
        click.option("--model", "model_spec", default=config_default("model.spec"), show_default=True,
                     help="HF repo id, mlx-lm directory, .gguf file, ollama:NAME[:TAG] or a built-in "
                          "name (smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b)."),
        click.option("--adapter", type=click.Path(path_type=Path), default=None,
                     help="LoRA adapter directory (mlx-lm format) to apply."),
        click.option("--dtype", type=click.Choice(DTYPE_CHOICES), default=config_default("model.dtype"),
                     show_default=True,
                     help="Floating-point dtype of the weights (auto: float32 on a CPU, bfloat16 on a GPU)."),
    ]
    return functools.reduce(lambda f, opt: opt(f), reversed(options), func)


def puzzle_options(func: Callable | None = None, *, split: str = "all") -> Callable:
    """--puzzles, --tiers (see `tier_option`), --split (default `split`). A decorator as it is
    (`@puzzle_options`: every split, as evaluations want) or with another split default
    (`@puzzle_options(split="train")`: calibration chooses training puzzles, as a run's does)."""
    if func is None:
        return functools.partial(puzzle_options, split=split)
    options = [
        click.option("--puzzles", "puzzle_dir", type=click.Path(path_type=Path), default=None,
                     help="Puzzle directory (default: the bundled set) or a train-set file."),
        tier_option,
        click.option("--split", type=click.Choice(["all", "train", "heldout"]), default=split,
                     show_default=True),
    ]
    return functools.reduce(lambda f, opt: opt(f), reversed(options), func)


def sampling_options(defaults: dict[str, Any]) -> Callable:
    """--temperature, --max-tokens, --seed, --batch-size, --full-completions, --format,
    --prompt-template and --prompt-system (handed to the command as one `style`). Defaults are
    the config's; `defaults` holds the one a command sets itself (eval's temperature: greedy
    unless it samples several completions)."""
    from ..env.formats import FORMATS
    from ..env.prompts import SYSTEM_MESSAGES, TEMPLATES, PromptStyle

    def wrap(func: Callable) -> Callable:
        @functools.wraps(func)
        def command(*args: Any, prompt_template: str, prompt_system: str, **kwargs: Any) -> Any:
            return func(*args, style=PromptStyle(prompt_template, prompt_system), **kwargs)

        options = [
            click.option("--temperature", type=float, default=defaults.get("temperature"),
                         help="Sampling temperature (0 = greedy)."),
            click.option("--max-tokens", type=click.IntRange(min=1), default=config_default("sampling.max_tokens"),
                         show_default=True, help="New tokens per completion."),
            click.option("--seed", type=int, default=config_default("seed"), show_default=True),
            click.option("--batch-size", type=click.IntRange(min=1), default=config_default("sampling.batch_size"),
                         show_default=True, help="Completions decoded together."),
            click.option("--full-completions", is_flag=True,
                         help="Do not end completions at the answer's closing fence: generate to EOS or "
                              "--max-tokens (for comparisons with earlier runs)."),
            click.option("--format", "answer_format", type=click.Choice(list(FORMATS)),
                         default=config_default("prompt.format"), show_default=True,
                         help="Answer format: the whole function in a code block, or SWE-RL's SEARCH/REPLACE edits."),
            click.option("--prompt-template", type=click.Choice(list(TEMPLATES)),
                         default=config_default("prompt.template"), show_default=True,
                         help="Wording of the question (function format; docs/prompts.md)."),
            click.option("--prompt-system", type=click.Choice(list(SYSTEM_MESSAGES)),
                         default=config_default("prompt.system"), show_default=True,
                         help="System message (none: the chat template's default)."),
        ]
        return functools.reduce(lambda f, opt: opt(f), reversed(options), command)
    return wrap


def multi_turn_options(func: Callable) -> Callable:
    """--turns, --public-tests, --feedback, --feedback-chars, --reward-on, handed to the command
    as `turns` and `test_split` (None for single-turn runs): see env.feedback.TestSplit."""
    from ..env.feedback import TestSplit

    @functools.wraps(func)
    def command(*args: Any, turns: int, public_tests: float, feedback: str, feedback_chars: int, reward_on: str,
                **kwargs: Any) -> Any:
        test_split = TestSplit(public_tests, reward_on, feedback == "detailed", feedback_chars) if turns > 1 else None
        return func(*args, turns=turns, test_split=test_split, **kwargs)

    options = [
        click.option("--turns", type=click.IntRange(min=1), default=config_default("multi_turn.max_turns"),
                     show_default=True,
                     help="Answers per episode: after a failed one the model reads the public tests' feedback and "
                          "tries again (docs/multi-turn.md)."),
        click.option("--public-tests", type=click.FloatRange(min=0.0),
                     default=config_default("multi_turn.public_tests"), show_default=True,
                     help="With --turns > 1: public tests per puzzle, a count (>= 1) or a fraction (< 1)."),
        click.option("--feedback", type=click.Choice(["detailed", "generic"]),
                     default=config_default("multi_turn.feedback"), show_default=True,
                     help="With --turns > 1: the failing public test and its outcome, or only 'the tests failed'."),
        click.option("--feedback-chars", type=click.IntRange(min=40),
                     default=config_default("multi_turn.feedback_chars"), show_default=True,
                     help="With --turns > 1: feedback truncated to this many characters."),
        click.option("--reward-on", type=click.Choice(["hidden", "all"]),
                     default=config_default("multi_turn.reward_on"), show_default=True,
                     help="With --turns > 1: the tests that judge an answer."),
    ]
    return functools.reduce(lambda f, opt: opt(f), reversed(options), command)


def sandbox_options(func: Callable) -> Callable:
    """--workers, --confinement and --allow-unconfined, handed to the command as one
    `sandbox` mapping (the keyword arguments of `open_scorer`)."""
    from ..sandbox.confine import MODES

    @functools.wraps(func)
    def command(*args: Any, workers: int | None, confinement: str, allow_unconfined: bool, **kwargs: Any) -> Any:
        sandbox = {"workers": workers, "confinement": confinement, "allow_unconfined": allow_unconfined}
        return func(*args, sandbox=sandbox, **kwargs)

    options = [
        click.option("--workers", type=click.IntRange(min=1), default=config_default("workers"),
                     help="Sandbox processes (default: one per core)."),
        click.option("--confinement", type=click.Choice(MODES), default=config_default("sandbox.confinement"),
                     show_default=True, help="How candidate code is confined (docs/scoring.md)."),
        click.option("--allow-unconfined", is_flag=True,
                     help="Run candidate code even where no confinement is available."),
    ]
    return functools.reduce(lambda f, opt: opt(f), reversed(options), command)


def open_scorer(workers: int | None, confinement: str, allow_unconfined: bool):
    """A Scorer whose confinement is said on stderr, or a one-line error where candidates
    would run unconfined and that was not allowed."""
    from ..sandbox.confine import confinable_platform
    from ..sandbox.pool import ConfinementError, unconfined_message
    from ..sandbox.scorer import Scorer

    try:
        scorer = Scorer(workers, confinement=confinement,
                        require_confinement=confinable_platform() and not allow_unconfined)
    except ConfinementError as exc:
        fail(unconfined_message(exc.confinement, "pass --allow-unconfined"))
    click.echo(f"sandbox: {scorer.confinement}", err=True)
    return scorer


def select_puzzles(puzzle_dir: Path | None, tiers: str | list[str] | None, split: str):
    """Load the chosen puzzles or stop with a one-line error. `tiers`: a list, a comma-separated
    string, or None for all. A `.json` file is a puzzle-set file (`calibrate --write-train-set`,
    `puzzles sample`: puzzle ids, optionally a directory)."""
    from ..puzzles.format import PuzzleError
    from ..puzzles.trainset import TrainSetError, load_selection

    tier_list = parse_tiers([tiers] if isinstance(tiers, str) else tiers or ())
    try:
        found = load_selection(puzzle_dir, tier_list, split)
    except (PuzzleError, TrainSetError) as exc:
        fail(str(exc))
    if not found:
        fail(f"no puzzles match tiers={','.join(tier_list) if tier_list else 'all'} split={split}")
    return found


def open_model(model_spec: str, adapter: Path | None, dtype: str):
    """Load (model, tokenizer) or stop with a one-line error."""
    from ..models.specs import ModelError, load_model

    try:
        return load_model(model_spec, adapter=adapter, dtype=dtype)
    except ModelError as exc:
        fail(str(exc))


def model_report(model_spec: str, adapter: Path | None, dtype: str, puzzles: list, sandbox: dict[str, Any],
                 run: Callable[[Any, Any, Any], dict[str, Any]], answer_format: str = "function",
                 split: Any = None, style: Any = None) -> dict[str, Any]:
    """Load the model, open the scorer (`sandbox`: the keyword arguments of `open_scorer`) and
    environment (asking for `answer_format` in `style`, an `env.prompts.PromptStyle`; `split`:
    the test split of multi-turn runs), run
    `run(model, tokenizer, env)`, and return its report with the run's metadata in front."""
    from ..env.codefix import CodeFixEnv
    from ..env.prompts import PromptStyle
    from ..models import fastmath
    from ..models.specs import resolve_dtype
    from ..runfiles import run_metadata

    model, tokenizer = open_model(model_spec, adapter, dtype)
    from ..models.chat import ChatTemplateError

    style = style or PromptStyle()
    with open_scorer(**sandbox) as scorer, CodeFixEnv(puzzles, scorer, answer_format=answer_format, split=split,
                                                     style=style) as env:
        try:
            report = run(model, tokenizer, env)
        except ChatTemplateError as exc:
            fail(f"{model_spec}: {exc}")
    meta = {**run_metadata(model_spec, adapter, resolve_dtype(dtype), fastmath.patched()), "format": answer_format,
            "prompt": {"template": style.template, "system": style.system}}
    return {"meta": meta, **report}
