"""The experiment file (YAML): what to compare, on which seeds, evaluated on which sets, from
which data. Read into dataclasses and checked like a training config before anything runs:
every error is one line naming the file and the key.

    name: learn-stop                      # default: the file's name
    output_dir: outputs/learn-stop        # runs and evaluations (default: outputs/NAME)
    base: configs/learn.yaml              # the training config every run starts from
    overrides: {train.steps: 16}          # key.sub: value, for every run (as `train --set`)
    seeds: [0, 1]                         # every variant's seeds unless it names its own
    variants:
      onpolicy: {}
      frozen: {overrides: {sampling.mode: frozen}, seeds: [0], sets: [train, heldout]}
      narrow: {adapter: outputs/learn-stop/onpolicy-s0}   # evaluation only: adapters made elsewhere
      full: {adapter: none, overrides: {sampling.stop_after_answer: false}}  # the base model asked otherwise
    sets:                                 # evaluations: the base model's and every run's
      train: {puzzles: outputs/learn-train40.json, samples: 8}
      bundled: {samples: 4}               # no puzzles: the bundled set
    data:                                 # made first, once each; kept when their outputs exist
      - sample: outputs/forged-easy -n 40 --seed 0 --out outputs/train40.json
      - {script: scripts/transfer_data.py --seed 0, outputs: [outputs/transfer/data.json]}
    pairs:                                # variant-minus-variant rows of the report
      - {variant: onpolicy, minus: frozen}

Paths are read from the directory the command runs in (the repository root for the committed
files); `base` may also be given relative to the experiment file.
"""

from __future__ import annotations

import difflib
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..env.prompts import TEMPLATES
from ..rl.config import Config, ConfigError, as_assignments, from_dict, load_config, meta, read_yaml_mapping

TOP_KEYS = ("name", "about", "output_dir", "base", "overrides", "seeds", "variants", "sets", "data", "pairs")
VARIANT_KEYS = ("about", "overrides", "seeds", "sets", "adapter", "soup")
PAIR_KEYS = ("variant", "minus")
# The data steps an experiment may run: `mlx-swe-rl puzzles forge|sample|calibrated|mine|harvest|stubs` and the
# calibration (`mlx-swe-rl calibrate --write-train-set`, once named rollouts), each with the options
# that name what it writes.
DATA_COMMANDS: dict[str, tuple[str, ...]] = {
    "forge": ("out",), "sample": ("out",), "calibrated": ("out",), "mine": ("out",), "harvest": ("out", "forge_out"),
    "stubs": ("out",), "calibrate": ("out", "write_train_set"), "rollouts": ("out", "write_train_set")}
TOP_LEVEL = ("calibrate", "rollouts")  # commands of `mlx-swe-rl` itself, not of `mlx-swe-rl puzzles`
# A committed Python script is a data step too (data a command cannot make, e.g. a set drawn from
# several calibrations); its options are its own, so the step names what it writes.
SCRIPT, SCRIPT_KEYS = "script", ("script", "outputs")
NO_ADAPTER = "none"  # `adapter: none`: an evaluation-only variant of the base model itself
RESERVED = {"seed": "seeds", "output_dir": "output_dir", "run_name": "VARIANT-sSEED"}  # not overridable
ReadOptions = Callable[[str, list[str]], dict[str, Any]]  # (command, args) -> its options, by name
BASE = "base"  # the name of the untrained model's evaluations (eval-base-SET.json)


@dataclass(frozen=True)
class EvalSet:
    """One evaluation set and how it is sampled; unset values come from the training config
    (sampling.max_tokens, sampling.batch_size, sampling.temperature), so the model is asked as
    it was trained. Model, dtype, system message and multi-turn feedback always come from the config,
    and the question's wording too unless the set names its own (`prompt_template`)."""

    about: str = meta("", doc="what the set is, for the report")
    puzzles: str | None = meta(None, doc="puzzle directory or puzzle-set file (null = the bundled puzzles)")
    tiers: list[str] | None = meta(None, doc="only these tiers (null = all)")
    split: str = meta("all", choices=("all", "train", "heldout"), doc="only this split")
    samples: int = meta(1, min=1, doc="K: completions per puzzle (1 = greedy unless temperature is set)")
    max_tokens: int | None = meta(None, min=1, doc="new tokens per answer (null = sampling.max_tokens)")
    turns: int = meta(1, min=1, doc="answers per episode (multi-turn repair when > 1)")
    best_of_n: bool = meta(False, doc="with turns > 1, also the best of that many independent answers "
                                      "(eval --best-of-n): the compute-matched baseline of repair")
    temperature: float | None = meta(None, min=0.0, doc="null: sampling.temperature when samples > 1, else 0")
    batch_size: int | None = meta(None, min=1, doc="completions decoded together (null = sampling.batch_size)")
    seed: int = meta(0, doc="sampling seed of the evaluation")
    prompt_template: str | None = meta(None, choices=(None, *TEMPLATES), doc="null: the config's prompt.template; "
                                       "write for `puzzles stubs` sets (a writing task, not a repair)")


