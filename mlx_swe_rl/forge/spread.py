"""Choosing a training or evaluation set from forged puzzles so that no seed function dominates
and each function's puzzles spread over its mutator families (the transfer experiment's sets,
`scripts/transfer_data.py`)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import numpy as np

from ..puzzles.format import Puzzle
from .forge import seed_function


def function_of(puzzle: Puzzle) -> str:
    """The seed function a forged puzzle mutates."""
    return seed_function(puzzle.id)


def spread_choice(puzzles: list[Puzzle], k: int, rng: np.random.Generator) -> list[Puzzle]:
    """`k` of one function's puzzles, one family at a time: a seeded order within each family,
    then round-robin over the families in a seeded order."""
    by_family: dict[str, list[Puzzle]] = defaultdict(list)
    for p in sorted(puzzles, key=lambda p: p.id):
        by_family[p.family or ""].append(p)
    queues = [[group[i] for i in rng.permutation(len(group))] for _, group in sorted(by_family.items())]
    queues = [queues[i] for i in rng.permutation(len(queues))]
    chosen: list[Puzzle] = []
    while len(chosen) < k and any(queues):
        for queue in queues:
            if queue and len(chosen) < k:
                chosen.append(queue.pop(0))
    return chosen


def capped(puzzles: list[Puzzle], k: int, seed: int) -> list[Puzzle]:
    """At most `k` puzzles of every function, in function order."""
    groups: dict[str, list[Puzzle]] = defaultdict(list)
    for p in puzzles:
        groups[function_of(p)].append(p)
    rng = np.random.default_rng(seed)
    return [p for name in sorted(groups) for p in spread_choice(groups[name], k, rng)]


def coverage(puzzles: list[Puzzle]) -> dict[str, Any]:
    """How many puzzles, functions and mutator families a set holds."""
    return {"puzzles": len(puzzles), "functions": len({function_of(p) for p in puzzles}),
            "families": dict(sorted(Counter(p.family for p in puzzles).items())),
            "per_function_max": max(Counter(function_of(p) for p in puzzles).values(), default=0)}
