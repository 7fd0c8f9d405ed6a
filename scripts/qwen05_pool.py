"""The candidate puzzles of the Qwen2.5-Coder-0.5B experiment (configs/experiments/qwen05.yaml),
before its calibration chooses the training set: the bundled medium and hard training puzzles
beside one forged training puzzle of each of the first --forged functions of the transfer
experiment's training set (scripts/transfer_data.py's outputs/transfer/train.json), copied into
one directory with a folder per tier (their ids do not clash). The 0.5B solves most easy-tier
puzzles already, so the pool leaves them out.

Written to OUT.tmp and renamed when complete, so an interrupted run leaves no half pool that the
experiment would keep.

    python scripts/qwen05_pool.py [--forged 12] [--out outputs/qwen05/pool]
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click

from mlx_swe_rl.puzzles.format import Puzzle, load_puzzles

TRANSFER_TRAIN = Path("outputs/transfer/train.json")
PER_FUNCTION = 4  # transfer_data.py's default --per-function: the set lists that many puzzles of each function


def copy_into(out: Path, puzzles: list[Puzzle]) -> None:
    """Each puzzle's file into OUT/TIER/, as the puzzle loader reads a directory."""
    for p in puzzles:
        (out / p.tier).mkdir(parents=True, exist_ok=True)
        shutil.copy(p.path, out / p.tier / p.path.name)


@click.command()
@click.option("--forged", default=12, show_default=True,
              help="How many of the transfer experiment's forged training functions join (one puzzle each).")
@click.option("--out", "out", type=click.Path(path_type=Path), default=Path("outputs/qwen05/pool"), show_default=True)
def main(forged: int, out: Path) -> None:
    if not TRANSFER_TRAIN.is_file():
        raise click.ClickException(f"{TRANSFER_TRAIN}: missing (scripts/transfer_data.py writes it first)")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    copy_into(tmp, load_puzzles(tiers=["medium", "hard"], split="train"))
    train = json.loads(TRANSFER_TRAIN.read_text())
    # Every PER_FUNCTION-th id is the first puzzle of a new function: the set lists them grouped.
    wanted = set(train["puzzles"][::PER_FUNCTION][:forged])
    copy_into(tmp, [p for p in load_puzzles(Path(train["puzzle_dir"])) if p.id in wanted])
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"{out}: {sum(1 for _ in out.rglob('*.yaml'))} candidate puzzles")


if __name__ == "__main__":
    main()
