"""What `experiment --dry-run` says of each piece before it runs: a training run's memory
preflight (rl/memory.py, as `train --dry-run` computes it) and a time estimate read from the
pieces this experiment already finished (seconds per training step; seconds per evaluated
completion). Nothing is guessed where nothing has run yet."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..runfiles import read_history
from .pieces import EvalPiece, Piece, RunPiece


@dataclass(frozen=True)
class Rates:
    """Seconds per unit of work, measured on this experiment's finished pieces (None: nothing
    measured yet)."""

    step_s: float | None  # one training step
    completion_s: float | None  # one evaluated completion (a puzzle x a sample)
    steps_seen: int
    evals_seen: int

    def seconds(self, piece: Piece) -> float | None:
        """The time `piece` would still take at these rates (None when it cannot be told)."""
        if isinstance(piece, RunPiece) and self.step_s is not None:
            return (piece.config.train.steps - piece.steps_saved()) * self.step_s
        if isinstance(piece, EvalPiece) and self.completion_s is not None:
            count = puzzle_count(piece)
            return None if count is None else count * piece.eval_set.samples * self.completion_s
        return None


def measure(pieces: list[Piece]) -> Rates:
    """The rates of the runs' recorded steps and of the evaluation reports on disk."""
    steps: list[float] = []
    seconds, completions, evals = 0.0, 0, 0
    for piece in pieces:
        if isinstance(piece, RunPiece):
            steps += [h["step_s"] for h in read_history(piece.run_dir, missing_ok=True) if "step_s" in h]
        elif isinstance(piece, EvalPiece) and piece.done():
            report = json.loads(piece.out.read_text())
            seconds += report["timing"]["seconds"]
            completions += sum(row["samples"] for row in report["puzzles"])
            evals += 1
    return Rates(sum(steps) / len(steps) if steps else None, seconds / completions if completions else None,
                 len(steps), evals)


def puzzle_count(piece: EvalPiece) -> int | None:
    """How many puzzles the set holds (None while its file is still to be made)."""
    from ..puzzles.format import PuzzleError
    from ..puzzles.trainset import TrainSetError

    try:
        return len(piece.puzzles())
    except (PuzzleError, TrainSetError, OSError):
        return None


def memory_line(piece: RunPiece) -> str:
    """The run's estimated peak against the device's memory, one line; the preflight's own
    error (with settings that would fit) when it would not fit."""
    from ..puzzles.format import PuzzleError
    from ..puzzles.trainset import TrainSetError
    from ..rl import memory
    from ..rl.rundir import eval_puzzles, training_puzzles

    cfg = piece.config
    try:
        puzzles = training_puzzles(cfg)
        eval_set = eval_puzzles(cfg, puzzles)
    except (PuzzleError, TrainSetError, OSError) as exc:
        return f"memory: estimated once its puzzles are made ({exc})"
    shape, work = memory.plan(cfg, puzzles, eval_set)
    limit, source = memory.device_memory()
    notes: list[str] = []
    try:
        est = memory.check(shape, work, limit, source, notes.append)
    except memory.MemoryCheckError as exc:
        return f"DOES NOT FIT: {exc}"
    share = f", {est.peak / limit:.0%} of {memory.size(limit)} ({source})" if limit else f" ({source})"
    return f"memory: peak {memory.size(est.peak)} ({est.peak_phase}){share}" + (f"; {notes[0]}" if notes else "")


def duration(seconds: float) -> str:
    """Seconds as '3 h 05 min', '12 min' or '40 s'."""
    if seconds >= 3600:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"
