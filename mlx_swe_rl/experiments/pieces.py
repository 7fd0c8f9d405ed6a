"""An experiment broken into pieces, each kept on disk when done, so a rerun skips it: the data
steps (done when their outputs exist), the training runs (done when the last checkpoint is the
final step; a started one resumes from its checkpoint) and the evaluations (done when their
report exists; reports are written atomically, so a killed one leaves nothing).

Evaluation files keep the drivers' names: OUTPUT_DIR/eval-RUN-SET.json, the untrained model's
as eval-base-SET.json (paired with every run asked the same way), an evaluation-only variant's
as eval-VARIANT-SET.json (paired with the shared config's base evaluation: what it compares is
the adapter or the way of asking).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from ..rl.config import Config, ConfigError, SamplingPlan
from .spec import BASE, DataStep, EvalSet, Experiment


@dataclass(frozen=True)
class DataPiece:
    """A data command, run once; done when every path it writes exists."""

    step: DataStep

    @property
    def name(self) -> str:
        return self.step.line()

    def done(self) -> bool:
        return all(p.exists() for p in self.step.outputs)

    def state(self) -> str:
        return "kept" if self.done() else "to make"


@dataclass(frozen=True)
class RunPiece:
    """One variant at one seed: a training run through the trainer, in OUTPUT_DIR/VARIANT-sSEED."""

    variant: str
    seed: int
    config: Config

    @property
    def name(self) -> str:
        return self.config.run_name

    @property
    def run_dir(self) -> Path:
        return self.config.run_dir

    def steps_saved(self) -> int:
        """The step of the run's newest checkpoint (0 when it has none)."""
        for name in ("checkpoint", "checkpoint-old"):  # rundir.find_checkpoint's order, without importing MLX
            state = self.run_dir / name / "state.json"
            if state.is_file():
                return int(json.loads(state.read_text())["step"])
        return 0

    def started(self) -> bool:
        """Started before: the trainer wrote its config, so it is resumed (from step 0 when it
        was killed before its first checkpoint)."""
        return (self.run_dir / "config.yaml").is_file()

    def done(self) -> bool:
        """Its last checkpoint is the final step, and its own final evaluation (train.final_eval) is written."""
        if self.steps_saved() < self.config.train.steps:
            return False
        return not self.config.train.final_eval or (self.run_dir / "eval-after.json").is_file()

    def calibrated(self) -> tuple[int, int] | None:
        """(puzzles done, puzzles in all) of its unfinished calibration, or None."""
        from ..puzzles.trainset import CALIBRATION_FILE
        from ..rl.journal import journal_path, progress

        return progress(journal_path(self.run_dir / CALIBRATION_FILE))

    def holder(self) -> str | None:
        """Who trains the run now ("pid N on HOST"), or None."""
        from ..runfiles import run_holder

        return run_holder(self.run_dir)

    def state(self) -> str:
        if self.done():
            return "kept"
        calibrated = self.calibrated()
        if holder := self.holder():
            if calibrated:
                return f"calibrating now ({holder}), {calibrated[0]} of {calibrated[1]} puzzles done"
            return f"training now ({holder}), step {self.steps_saved()} of {self.config.train.steps} saved"
        if self.started():
            if calibrated:
                return f"resumes its calibration ({calibrated[0]} of {calibrated[1]} puzzles done)"
            return f"resumes after step {self.steps_saved()} of {self.config.train.steps}"
        return f"to train ({self.config.train.steps} steps)"


