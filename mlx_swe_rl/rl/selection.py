"""Training puzzles chosen by calibration inside `train` (`puzzles.select: mixed`).

Only "mixed" puzzles (some of G samples pass, some fail) give GRPO a signal, and which puzzles
are mixed depends on the model. With `select: mixed` the trainer calibrates the puzzles the
puzzles section chooses with the policy's initial weights (LoRA's B matrices start at zero, so
that is the base model) before training, and trains on the mixed ones. The calibration report
and the chosen set are written to the run directory (calibration.json, train-set.json); a
resumed run reads them back and never calibrates again, so its data order is the one it began
with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from . import distributed as dist
from .calibration import calibrate, journal_header
from .journal import Journal, JournalError, journal_path
from .config import Config
from ..puzzles.format import Puzzle
from ..puzzles.trainset import (CALIBRATION_FILE, TRAIN_SET_FILE, TrainSetError, load_train_set, of_category,
                                source_directory, write_train_set)
from ..runfiles import write_json_atomic
from .rollouts import MIXED


class SelectionError(RuntimeError):
    """No puzzle to train on, or a cache that cannot be used; the message is one line."""


def calibration_summary(cfg: Config) -> dict[str, Any]:
    """What the log line and train-set.json say of the calibration (`Config.calibration_sampling`)."""
    plan = cfg.calibration_sampling()
    return {"group_size": plan.group_size, "temperature": plan.temperature, "max_tokens": plan.max_tokens,
            "rounds": cfg.puzzles.calibration.rounds}


def check_settings(cfg: Config) -> None:
    """Fail before any work when calibration could never find a mixed puzzle."""
    if cfg.puzzles.select == "mixed" and calibration_summary(cfg)["temperature"] <= 0:
        raise SelectionError("puzzles.calibration.temperature: must be > 0 for puzzles.select=mixed "
                             "(greedy samples of a puzzle never differ, so none is mixed)")


def select_training_puzzles(cfg: Config, model: Any, tokenizer: Any, env: Any, candidates: list[Puzzle],
                            run_dir: Path, *, reuse: bool, may_calibrate: bool, progress: bool = True,
                            log: Callable[[str], None] = print) -> list[Puzzle]:
    """The puzzles to train on: `candidates` (select: all), or the mixed ones among them.

    `model` must hold the initial weights. With `reuse` (--resume) a cached train-set.json in
    `run_dir` is read back; without a cache, calibration runs only if `may_calibrate` (no
    checkpoint was loaded: calibrating trained weights would choose other puzzles).
    Data-parallel, rank 0 calibrates (and writes) alone and sends its choice to the others.
    """
    if cfg.puzzles.select == "all":
        return candidates
    chosen_ids: set[str] = set()
    if dist.is_main():
        chosen_ids = {p.id for p in _main_rank_choice(cfg, model, tokenizer, env, candidates, run_dir, reuse,
                                                      may_calibrate, progress, log)}
    dist.barrier("rank 0's calibration", timeout=False)  # minutes of work on rank 0 alone
    flags = dist.broadcast({str(i): float(p.id in chosen_ids) for i, p in enumerate(candidates)})
    chosen = [p for i, p in enumerate(candidates) if flags[str(i)]]
    if not chosen:
        raise SelectionError(f"puzzles.select=mixed: none of the {len(candidates)} candidate puzzles is mixed for "
                             f"{cfg.model.spec} (see {run_dir / CALIBRATION_FILE}); try other tiers, "
                             "puzzles.calibration.group_size or a higher temperature")
    return chosen


def _main_rank_choice(cfg: Config, model: Any, tokenizer: Any, env: Any, candidates: list[Puzzle], run_dir: Path,
                      reuse: bool, may_calibrate: bool, progress: bool, log: Callable[[str], None]) -> list[Puzzle]:
    cached = run_dir / TRAIN_SET_FILE
    if reuse and cached.is_file():
        try:
            chosen = load_train_set(cached)
        except TrainSetError as exc:
            raise SelectionError(str(exc)) from None
        log(f"training puzzles: the {len(chosen)} mixed ones of the run's calibration ({cached})")
        return chosen
    if not may_calibrate:
        raise SelectionError(f"--resume: {run_dir} has a checkpoint but no {TRAIN_SET_FILE} from its calibration "
                             "(puzzles.select=mixed); restore it, or start a new run")
    settings = calibration_summary(cfg)
    plan, rounds = cfg.calibration_sampling(), cfg.puzzles.calibration.rounds
    path = journal_path(run_dir / CALIBRATION_FILE)
    if not reuse:
        path.unlink(missing_ok=True)  # a new run: an old run's unfinished calibration is not ours
    try:
        journal = Journal.open(path, journal_header(candidates, plan, cfg.grpo.advantage, rounds, model=cfg.model.spec))
    except JournalError as exc:
        raise SelectionError(str(exc)) from None
    resumed = f"; {len(journal.rows)} finished before, in {path.name}" if journal.rows else ""
    log(f"calibrating {len(candidates)} puzzles with the initial weights (G={settings['group_size']}, "
        f"T={settings['temperature']}, <= {settings['max_tokens']} tokens, {settings['rounds']} rounds{resumed})")
    model.eval()
    report = calibrate(model, tokenizer, env, candidates, plan, advantage=cfg.grpo.advantage, rounds=rounds,
                       progress=progress, journal=journal)
    mixed = of_category(candidates, report, MIXED)
    write_json_atomic(run_dir / CALIBRATION_FILE, report)
    counts = ", ".join(f"{k} {report['categories'].get(k, 0)}" for k in ("mixed", "all-failed", "all-solved"))
    if mixed:  # written last: its presence says the calibration finished
        directory = source_directory(Path(cfg.puzzles.train_set)) if cfg.puzzles.train_set else \
            (Path(cfg.puzzles.dir) if cfg.puzzles.dir else None)
        write_train_set(cached, mixed, directory, {"model": cfg.model.spec, **settings, "seed": cfg.seed,
                                                   "rollouts": CALIBRATION_FILE})
    journal.close()
    log(f"calibration: {counts} of {len(candidates)} ({report['timing']['sampling_seconds']:.0f}s); training on the "
        f"{len(mixed)} mixed puzzles" + (f" ({cached})" if mixed else ""))
    return mixed