@dataclass(frozen=True)
class Variant:
    """One setting compared: its overrides of the shared config, its seeds and its sets. An
    evaluation-only variant (`adapter:` in the file) trains nothing: it evaluates adapters made
    elsewhere (another experiment's run) or, with `adapter: none`, the base model asked as its
    overrides say (another stop rule, prompt or token limit)."""

    name: str
    overrides: dict[str, Any]
    seeds: tuple[int, ...]
    sets: tuple[str, ...]
    about: str = ""
    trains: bool = True
    adapter: Path | None = None  # an evaluation-only variant's adapter directory (None: the base model)
    soup: int = 0  # > 0: evaluate the mean of the last `soup` adapters `adapter` (a run) kept (train.keep_every)


@dataclass(frozen=True)
class DataStep:
    """One data command as typed after `mlx-swe-rl [puzzles]`, and the paths it writes."""

    command: str  # a data command, or SCRIPT (args: the script's path, then its arguments)
    args: tuple[str, ...]
    outputs: tuple[Path, ...]

    @property
    def argv(self) -> list[str]:
        """The command line below `mlx-swe-rl` (a script's: below `python`)."""
        if self.command == SCRIPT:
            return list(self.args)
        return ([] if self.command in TOP_LEVEL else ["puzzles"]) + [self.command, *self.args]

    def line(self) -> str:
        return ("python " if self.command == SCRIPT else "mlx-swe-rl ") + shlex.join(self.argv)


@dataclass(frozen=True)
class Pair:
    """A variant-minus-variant comparison, paired per seed that both have; an evaluation-only
    variant (one adapter) is compared with every seed of the other side."""

    variant: str
    minus: str

    @property
    def label(self) -> str:
        return f"{self.variant} minus {self.minus}"


@dataclass(frozen=True)
class Experiment:
    path: Path
    name: str
    about: str
    output_dir: Path
    base: Path | None
    overrides: dict[str, Any]
    variants: dict[str, Variant]
    sets: dict[str, EvalSet]
    data: tuple[DataStep, ...]
    pairs: tuple[Pair, ...]

    def run_name(self, variant: str, seed: int) -> str:
        return f"{variant}-s{seed}"

    def shared_config(self) -> Config:
        """The base config with the shared overrides: the base model's evaluations are asked
        with its model, dtype and prompt."""
        return self._config(self.overrides, "overrides")

    def run_config(self, variant: str, seed: int) -> Config:
        """One run's config: base, shared overrides, the variant's, then its seed and place."""
        items = {**self.overrides, **self.variants[variant].overrides, "seed": seed,
                 "output_dir": str(self.output_dir), "run_name": self.run_name(variant, seed)}
        return self._config(items, f"variants.{variant}.overrides")

    def eval_config(self, variant: str) -> Config:
        """An evaluation-only variant's config: how its model is asked (shared overrides, then its own)."""
        return self._config({**self.overrides, **self.variants[variant].overrides}, f"variants.{variant}.overrides")

    def _config(self, items: dict[str, Any], key: str) -> Config:
        try:
            return load_config(self.base, as_assignments(items))
        except ConfigError as exc:
            raise ConfigError(f"{self.path}: {key}: {exc}") from None


