"""What a training run reports after each step, in one place: the alarms, the step logs
(history.jsonl, rollouts.jsonl), the live pass rates, checkpoints and the progress bar.

Data-parallel, these are rank 0's duties alone: the other ranks get a `Reporter` that writes
and prints nothing (`Reporter.quiet`), so the loop in `trainer.train` has no rank branches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import mlx.optimizers as optim

from . import alarms
from .config import Config
from .passrates import PASSRATES_FILE, PassRates
from ..runfiles import HISTORY, ROLLOUTS, StepRecord, append_jsonl, write_json_atomic
from .rundir import keep_adapter, save_checkpoint


@dataclass
class Reporter:
    """Rank 0's side of the loop. `seen` is the run's history so far (the records of the steps
    before a resume too): the alarms read it whole. `main` False: every method does nothing."""

    cfg: Config
    model: Any
    optimizer: optim.Optimizer
    seen: list[StepRecord] = field(default_factory=list)
    log: Callable[[str], None] = print
    progress: bool = False
    main: bool = True

    def __post_init__(self) -> None:
        self.bar = None
        self.run_dir: Path = self.cfg.run_dir

    @classmethod
    def quiet(cls, cfg: Config, model: Any, optimizer: optim.Optimizer) -> Reporter:
        """The reporter of a rank other than 0: it writes and prints nothing."""
        return cls(cfg, model, optimizer, log=_quiet, main=False)

    def start(self, start_step: int) -> None:
        """Before the first step of this process: the progress bar from `start_step` on."""
        if self.main and self.progress:
            self.bar = _step_bar(self.cfg.train.steps, start_step)

    def step(self, record: StepRecord, episodes: list[dict[str, Any]], rates: PassRates) -> None:
        """After a step: the alarms (which may add to `record`), then its history line, its
        episodes' rollouts.jsonl lines and the pass rates they moved."""
        if not self.main:
            return
        self.seen.append(record)
        alarms.sound_alarms(self.seen, self.model, self.cfg, self.run_dir, self.log)
        append_jsonl(self.run_dir / HISTORY, [record.to_json()])
        append_jsonl(self.run_dir / ROLLOUTS, episodes)
        write_json_atomic(self.run_dir / PASSRATES_FILE, rates.to_json())

    def checkpoint(self, step: int, rates: PassRates) -> None:
        """A checkpoint (with the pass rates at `step`) when `train.save_every`, `train.keep_every`
        or the last step says so; a copy of its adapter is kept when `train.keep_every` says so."""
        t = self.cfg.train
        keep = t.keep_every > 0 and step % t.keep_every == 0
        if self.main and (step % t.save_every == 0 or step == t.steps or keep):
            save_checkpoint(self.run_dir, self.model, self.cfg, self.optimizer, step,
                            {PASSRATES_FILE: rates.to_json()})
            if keep:
                keep_adapter(self.run_dir, step)

    def stepped(self, record: StepRecord) -> None:
        """The progress bar moves on by one step, showing `record`'s numbers."""
        if self.bar is not None:
            self.bar.set_postfix(reward=f"{record.reward_mean:.2f}", solved=f"{record.solve_rate:.2f}",
                                 kl=f"{record.kl or 0:.3f}", s=f"{record.step_s:.0f}", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        """After the last step."""
        if self.bar is not None:
            self.bar.close()


def _quiet(_: str) -> None:
    pass


def _step_bar(total: int, done: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, desc="GRPO", unit="step", dynamic_ncols=True)
