"""Training sets: a named subset of a puzzle directory, written by calibration
(`mlx-swe-rl calibrate --write-train-set`, `puzzles sample`) and read by configs and the CLI.

The file is JSON: {"puzzle_dir": null or a path, "puzzles": [ids...], "source": {...}}.
A null directory means the bundled puzzles; a relative one is relative to the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .format import Puzzle, default_puzzle_dir, filter_puzzles, load_puzzles

# What a run that calibrates (puzzles.select=mixed) writes in its run directory: the calibration's
# rollouts, and the train set it chose, which other runs may name as their puzzles.train_set.
CALIBRATION_FILE, TRAIN_SET_FILE = "calibration.json", "train-set.json"


class TrainSetError(ValueError):
    """A train-set file that cannot be used; the message names the file."""


def write_train_set(path: Path, puzzles: list[Puzzle], puzzle_dir: Path | None, source: dict[str, Any]) -> None:
    """Save the ids of `puzzles` (from `puzzle_dir`, None = bundled) with how they were chosen."""
    from ..runfiles import write_json_atomic

    directory = None if puzzle_dir is None else str(Path(puzzle_dir).resolve())
    write_json_atomic(path, {"puzzle_dir": directory, "puzzles": [p.id for p in puzzles], "source": source})


def of_category(puzzles: list[Puzzle], report: dict[str, Any], category: str = "mixed") -> list[Puzzle]:
    """The puzzles a calibration report (`rl/calibration.calibration_report`) put in `category`,
    in the order of `puzzles`: how a train set is chosen, whether the report was just made or
    committed long ago. A puzzle the report does not cover is left out."""
    rows = report.get("puzzles") if isinstance(report, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "id" in r and "category" in r for r in rows):
        raise TrainSetError("calibration report: puzzles: expected rows with an id and a category")
    chosen = {row["id"] for row in rows if row["category"] == category}
    return [p for p in puzzles if p.id in chosen]


def source_directory(puzzles: Path | None) -> Path | None:
    """The puzzle directory behind a --puzzles value: None (bundled), a directory, or the
    directory a train-set file points to."""
    if puzzles is None or puzzles.suffix != ".json":
        return puzzles
    directory = _read(puzzles).get("puzzle_dir")
    return None if directory is None else puzzles.parent / directory


def _read(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise TrainSetError(f"{path}: cannot read train set ({exc.strerror})") from exc
    except ValueError as exc:
        raise TrainSetError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("puzzles"), list):
        raise TrainSetError(f"{path}: puzzles: expected a list of puzzle ids")
    return data


def load_selection(path: Path | None, tiers: list[str] | None = None, split: str = "all") -> list[Puzzle]:
    """The puzzles a --puzzles value names: a puzzle-set file (`.json`: `puzzles sample`,
    `calibrate --write-train-set`), a puzzle directory, or None for the bundled puzzles."""
    if path is not None and Path(path).suffix == ".json":
        return load_train_set(Path(path), tiers, split)
    return load_puzzles(path, tiers, split)


def load_train_set(path: Path, tiers: list[str] | None = None, split: str = "all") -> list[Puzzle]:
    """The puzzles a train-set file names, in file order, filtered by tier and split."""
    data = _read(path)
    directory = data.get("puzzle_dir")
    root = default_puzzle_dir() if directory is None else Path(path).parent / directory
    every = {p.id: p for p in load_puzzles(root)}
    missing = [pid for pid in data["puzzles"] if pid not in every]
    if missing:
        raise TrainSetError(f"{path}: puzzles: unknown id '{missing[0]}' (not in {root})")
    return filter_puzzles([every[pid] for pid in data["puzzles"]], tiers, split)