def load_experiment(path: Path, read_options: ReadOptions) -> Experiment:
    """Read and check an experiment file: keys, types, every run's full config, the data
    commands' options (`read_options(command, args)`: the options as the command's own parser
    reads them, a ValueError for a bad one; the command line hands its parser in, so this layer
    never imports it); raises ConfigError with one line naming the file and key."""
    path = Path(path)
    data = read_yaml_mapping(path, "a mapping (name, base, overrides, variants, sets, ...)")
    _check_keys(data, TOP_KEYS, "", path)
    name = _string(data.get("name", path.stem), "name", path)
    sets = _sets(data.get("sets"), path)
    seeds = _seeds(data.get("seeds", [0]), "seeds", path)
    variants_data = data.get("variants")
    if not isinstance(variants_data, dict) or not variants_data:
        raise ConfigError(f"{path}: variants: expected a mapping of named variants, e.g. "
                          "{onpolicy: {}, frozen: {overrides: {sampling.mode: frozen}}}")
    variants = {str(k): _variant(str(k), v, seeds, sets, path) for k, v in variants_data.items()}
    experiment = Experiment(
        path=path, name=name, about=_string(data.get("about", ""), "about", path),
        output_dir=Path(_string(data.get("output_dir", f"outputs/{name}"), "output_dir", path)),
        base=_base(data.get("base"), path), overrides=_mapping(data.get("overrides"), "overrides", path),
        variants=variants, sets=sets, data=_data_steps(data.get("data"), path, read_options),
        pairs=_pairs(data.get("pairs"), variants, path))
    for key, items in [("overrides", experiment.overrides),
                       *((f"variants.{v.name}.overrides", v.overrides) for v in variants.values())]:
        for reserved, by in RESERVED.items():
            if reserved in items:
                raise ConfigError(f"{path}: {key}: {reserved}: set by the experiment ({by})")
    experiment.shared_config()
    for variant in variants.values():  # every run's config checked before any runs
        if not variant.trains:
            experiment.eval_config(variant.name)
        for seed in variant.seeds:
            experiment.run_config(variant.name, seed)
    return experiment


def _check_keys(data: dict, valid: tuple[str, ...], prefix: str, path: Path) -> None:
    for key in data:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f"did you mean '{prefix}{close[0]}'?" if close else f"valid: {', '.join(valid)}"
            raise ConfigError(f"{path}: {prefix}{key}: unknown key ({hint})")


def _string(value: Any, key: str, path: Path) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{path}: {key}: expected a string, got {value!r}")
    return value


def _mapping(value: Any, key: str, path: Path) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {key}: expected a mapping of key.sub: value, got {value!r}")
    return {str(k): v for k, v in value.items()}


def _seeds(value: Any, key: str, path: Path) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if (not isinstance(value, list) or not value
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in value)):
        raise ConfigError(f"{path}: {key}: expected a list of integer seeds, got {value!r}")
    if len(set(value)) != len(value):
        raise ConfigError(f"{path}: {key}: seed {next(s for s in value if value.count(s) > 1)} is listed twice")
    return tuple(value)


def _base(value: Any, path: Path) -> Path | None:
    if value is None:
        return None
    given = Path(_string(value, "base", path))
    found = given if given.is_file() else path.parent / given
    if not found.is_file():
        raise ConfigError(f"{path}: base: no such config file '{value}'")
    return found


def _sets(value: Any, path: Path) -> dict[str, EvalSet]:
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"{path}: sets: expected a mapping of named evaluation sets, e.g. "
                          "{train: {puzzles: FILE.json, samples: 8}}")
    sets = {}
    for name, body in value.items():
        try:
            sets[str(name)] = from_dict(EvalSet, {} if body is None else body, f"sets.{name}")
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    return sets


def _variant(name: str, body: Any, seeds: tuple[int, ...], sets: dict[str, EvalSet], path: Path) -> Variant:
    key = f"variants.{name}"
    body = {} if body is None else body
    if not isinstance(body, dict):
        raise ConfigError(f"{path}: {key}: expected a mapping (overrides, seeds, sets, about), got {body!r}")
    _check_keys(body, VARIANT_KEYS, f"{key}.", path)
    chosen = body.get("sets", list(sets))
    if not isinstance(chosen, list) or not all(isinstance(s, str) for s in chosen):
        raise ConfigError(f"{path}: {key}.sets: expected a list of set names, got {chosen!r}")
    for s in chosen:
        if s not in sets:
            raise ConfigError(f"{path}: {key}.sets: '{s}' is not a set of this file (sets: {', '.join(sets)})")
    overrides = _mapping(body.get("overrides"), f"{key}.overrides", path)
    about = _string(body.get("about", ""), f"{key}.about", path)
    if "soup" in body and "adapter" not in body:
        raise ConfigError(f"{path}: {key}.soup: only with adapter (the run whose kept adapters it averages)")
    if "adapter" in body:  # evaluation only: one evaluation per set, no seeds
        if name == BASE:  # its files would be the base model's own
            raise ConfigError(f"{path}: {key}: '{BASE}' names the base model's evaluations; choose another name")
        if "seeds" in body:
            raise ConfigError(f"{path}: {key}.seeds: an evaluation-only variant (adapter) trains no seeds")
        adapter = body["adapter"]
        if adapter is not None and not isinstance(adapter, str):
            raise ConfigError(f"{path}: {key}.adapter: expected an adapter directory or none, got {adapter!r}")
        adapter = None if adapter in (None, NO_ADAPTER) else Path(adapter)
        soup = body.get("soup", 0)
        if soup and (not isinstance(soup, int) or isinstance(soup, bool) or soup < 2 or adapter is None):
            raise ConfigError(f"{path}: {key}.soup: expected a number of kept adapters (2 or more) of the run "
                              f"named by adapter, got {soup!r}")
        return Variant(name, overrides, (), tuple(chosen), about, trains=False, adapter=adapter, soup=soup)
    return Variant(name, overrides, _seeds(body["seeds"], f"{key}.seeds", path) if "seeds" in body else seeds,
                   tuple(chosen), about)


