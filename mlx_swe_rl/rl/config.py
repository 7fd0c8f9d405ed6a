"""Training configuration: YAML -> validated dataclasses, with `--set key.sub=value` overrides.

Every field's allowed values live next to it (`meta`), so the loader can name the offending key,
suggest the closest valid one, and check types and ranges with one generic routine.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..env.feedback import TestSplit
from ..env.formats import FORMATS
from ..env.prompts import SYSTEM_MESSAGES, TEMPLATES, PromptStyle
from ..env.rewards import DEFAULT_REWARD, DEFAULT_REWARD_WITHOUT_TESTS, validate_weights
from ..models.specs import DTYPE_CHOICES, resolve_dtype
from ..sandbox.confine import MODES as CONFINEMENT_MODES
from ..sandbox.confine import confinable_platform
from .grpo import ADVANTAGE_METHODS, AGGREGATIONS, RATIO_LEVELS


FORMAT_NAMES = tuple(FORMATS)
SCIENTIFIC = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


class ConfigError(ValueError):
    """A bad configuration value; the message is one line naming the key."""


def meta(default: Any = dataclasses.MISSING, *, choices: tuple | None = None, min: float | None = None,
         max: float | None = None, doc: str = "", factory: Any = None, without_tests: bool = False) -> Any:
    """A dataclass field with validation metadata and a one-line description (`without_tests`:
    a reward spec for tasks that have no tests)."""
    info = {"choices": choices, "min": min, "max": max, "doc": doc, "without_tests": without_tests}
    if factory is not None:
        return field(default_factory=factory, metadata=info)
    return field(default=default, metadata=info)


@dataclass
class ModelConfig:
    spec: str = meta("smollm2-135m", doc="model spec: HF repo id, mlx-lm dir, .gguf, ollama:NAME, built-in")
    dtype: str = meta("auto", choices=DTYPE_CHOICES, doc="dtype of float weights; auto: float32 on a CPU (MLX's "
                      "only fast CPU dtype), bfloat16 on a GPU (Metal, CUDA)")

    def __post_init__(self) -> None:
        # Resolved once, so the run's config.yaml, the preflight and the model agree on it.
        if self.dtype == "auto":
            self.dtype = resolve_dtype(self.dtype)


@dataclass
class PromptConfig:
    format: str = meta("function", choices=FORMAT_NAMES, doc="answer format: function (the whole fixed function "
                       "in a code block) or search_replace (SWE-RL: think, then SEARCH/REPLACE edits)")
    template: str = meta(PromptStyle().template, choices=tuple(TEMPLATES), doc="wording of the question (function "
                         "format): block (ask for one python block), seed (the seed's: the bare function), find "
                         "(say the code has a bug; find and fix it), write (not repair: write the body of a "
                         "signature, for `puzzles stubs`)")
    system: str = meta(PromptStyle().system, choices=tuple(SYSTEM_MESSAGES), doc="system message: expert (ours) or "
                       "none (the chat template's default)")

    def style(self) -> PromptStyle:
        """The wording and system message as the environment takes them."""
        return PromptStyle(self.template, self.system)


@dataclass
class CalibrationConfig:
    group_size: int | None = meta(None, min=2, doc="completions per puzzle (null = sampling.group_size)")
    temperature: float | None = meta(None, min=0.0, doc="sampling temperature, > 0 (null = sampling.temperature)")
    max_tokens: int | None = meta(None, min=1, doc="new tokens per completion (null = sampling.max_tokens)")
    rounds: int = meta(4, min=1, doc="sample G in this many rounds, stopping a puzzle once it is mixed "
                       "(the same choice, fewer tokens)")


@dataclass
class PuzzleConfig:
    dir: str | None = meta(None, doc="puzzle directory (null = bundled puzzles)")
    train_set: str | None = meta(None, doc="train-set JSON from `rollouts --write-train-set` (overrides tiers)")
    tiers: list[str] | None = meta(None, doc="tiers to train on (null = all)")
    split: str = meta("train", choices=("train", "heldout", "all"), doc="split to train on")
    select: str = meta("all", choices=("all", "mixed"), doc="all: train on every puzzle chosen above; mixed: "
                       "calibrate them with the initial weights first and train on the mixed ones (cached in "
                       "the run directory, reused by --resume)")
    calibration: CalibrationConfig = meta(factory=CalibrationConfig)


@dataclass
class SamplingConfig:
    group_size: int = meta(8, min=2, doc="G: completions per puzzle")
    temperature: float = meta(0.8, min=0.0, doc="sampling temperature")
    top_p: float = meta(1.0, min=0.0, max=1.0, doc="nucleus sampling")
    max_tokens: int = meta(256, min=1, doc="new tokens per completion")
    batch_size: int = meta(32, min=1, doc="completions decoded together")
    stop_after_answer: bool = meta(True, doc="end a completion at the fence closing its first code block that "
                                   "defines the entry point (the answer read; the prose after it is never generated)")
    mode: str = meta("on_policy", choices=("on_policy", "frozen"),
                     doc="on_policy: sample from the policy being trained; frozen: always from the initial weights")


@dataclass(frozen=True)
class SamplingPlan:
    """How one phase samples (a training step, an evaluation, a calibration), resolved once and
    passed whole: `collect_rollouts`, `evaluate`, `calibrate` and the memory preflight read the
    same object, so a default is filled in one place (`Config.train_sampling`, `eval_sampling`,
    `calibration_sampling`; the `eval` and `rollouts` commands build theirs from their options)."""

    group_size: int  # completions (episodes) per puzzle
    temperature: float
    max_tokens: int  # new tokens per answer
    top_p: float = 1.0
    seed: int | None = 0
    batch_size: int = 32  # completions decoded together
    stop_after_answer: bool = True  # end an answer at the fence closing its code block
    max_turns: int = 1  # answers per episode (multi-turn repair when > 1)
    turn_penalty: float = 0.0  # subtracted from an episode's reward per extra turn

    def but(self, **changes: Any) -> "SamplingPlan":
        """This plan with some settings changed."""
        return dataclasses.replace(self, **changes)


@dataclass
class MultiTurnConfig:
    max_turns: int = meta(1, min=1, doc="answers per episode: after a failed one the model reads the public tests' "
                          "feedback and tries again (1 = single-turn, as before)")
    public_tests: float = meta(1, min=0.0, doc="public tests per puzzle (their failures are shown): a count (>= 1) or "
                               "a fraction (< 1); at least one test stays hidden")
    reward_on: str = meta("hidden", choices=("hidden", "all"), doc="tests the reward reads when max_turns > 1")
    feedback: str = meta("detailed", choices=("detailed", "generic"), doc="detailed: the failing public test and its "
                         "outcome; generic: 'the tests failed' only (the ablation)")
    feedback_chars: int = meta(400, min=40, doc="feedback truncated to this many characters")
    turn_penalty: float = meta(0.0, min=0.0, doc="subtracted from an episode's reward per extra turn")

    def split(self, turns: int | None = None) -> TestSplit | None:
        """The env's test split for episodes of `turns` answers (default max_turns); None for
        single-turn ones, where every test counts as before."""
        if (turns or self.max_turns) == 1:
            return None
        return TestSplit(self.public_tests, self.reward_on, self.feedback == "detailed", self.feedback_chars)


@dataclass
class GRPOConfig:
    advantage: str = meta("std", choices=ADVANTAGE_METHODS, doc="std (GRPO), mean (Dr. GRPO), rloo")
    clip_low: float = meta(0.2, min=0.0, max=1.0, doc="eps_low: ratio clipped below at 1 - eps_low")
    clip_high: float = meta(0.2, min=0.0, doc="eps_high: ratio clipped above at 1 + eps_high (DAPO: 0.28)")
    aggregation: str = meta("seq_mean_token_mean", choices=AGGREGATIONS, doc="how token losses are averaged")
    ratio_level: str = meta("token", choices=RATIO_LEVELS, doc="token (GRPO) or sequence (GSPO) ratios")
    beta: float = meta(0.04, min=0.0, doc="KL coefficient (0 skips the reference forward)")
    num_iterations: int = meta(1, min=1, doc="mu: updates per batch of rollouts")
    mask_truncated: bool = meta(False, doc="drop completions that hit max_tokens from the loss")


@dataclass
class LoRAConfig:
    rank: int = meta(8, min=1, doc="LoRA rank")
    scale: float = meta(20.0, min=0.0, doc="LoRA scale (mlx-lm convention)")
    dropout: float = meta(0.0, min=0.0, max=1.0, doc="LoRA dropout")
    num_layers: int = meta(-1, min=-1, doc="last N transformer blocks get adapters (-1 = all); an update runs the "
                           "blocks below once per group, without gradient, for the policy and the reference alike")
    keys: list[str] | None = meta(None, doc="module paths inside a block, e.g. [self_attn.q_proj] (null = all linears)")


@dataclass
class FinetuneConfig:
    mode: str = meta("lora", choices=("lora", "full"), doc="lora: reference = adapters off; full: frozen copy")
    lora: LoRAConfig = meta(factory=LoRAConfig)
    reference_bits: int | None = meta(None, choices=(None, 4, 8), doc="full mode: quantize the frozen reference")


@dataclass
class OptimConfig:
    lr: float = meta(1e-5, min=0.0, doc="peak learning rate (AdamW)")
    warmup_steps: int = meta(0, min=0, doc="linear warm-up steps")
    schedule: str = meta("constant", choices=("constant", "cosine"), doc="after warm-up")
    weight_decay: float = meta(0.0, min=0.0, doc="AdamW weight decay")
    max_grad_norm: float = meta(1.0, min=0.0, doc="gradient-norm clip (0 = off)")


@dataclass
class DynamicSamplingConfig:
    enabled: bool = meta(False, doc="as a step's groups are scored, drop those whose answers all pass or all "
                         "fail (by the binary outcome, not the shaped reward; error verdicts too) and sample "
                         "replacement puzzles in their place, in the same batch (DAPO's dynamic sampling)")
    max_extra_groups: int | None = meta(None, min=1, doc="replacement groups per step at most "
                                        "(null = train.puzzles_per_step)")


@dataclass
class TrainConfig:
    steps: int = meta(20, min=1, doc="optimizer steps")
    puzzles_per_step: int = meta(4, min=1, doc="puzzles per optimizer step")
    order: str = meta("epoch", choices=("epoch", "learnable"), doc="epoch: a seeded permutation of the puzzles per epoch; "
                      "learnable: each step the puzzles whose estimated pass rate p makes p(1-p) largest "
                      "(Thompson draws from the pass-rate estimates, at most one group per puzzle a step)")
    pass_rate_decay: float = meta(0.95, min=0.0, max=1.0, doc="each step, every puzzle's pass-rate estimate "
                                  "keeps this fraction of its earlier outcomes (older ones fade as the policy "
                                  "changes; 1 = keep all)")
    dynamic_sampling: DynamicSamplingConfig = meta(factory=DynamicSamplingConfig)
    micro_batch_size: int = meta(8, min=1, doc="completions of one prompt per forward/backward (bounds memory)")
    save_every: int = meta(5, min=1, doc="checkpoint every N steps (and at the end)")
    keep_every: int = meta(0, min=0, doc="also keep the adapter of every Nth step under kept/step-N/, for a "
                           "`soup` of the last ones (0 = keep none; only the latest checkpoint is kept)")
    eval_every: int = meta(0, min=0, doc="eval every N steps (0 = off)")
    final_eval: bool = meta(True, doc="eval on train and held-out splits before and after")
    eval_tiers: list[str] | None = meta(None, doc="tiers for eval (null = the training tiers)")
    eval_max_tokens: int | None = meta(None, min=1, doc="eval completion length (null = sampling.max_tokens)")
    eval_set: list[str] | None = meta(None, doc="puzzle-set JSON files (puzzles sample, rollouts "
                                      "--write-train-set) to evaluate on, instead of every puzzle of eval_tiers")
    eval_samples: int = meta(1, min=1, doc="completions per puzzle in evals: 1 = greedy; K > 1 = avg@K at "
                             "sampling.temperature, with 95% CIs and the paired change before -> after")
    eval_turns: int | None = meta(None, min=1, doc="answers per episode in evals (null = multi_turn.max_turns)")
    memory_check: bool = meta(True, doc="estimate the run's peak memory before loading the model; stop when it "
                              "exceeds what the device offers (false: skip the check)")


@dataclass
class AlarmConfig:
    """Thresholds of the alarms (alarms.py): one line each, printed once when it trips."""

    enabled: bool = meta(True, doc="print and record alarms for runs that silently stop learning (false: none)")
    zero_var_frac: float = meta(0.8, min=0.0, max=1.0, doc="zero_variance alarm: at least this fraction of "
                                "groups has equal rewards (no signal), alarms.steps steps in a row")
    truncation_rate: float = meta(0.5, min=0.0, max=1.0, doc="truncation alarm: at least this fraction of "
                                  "completions hit sampling.max_tokens, alarms.steps steps in a row")
    steps: int = meta(3, min=1, doc="steps in a row the zero_variance and truncation alarms wait for")
    length_frac: float = meta(0.9, min=0.0, max=1.0, doc="length_limit alarm: the mean completion length, "
                              "fitted by a line over the last alarms.window steps (their mean before), reaches "
                              "this fraction of sampling.max_tokens")
    window: int = meta(5, min=2, doc="steps of the length_limit alarm's line fit")
    kl_max: float = meta(1.0, min=0.0, doc="kl alarm: a step's KL to the reference above this")
    clip_frac_max: float = meta(0.3, min=0.0, max=1.0, doc="clip_frac alarm: a step's fraction of clipped "
                                "ratios above this (grpo.num_iterations > 1)")
    eval_drop: float = meta(0.05, min=0.0, doc="reward_vs_eval alarm: the latest periodic eval's pass@1 fell at "
                            "least this far below the best earlier eval (eval-before included) while the step "
                            "reward rose by alarms.reward_rise")
    reward_rise: float = meta(0.05, min=0.0, doc="reward_vs_eval alarm: the step reward's rise since that best "
                              "eval (a least-squares line) that counts as rising")


@dataclass
class SandboxConfig:
    confinement: str = meta("auto", choices=CONFINEMENT_MODES, doc="how candidate code is confined: auto, "
                            "landlock / namespaces (Linux), seatbelt (macOS), none")
    require_confinement: bool = meta(confinable_platform(), doc="refuse to start where candidate code would "
                                     "run unconfined (default on Linux, macOS)")


@dataclass
class Config:
    run_name: str = meta("run", doc="run directory name under output_dir")
    output_dir: str = meta("outputs", doc="where run directories go")
    seed: int = meta(0, doc="seeds data order, sampling and dropout")
    workers: int | None = meta(None, min=1, doc="sandbox processes (null = one per core)")
    reward: dict[str, float] = meta(factory=lambda: dict(DEFAULT_REWARD), doc="reward name -> weight")
    reward_without_tests: dict[str, float] = meta(factory=lambda: dict(DEFAULT_REWARD_WITHOUT_TESTS), without_tests=True,
                                                  doc="reward of tasks without tests (mined ones): progress, similarity, format")
    model: ModelConfig = meta(factory=ModelConfig)
    prompt: PromptConfig = meta(factory=PromptConfig)
    puzzles: PuzzleConfig = meta(factory=PuzzleConfig)
    sampling: SamplingConfig = meta(factory=SamplingConfig)
    multi_turn: MultiTurnConfig = meta(factory=MultiTurnConfig)
    grpo: GRPOConfig = meta(factory=GRPOConfig)
    finetune: FinetuneConfig = meta(factory=FinetuneConfig)
    optim: OptimConfig = meta(factory=OptimConfig)
    train: TrainConfig = meta(factory=TrainConfig)
    alarms: AlarmConfig = meta(factory=AlarmConfig)
    sandbox: SandboxConfig = meta(factory=SandboxConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name

    @property
    def eval_turns(self) -> int:
        """Answers per episode in the run's evaluations (train.eval_turns, else multi_turn's)."""
        return self.train.eval_turns or self.multi_turn.max_turns

    def train_sampling(self, seed: int | None = None) -> SamplingPlan:
        """A training step's sampling (`seed`: the step's; default the run's)."""
        s, m = self.sampling, self.multi_turn
        return SamplingPlan(s.group_size, s.temperature, s.max_tokens, s.top_p, self.seed if seed is None else seed,
                            s.batch_size, s.stop_after_answer, m.max_turns, m.turn_penalty)

    def eval_sampling(self) -> SamplingPlan:
        """The run's evaluations: greedy with one sample, else avg@K at the sampling temperature."""
        s, t = self.sampling, self.train
        return SamplingPlan(t.eval_samples, 0.0 if t.eval_samples == 1 else s.temperature,
                            t.eval_max_tokens or s.max_tokens, seed=self.seed, batch_size=s.batch_size,
                            stop_after_answer=s.stop_after_answer, max_turns=self.eval_turns)

    def calibration_sampling(self) -> SamplingPlan:
        """The calibration of `puzzles.select: mixed`: puzzles.calibration, its nulls from sampling."""
        c, s = self.puzzles.calibration, self.sampling
        return SamplingPlan(c.group_size or s.group_size, s.temperature if c.temperature is None else c.temperature,
                            c.max_tokens or s.max_tokens, seed=self.seed, batch_size=s.batch_size,
                            stop_after_answer=s.stop_after_answer)