@dataclass(frozen=True)
class EvalPiece:
    """One model (the base model, or a run's adapters) evaluated on one set."""

    model: str  # BASE (or base-VARIANT), a run's name, or an evaluation-only variant's
    set_name: str
    eval_set: EvalSet
    config: Config  # the model, dtype, prompt and sampling defaults it is asked with
    adapter: Path | None
    out: Path
    baseline: Path | None  # the base model's evaluation of the same set, asked the same way
    elsewhere: bool = False  # its adapters are made outside this experiment (an evaluation-only variant's)
    soup: tuple[Path, int] | None = None  # (run, K): `adapter` is made as the mean of the run's last K kept adapters

    @property
    def name(self) -> str:
        return f"eval {self.model} on {self.set_name}"

    @property
    def asked(self) -> Config:
        """The config it is asked with: its own, with the set's question wording if it names one."""
        template = self.eval_set.prompt_template
        if template is None or template == self.config.prompt.template:
            return self.config
        return dataclasses.replace(self.config, prompt=dataclasses.replace(self.config.prompt, template=template))

    def done(self) -> bool:
        return self.out.is_file()

    @property
    def journalled(self) -> bool:
        """Whether it records each puzzle as it finishes, so a killed one resumes (single-turn sets)."""
        return self.eval_set.turns == 1

    def evaluated(self) -> tuple[int, int] | None:
        """(puzzles done, puzzles in all) of its unfinished evaluation, or None."""
        from ..rl.journal import journal_path, progress

        return progress(journal_path(self.out)) if self.journalled else None

    def state(self) -> str:
        if self.done():
            return "kept"
        if (evaluated := self.evaluated()) and evaluated[0]:
            return f"resumes its evaluation (K = {self.eval_set.samples}, {evaluated[0]} of {evaluated[1]} puzzles done)"
        waits = self.elsewhere and self.adapter is not None and not self.adapter.is_dir()
        needs = f"; needs {self.adapter}, not there yet" if waits else ""
        if waits and self.soup is not None:
            needs = f"; needs the last {self.soup[1]} adapters {self.soup[0]} keeps (made into {self.adapter})"
        return f"to evaluate (K = {self.eval_set.samples}){needs}"

    def puzzles(self) -> list:
        """The set's puzzles (PuzzleError, TrainSetError while its file is still to be made)."""
        from ..puzzles.trainset import load_selection

        s = self.eval_set
        return load_selection(Path(s.puzzles) if s.puzzles else None, s.tiers, s.split)

    def plan(self) -> SamplingPlan:
        """How it samples: the set's settings, the config's where the set leaves them unset."""
        s, sampling = self.eval_set, self.config.sampling
        temperature = s.temperature if s.temperature is not None else (sampling.temperature if s.samples > 1 else 0.0)
        return SamplingPlan(s.samples, temperature, s.max_tokens or sampling.max_tokens, seed=s.seed,
                            batch_size=s.batch_size or sampling.batch_size,
                            stop_after_answer=sampling.stop_after_answer, max_turns=s.turns)


Piece = Union[DataPiece, RunPiece, EvalPiece]


def asked_as(cfg: Config, eval_set: EvalSet) -> str:
    """What an evaluation of `cfg`'s model on `eval_set` depends on besides the adapters (model,
    dtype, prompt, test split, sampling): runs that give the same share the base model's."""
    piece = EvalPiece(BASE, "", eval_set, cfg, None, Path(), None)
    split = cfg.multi_turn.split(eval_set.turns)
    return json.dumps([dataclasses.asdict(cfg.model), dataclasses.asdict(piece.asked.prompt),
                       dataclasses.asdict(split) if split else None, dataclasses.asdict(piece.plan())])


