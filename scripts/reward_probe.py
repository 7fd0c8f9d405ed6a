"""How much the rewards for tasks without tests pay answers that fix nothing (README "Rewards"):
the buggy code with the entry point's body replaced by `pass`, and with an unrelated statement
added at the top of its body, scored with `similarity` (SWE-RL's) and `progress` on puzzle
directories.

    python scripts/reward_probe.py [DIR ...]   (default: the bundled puzzles)
"""

from __future__ import annotations

import ast
from pathlib import Path

import click

from mlx_swe_rl.env.rewards import Completion, progress_reward, similarity_reward
from mlx_swe_rl.puzzles.format import Puzzle, load_puzzles


def _edited(p: Puzzle, edit) -> str:
    tree = ast.parse(p.buggy)
    node = next(n for n in ast.walk(tree) if getattr(n, "name", None) == p.entry_point)
    edit(node)
    return ast.unparse(tree)


def body_deleted(p: Puzzle) -> str:
    """The buggy code with the entry point's body replaced by `pass` (decorators and signature kept)."""
    return _edited(p, lambda node: setattr(node, "body", [ast.Pass()]))


def edited_elsewhere(p: Puzzle) -> str:
    """The buggy code with an unrelated statement added at the top of the entry point's body."""
    return _edited(p, lambda node: node.body.insert(0, ast.parse("unrelated_name = 0").body[0]))


@click.command()
@click.argument("directories", nargs=-1, type=click.Path(exists=True, file_okay=False, path_type=Path))
def main(directories: tuple[Path, ...]) -> None:
    sources = directories or (None,)  # None: the bundled puzzles
    click.echo("| answers | reward | " + " | ".join(str(d) if d else "bundled" for d in sources) + " |")
    puzzle_sets = [load_puzzles(d) for d in sources]
    for label, make in (("body deleted", body_deleted), ("an unrelated line added", edited_elsewhere)):
        for name, reward in (("similarity", similarity_reward), ("progress", progress_reward)):
            cells = []
            for puzzles in puzzle_sets:
                values = [reward(Completion(p, make(p), None)) for p in puzzles]
                cells.append(f"{sum(values) / len(values):.4f} (max {max(values):.3f}, {sum(v > 0 for v in values)} of "
                             f"{len(values)} above 0)")
            click.echo(f"| {label} | {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