def from_dict(cls: type, data: Any, path: str = "") -> Any:
    """Build dataclass `cls` from a mapping, checking keys, types and ranges."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in data.items():
        name = f"{path}.{key}" if path else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean '{path + '.' if path else ''}{close[0]}'?)" if close else \
                f" (valid: {', '.join(fields)})"
            raise ConfigError(f"{name}: unknown key{hint}")
        values[key] = _convert(hints[key], value, name, fields[key].metadata)
    return cls(**values)


def _convert(hint: Any, value: Any, name: str, info: Any) -> Any:
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, {} if value is None else value, name)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        hint = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        return [_convert(args[0], v, f"{name}[{i}]", {}) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: expected a mapping, got {value!r}")
        try:
            return validate_weights(value, name, without_tests=info.get("without_tests", False))
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    value = _scalar(hint, value, name)
    _check_range(value, name, info or {})
    return value


def _scalar(hint: Any, value: Any, name: str) -> Any:
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, str) and SCIENTIFIC.match(value.strip()):
            value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{name}: unsupported type {hint}")  # pragma: no cover - a bug in this file


def _check_range(value: Any, name: str, info: Any) -> None:
    choices = info.get("choices")
    if choices is not None and value not in choices:
        shown = ", ".join("null" if c is None else str(c) for c in choices)
        close = difflib.get_close_matches(str(value), [str(c) for c in choices if c is not None], n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"{name}: {value!r} is not one of {shown}{hint}")
    low, high = info.get("min"), info.get("max")
    if low is not None and value < low:
        raise ConfigError(f"{name}: {value} is below the minimum {low}")
    if high is not None and value > high:
        raise ConfigError(f"{name}: {value} is above the maximum {high}")


def apply_override(data: dict, assignment: str) -> None:
    """Apply one `key.sub=value` override (the value parsed as YAML) to a raw config mapping."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {assignment!r}: expected key.sub=value")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: cannot parse value {raw!r}") from exc
    node = data
    parts = key.strip().split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key}: '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def as_assignments(items: dict[str, Any]) -> list[str]:
    """`key.sub: value` pairs (a comparison's or an experiment's overrides) as `--set key.sub=value`
    assignments for `load_config` (JSON is YAML, so every value reads back as written)."""
    return [f"{k}={json.dumps(v)}" for k, v in items.items()]


def read_yaml_mapping(path: Path, what: str = "a mapping") -> dict[str, Any]:
    """A YAML file that must hold a mapping; errors are one line naming the file."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected {what}")
    return data


def load_config(path: Path | None, overrides: list[str] = ()) -> Config:
    """Read a YAML config (None = all defaults), apply overrides, and validate."""
    data = read_yaml_mapping(path, "a mapping of config sections") if path is not None else {}
    for assignment in overrides:
        apply_override(data, assignment)
    try:
        return from_dict(Config, data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}" if path is not None else str(exc)) from None


def to_dict(config: Config) -> dict[str, Any]:
    """The resolved config as plain data (saved in the run directory)."""
    return dataclasses.asdict(config)


def describe(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, doc) for every leaf key, for the README's configuration reference."""
    rows = []
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        hint = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(hint):
            rows += describe(hint, name + ".")
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        rows.append((name, yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("\n..."),
                     f.metadata.get("doc", "")))
    return rows
