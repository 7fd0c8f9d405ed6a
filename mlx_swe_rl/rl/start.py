"""Where a training run starts, built before its loop: the environments it samples and is
evaluated in (with the one sandboxed scorer they share), and the step, pass rates, history and
token total it continues from (a new run: step 0).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import mlx.optimizers as optim

from . import distributed as dist
from .config import Config
from .passrates import PASSRATES_FILE, PassRates, restore
from .policy import Policy
from ..puzzles.format import Puzzle
from ..puzzles.trainset import CALIBRATION_FILE
from ..runfiles import StepRecord, read_steps, write_json_atomic
from .rundir import resume_from


@dataclass(frozen=True)
class Environments:
    """The training environment and the evaluations' (the same one unless the evaluations
    answer another number of turns)."""

    train: Any
    eval: Any


@contextmanager
def environments(cfg: Config, puzzles: list[Puzzle], env: Any, log: Callable[[str], None]) -> Iterator[Environments]:
    """Sandboxed CodeFixEnvs over `puzzles` (training and evaluation ones), sharing one scorer
    that is closed on the way out; `env` given (tests: synthetic rewards), it serves both."""
    if env is not None:
        yield Environments(env, env)
        return
    from ..env.codefix import CodeFixEnv
    from ..sandbox.scorer import Scorer

    scorer = Scorer(cfg.workers, confinement=cfg.sandbox.confinement, require_confinement=cfg.sandbox.require_confinement)
    log(f"sandbox: {scorer.confinement}")
    try:
        every = list({p.id: p for p in puzzles}.values())

        def codefix(turns: int | None) -> CodeFixEnv:
            return CodeFixEnv(every, scorer, cfg.reward, cfg.prompt.format, cfg.reward_without_tests,
                              cfg.multi_turn.split(turns), cfg.prompt.style())

        train = codefix(None)
        # evaluations with another number of turns score with their own split (one scorer)
        same = cfg.multi_turn.split(cfg.eval_turns) == train.split
        yield Environments(train, train if same else codefix(cfg.eval_turns))
    finally:
        scorer.close()  # the envs were handed it, so they leave it open


@dataclass
class Start:
    """What the loop continues from: the last step done (0 for a new run), the pass rates
    after it (rank 0's, on every rank), the history up to it (rank 0 only: the alarms read it)
    and the model tokens sampled up to it."""

    step: int
    rates: PassRates
    seen: list[StepRecord]
    tokens_total: int


def starting_point(cfg: Config, policy: Policy, optimizer: optim.Optimizer, checkpoint: Path | None,
                   puzzles: list[Puzzle], resume: bool, log: Callable[[str], None]) -> Start:
    """Load the checkpoint a resumed run continues from, restore its pass rates and read its
    history (rank 0), then give every rank the same weights, step and pass rates."""
    main, run_dir = dist.is_main(), cfg.run_dir
    step = resume_from(run_dir, checkpoint, policy.model, optimizer, log) if resume and main else 0
    # for the alarms and the token total; records of older runs are upgraded as they are read
    seen = read_steps(run_dir, cfg.sampling.group_size, missing_ok=True) if main and step else []
    state = None
    if main:  # the pass rates at the checkpoint's step (the live file may be later: it is not read)
        state = restore(run_dir, checkpoint, step, [p.id for p in puzzles], cfg.train.pass_rate_decay,
                        run_dir / CALIBRATION_FILE).to_json()
        write_json_atomic(run_dir / PASSRATES_FILE, state)
    step = dist.sync_ranks(policy.model, optimizer, step)
    rates = PassRates.from_json(dist.all_gather_json(state)[0])
    tokens_total = int(dist.broadcast({"tokens": sum(h.sampled_tokens for h in seen)})["tokens"])
    if cfg.train.order == "learnable" and cfg.train.puzzles_per_step > len(puzzles):
        log(f"train.order=learnable: {len(puzzles)} training puzzles, fewer than train.puzzles_per_step="
            f"{cfg.train.puzzles_per_step}: each step samples every puzzle once")
    return Start(step, rates, seen, tokens_total)
