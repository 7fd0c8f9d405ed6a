"""Per-puzzle pass-rate estimates, and the choice of each step's puzzles (`train.order`).

A GRPO group whose G answers all pass or all fail has zero advantage and gives no gradient;
in committed runs a third to a half of the groups of a step were like that. What a puzzle can
teach now is its pass rate p under the current policy: a group of it is mixed with probability
1 - p^G - (1-p)^G, highest near p = 0.5. So the trainer keeps an estimate of p per puzzle from
every scored rollout, a Beta(alpha, beta) posterior over binary outcomes (`rollout.solved`, not
the shaped reward), seeded by the run's calibration when it has one.

Two orders read it (`choose`):
  epoch      a seeded permutation of the puzzles per epoch, cut into steps (`step_puzzles`;
             the estimates are kept and shown, never read: the default, unchanged);
  learnable  Thompson-style: every step draws p from each puzzle's posterior and takes the
             puzzles whose p(1 - p) is largest. A puzzle measured all-solved or never-solved
             is rarely drawn near 0.5, a mixed one often, an unmeasured one now and then.

The policy changes as it trains, so old outcomes say less about p than new ones: every step
each puzzle's counts beyond the prior are multiplied by `decay`. An estimate that is not
refreshed drifts back toward the prior, its posterior widens, and Thompson draws reach p near
0.5 again: no puzzle is left out forever on one bad measurement.

The state is a pure function of the calibration and the rollouts of steps 1..k, and the
choice of step k + 1 a pure function of that state, the seed and the step, so a resumed run
(which restores the state saved with its checkpoint) chooses what the uninterrupted run did.
This module reads no model and imports no MLX (`watch` shows the state through `rows`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence, TypeVar

import numpy as np

from ..runfiles import ROLLOUTS, read_jsonl

if TYPE_CHECKING:
    from .config import Config

PASSRATES_FILE = "passrates.json"  # in the run directory (after every step) and in each checkpoint
PRIOR = (1.0, 1.0)  # Beta(1, 1): uniform, what a puzzle nobody measured gets
# Tags of the numpy seed sequences, so these draws never repeat step_puzzles' [seed, epoch].
_LEARNABLE_TAG, _SPARE_TAG = 1, 2

T = TypeVar("T")  # a puzzle: anything with an `id`


class PassRateError(ValueError):
    """A pass-rate file that cannot be read, or a state updated out of step order."""


@dataclass
class PassRates:
    """Beta(alpha, beta) per puzzle id over binary outcomes, after `step` training steps.

    `last_step[id]` is the last step that sampled the puzzle (0: never during training), so a
    reader can tell a fresh estimate from a stale one.
    """

    alpha: dict[str, float] = field(default_factory=dict)
    beta: dict[str, float] = field(default_factory=dict)
    last_step: dict[str, int] = field(default_factory=dict)
    decay: float = 1.0
    step: int = 0

    @classmethod
    def start(cls, puzzle_ids: Iterable[str], decay: float,
              calibration: dict[str, Any] | None = None) -> PassRates:
        """The prior for every puzzle, plus its calibration outcomes when the run has a
        calibration report (calibration.json: rows with `id`, `solved`, `samples`)."""
        ids = list(dict.fromkeys(puzzle_ids))
        rates = cls({pid: PRIOR[0] for pid in ids}, {pid: PRIOR[1] for pid in ids}, dict.fromkeys(ids, 0), decay)
        for row in (calibration or {}).get("puzzles") or []:
            if row.get("id") in rates.alpha:
                rates.alpha[row["id"]] += row["solved"]
                rates.beta[row["id"]] += row["samples"] - row["solved"]
        return rates

    def observe(self, step: int, outcomes: Iterable[dict[str, Any]]) -> None:
        """Step `step`'s scored rollouts (rollouts.jsonl lines: `puzzle_id`, `solved`, `error`):
        first every estimate fades by `decay`, then each outcome adds one count. An error
        verdict (the puzzle could not be scored) says nothing about the answer: skipped."""
        if step != self.step + 1:
            raise PassRateError(f"pass rates after step {self.step} cannot take step {step}'s rollouts")
        for pid in self.alpha:
            self.alpha[pid] = PRIOR[0] + self.decay * (self.alpha[pid] - PRIOR[0])
            self.beta[pid] = PRIOR[1] + self.decay * (self.beta[pid] - PRIOR[1])
        for line in outcomes:
            pid = line["puzzle_id"]
            if line.get("error"):
                continue
            if pid not in self.alpha:  # a puzzle outside the set it started with: from the prior
                self.alpha[pid], self.beta[pid] = PRIOR
            if line["solved"]:
                self.alpha[pid] += 1.0
            else:
                self.beta[pid] += 1.0
            self.last_step[pid] = step
        self.step = step

    def mean(self, pid: str) -> float:
        a, b = self.alpha.get(pid, PRIOR[0]), self.beta.get(pid, PRIOR[1])
        return a / (a + b)

    def ranking(self, puzzles: Sequence[T], seed: int, step: int) -> list[T]:
        """All `puzzles`, most learnable first: one draw p ~ Beta(alpha, beta) each, from a
        generator seeded by (seed, step), ranked by p(1 - p) (ties: list order)."""
        a = np.array([self.alpha.get(p.id, PRIOR[0]) for p in puzzles])
        b = np.array([self.beta.get(p.id, PRIOR[1]) for p in puzzles])
        drawn = np.random.default_rng([seed, step, _LEARNABLE_TAG]).beta(a, b)
        order = np.argsort(-(drawn * (1.0 - drawn)), kind="stable")
        return [puzzles[i] for i in order]

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "decay": self.decay, "prior": list(PRIOR),
                "puzzles": {pid: {"alpha": self.alpha[pid], "beta": self.beta[pid],
                                  "last_step": self.last_step.get(pid, 0)} for pid in self.alpha}}

    @classmethod
    def from_json(cls, data: Any) -> PassRates:
        try:
            rows = data["puzzles"]
            return cls({pid: float(r["alpha"]) for pid, r in rows.items()},
                       {pid: float(r["beta"]) for pid, r in rows.items()},
                       {pid: int(r.get("last_step", 0)) for pid, r in rows.items()},
                       float(data["decay"]), int(data["step"]))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise PassRateError(f"not a pass-rate state ({exc!r})") from None

    def rows(self) -> list[dict[str, Any]]:
        """One row per puzzle for people (`watch`): posterior mean and standard deviation, the
        outcomes it rests on (decayed counts beyond the prior), the last step that sampled it;
        most learnable (mean(1 - mean) largest) first."""
        out = []
        for pid in self.alpha:
            a, b = self.alpha[pid], self.beta[pid]
            mean = a / (a + b)
            out.append({"id": pid, "mean": mean, "sd": math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1))),
                        "outcomes": a + b - sum(PRIOR), "last_step": self.last_step.get(pid, 0)})
        return sorted(out, key=lambda r: (-r["mean"] * (1 - r["mean"]), r["id"]))


# --- the choice of a step's puzzles ------------------------------------------------------------

def step_puzzles(puzzles: list[T], step: int, per_step: int, seed: int) -> list[T]:
    """The puzzles of (1-based) `step`: a stream of per-epoch seeded permutations, cut into
    chunks of `per_step`. A pure function of its arguments, so a resumed run sees the same data."""
    n = len(puzzles)
    chosen = []
    for index in range((step - 1) * per_step, step * per_step):
        epoch, offset = divmod(index, n)
        order = np.random.default_rng([seed, epoch]).permutation(n)
        chosen.append(puzzles[order[offset]])
    return chosen


def choose(cfg: Config, puzzles: list[T], rates: PassRates, step: int) -> tuple[list[T], list[T]]:
    """Step `step`'s puzzles, and (with dynamic sampling on) the spare ones, in the order
    replacements are drawn from, none of them among the first.

    epoch: `step_puzzles`; its spares a permutation seeded by (seed, step) of the rest. With
    dynamic sampling off it draws nothing else, so runs reproduce what they did before.
    learnable: the top `train.puzzles_per_step` of `rates.ranking` (at most one group per
    puzzle a step), the spares the rest of the ranking.
    """
    t = cfg.train
    spare_wanted = t.dynamic_sampling.enabled
    if t.order == "learnable":
        ranked = rates.ranking(puzzles, cfg.seed, step)
        return ranked[:t.puzzles_per_step], ranked[t.puzzles_per_step:] if spare_wanted else []
    chosen = step_puzzles(puzzles, step, t.puzzles_per_step, cfg.seed)
    if not spare_wanted:
        return chosen, []
    taken = {p.id for p in chosen}
    order = np.random.default_rng([cfg.seed, step, _SPARE_TAG]).permutation(len(puzzles))
    return chosen, [puzzles[i] for i in order if puzzles[i].id not in taken]


# --- in the run directory ----------------------------------------------------------------------

def restore(run_dir: Path, checkpoint: Path | None, step: int, puzzle_ids: list[str], decay: float,
            calibration: Path) -> PassRates:
    """The state after `step`: a fresh one (step 0), the one saved with the checkpoint, or for a
    checkpoint written before pass rates existed, the calibration's replayed with the rollouts
    of steps 1..`step` (rollouts.jsonl, already cut back to the checkpoint)."""
    if step and checkpoint is not None and (checkpoint / PASSRATES_FILE).is_file():
        try:
            return PassRates.from_json(json.loads((checkpoint / PASSRATES_FILE).read_text()))
        except ValueError as exc:
            raise PassRateError(f"{checkpoint / PASSRATES_FILE}: {exc}") from None
    report = json.loads(calibration.read_text()) if calibration.is_file() else None
    rates = PassRates.start(puzzle_ids, decay, report)
    if step:
        lines = read_jsonl(run_dir / ROLLOUTS) if (run_dir / ROLLOUTS).is_file() else []
        for s in range(1, step + 1):
            rates.observe(s, [line for line in lines if line.get("step") == s])
    return rates