def _data_steps(value: Any, path: Path, read_options: ReadOptions) -> tuple[DataStep, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(f"{path}: data: expected a list of steps, e.g. [{{sample: DIR -n 40 --out FILE}}]")
    return tuple(_data_step(i, step, path, read_options) for i, step in enumerate(value))


def _data_step(index: int, step: Any, path: Path, read_options: ReadOptions) -> DataStep:
    key = f"data[{index}]"
    if isinstance(step, dict) and SCRIPT in step:
        return _script_step(key, step, path)
    if not isinstance(step, dict) or len(step) != 1:
        raise ConfigError(f"{path}: {key}: expected one command and its arguments, e.g. {{forge: --out DIR}}")
    command, args = next(iter(step.items()))
    if command not in DATA_COMMANDS:
        kinds = (*DATA_COMMANDS, SCRIPT)
        close = difflib.get_close_matches(str(command), kinds, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"valid: {', '.join(kinds)}"
        raise ConfigError(f"{path}: {key}.{command}: unknown data command ({hint})")
    args = _split_args(args, f"{key}.{command}", path)
    try:
        params = read_options(command, args)
    except ValueError as exc:
        raise ConfigError(f"{path}: {key}.{command}: {exc}") from None
    outputs = tuple(Path(params[o]) for o in DATA_COMMANDS[command] if params.get(o) is not None)
    return DataStep(command, tuple(args), outputs)


def _split_args(value: Any, key: str, path: Path) -> list[str]:
    """Arguments as a string (split as a shell would) or a list."""
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as exc:
            raise ConfigError(f"{path}: {key}: cannot split the arguments ({exc})") from None
    if not isinstance(value, list):
        raise ConfigError(f"{path}: {key}: expected the arguments as a string or a list, got {value!r}")
    return [str(a) for a in value]


def _script_step(key: str, step: dict, path: Path) -> DataStep:
    """`{script: scripts/X.py ARGS, outputs: [PATH, ...]}`: a committed Python script, run with
    this Python; its options are its own, so the file names what it writes (kept when all exist)."""
    _check_keys(step, SCRIPT_KEYS, f"{key}.", path)
    argv = _split_args(step[SCRIPT], f"{key}.script", path)
    if not argv or not argv[0].endswith(".py") or not Path(argv[0]).is_file():
        raise ConfigError(f"{path}: {key}.script: expected a Python script of this repository and its arguments, "
                          f"got {step[SCRIPT]!r}")
    outputs = step.get("outputs")
    if not isinstance(outputs, list) or not outputs or not all(isinstance(o, str) for o in outputs):
        raise ConfigError(f"{path}: {key}.outputs: expected the list of paths the script writes, got {outputs!r}")
    return DataStep(SCRIPT, tuple(argv), tuple(Path(o) for o in outputs))


def _pairs(value: Any, variants: dict[str, Variant], path: Path) -> tuple[Pair, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(f"{path}: pairs: expected a list of {{variant: A, minus: B}}")
    pairs = []
    for i, body in enumerate(value):
        key = f"pairs[{i}]"
        if not isinstance(body, dict):
            raise ConfigError(f"{path}: {key}: expected {{variant: A, minus: B}}, got {body!r}")
        _check_keys(body, PAIR_KEYS, f"{key}.", path)
        for field_name in PAIR_KEYS:
            if body.get(field_name) not in variants:
                raise ConfigError(f"{path}: {key}.{field_name}: {body.get(field_name)!r} is not a variant "
                                  f"({', '.join(variants)})")
        if body["variant"] == body["minus"]:
            raise ConfigError(f"{path}: {key}: a variant minus itself is no comparison")
        pairs.append(Pair(body["variant"], body["minus"]))
    return tuple(pairs)