def plan_pieces(experiment: Experiment, only: tuple[str, ...] = (), seeds: tuple[int, ...] = ()) -> list[Piece]:
    """Every piece in the order it runs: data steps, training runs, then evaluations (the base
    model's first). `only` and `seeds` keep some variants and seeds (with the data and the base
    evaluations they need; `seeds` leaves evaluation-only variants in); a name or seed that
    matches nothing is a ConfigError."""
    for name in only:
        if name not in experiment.variants:
            raise ConfigError(f"--only: '{name}' is not a variant of {experiment.path} "
                              f"({', '.join(experiment.variants)})")
    variants = [v for v in experiment.variants.values() if not only or v.name in only]
    runs = [RunPiece(v.name, seed, experiment.run_config(v.name, seed))
            for v in variants for seed in v.seeds if not seeds or seed in seeds]
    evaluated = [v for v in variants if not v.trains]
    if not runs and (seeds or not evaluated):
        raise ConfigError(f"--seeds: none of {', '.join(map(str, seeds))} is a seed of the chosen variants")
    shared = experiment.shared_config()
    bases: dict[str, EvalPiece] = {}  # set and asked_as -> the base model's evaluation of it, asked that way
    evals: list[EvalPiece] = []
    for run in runs:
        for set_name in experiment.variants[run.variant].sets:
            eval_set = experiment.sets[set_name]
            key = f"{set_name} {asked_as(run.config, eval_set)}"
            if key not in bases:  # another model, prompt or sampling than the shared config's: its own
                own = key != f"{set_name} {asked_as(shared, eval_set)}"
                name = f"{BASE}-{run.variant}" if own else BASE
                bases[key] = EvalPiece(name, set_name, eval_set, run.config if own else shared, None,
                                       eval_path(experiment, name, set_name), None)
            evals.append(EvalPiece(run.name, set_name, eval_set, run.config, run.run_dir,
                                   eval_path(experiment, run.name, set_name), bases[key].out))
    for variant in evaluated:
        cfg = experiment.eval_config(variant.name)
        for set_name in variant.sets:
            eval_set = experiment.sets[set_name]
            key = f"{set_name} {asked_as(shared, eval_set)}"
            if key not in bases:
                bases[key] = EvalPiece(BASE, set_name, eval_set, shared, None, eval_path(experiment, BASE, set_name),
                                       None)
            if variant.adapter is None and asked_as(cfg, eval_set) == asked_as(shared, eval_set):
                continue  # the base model asked as the base evaluation asks it: that evaluation itself
            adapter = soup_path(experiment, variant.name) if variant.soup else variant.adapter
            soup = (variant.adapter, variant.soup) if variant.soup else None
            evals.append(EvalPiece(variant.name, set_name, eval_set, cfg, adapter,
                                   eval_path(experiment, variant.name, set_name), bases[key].out, elsewhere=True,
                                   soup=soup))
    return [*(DataPiece(step) for step in experiment.data), *runs, *bases.values(), *evals]


def reads(piece: Piece) -> list[Path]:
    """The puzzle files a piece reads that the experiment itself may make: a run's train set, an
    evaluation set's puzzles."""
    if isinstance(piece, RunPiece):
        return [Path(piece.config.puzzles.train_set)] if piece.config.puzzles.train_set else []
    if isinstance(piece, EvalPiece):
        return [Path(piece.eval_set.puzzles)] if piece.eval_set.puzzles else []
    return []


def writes(piece: Piece) -> list[Path]:
    """What a piece makes that others may read: a data step's outputs, and the train set a
    calibrating run (puzzles.select=mixed) chooses before its first step."""
    from ..puzzles.trainset import TRAIN_SET_FILE

    if isinstance(piece, DataPiece):
        return list(piece.step.outputs)
    if isinstance(piece, RunPiece) and piece.config.puzzles.select == "mixed":
        return [piece.run_dir / TRAIN_SET_FILE]
    return []


def missing_inputs(pieces: list[Piece], every: list[Piece]) -> list[str]:
    """One line per file that a piece still to do reads, that is not there and that no earlier
    piece of this sitting makes (`pieces`, the chosen ones, out of `every`): said before anything
    runs, rather than as a failure hours in, naming the piece of the experiment that makes it."""
    def made(path: Path, by: list[Piece]) -> Piece | None:
        target = path.resolve()
        return next((p for p in by for out in writes(p)
                     if target == out.resolve() or target.is_relative_to(out.resolve())), None)

    problems: list[str] = []
    for i, piece in enumerate(pieces):
        if piece.done() or (isinstance(piece, RunPiece) and piece.started()):
            continue  # a started run has read its puzzles already
        for path in reads(piece):
            if path.exists() or made(path, pieces[:i]):
                continue
            maker = made(path, every)
            if maker is None:
                how = "and no piece of this experiment makes it"
            elif maker in pieces:
                how = f"and {maker.name}, which makes it, comes later: put its variant first in the file"
            else:
                how = (f"which {maker.name} writes when it calibrates, before its first step: run its variant "
                       f"too (--only {maker.variant})")
            problems.append(f"{piece.name} reads {path}, not there yet, {how}")
    return problems


def soup_path(experiment: Experiment, variant: str) -> Path:
    """Where a soup variant's adapter is made (once, before its first evaluation)."""
    return experiment.output_dir / f"{variant}-adapter"


def eval_path(experiment: Experiment, model: str, set_name: str) -> Path:
    return experiment.output_dir / f"eval-{model}-{set_name}.json"
