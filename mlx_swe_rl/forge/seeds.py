"""Seeds: correct functions with tests, from which the forge makes bug-fix puzzles.

A seed file is a puzzle without a bug, one YAML file per function, `<dir>/<topic>/<id>.yaml`:

    id: running_max
    entry_point: running_max
    description: >-
      Return a list whose i-th element is the largest of numbers[0..i].
    code: |
      def running_max(numbers): ...
    tests:
      - assert running_max([]) == []
    timeout: 1.0        # optional
    source: {...}       # optional: provenance (harvested seeds: repository file, licence)

The tests follow the puzzle format (`puzzles.testplan`). A puzzle file also serves as a seed:
its oracle is the correct code, and a held-out puzzle's function stays held out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..puzzles.format import (PuzzleError, check_code, check_fields, check_id, check_source, check_strings,
                              check_tests, check_timeout, parse_puzzle, puzzle_files, read_yaml)

SEED_FIELDS = ("id", "entry_point", "description", "code", "tests", "timeout", "source")
REQUIRED_FIELDS = SEED_FIELDS[:5]
PUZZLE_KEYS = {"buggy", "oracle"}  # a file with these is a puzzle used as a seed
BUNDLED_SEEDS = Path(__file__).resolve().parents[2] / "seeds"


@dataclass(frozen=True)
class Seed:
    id: str
    topic: str  # the folder it came from: the forged puzzles' tier
    entry_point: str
    description: str
    code: str
    tests: tuple[str, ...]
    timeout: float | None = None
    heldout: bool = False  # from a held-out puzzle: its mutants must be held out too
    path: Path | None = None
    source: dict[str, str | int] | None = None  # provenance the forged puzzles carry (licence, file)


def parse_seed(data: object, path: Path) -> Seed:
    """Validate one seed (or puzzle) document."""
    if isinstance(data, dict) and PUZZLE_KEYS <= set(data):
        p = parse_puzzle(data, path)
        return Seed(p.id, p.tier, p.entry_point, p.description, p.oracle, p.tests, p.timeout,
                    p.split == "heldout", path, p.source)
    data = check_fields(data, path, SEED_FIELDS, REQUIRED_FIELDS)
    check_strings(data, path, ("id", "entry_point", "description", "code"))
    check_id(data, path)
    check_code(data, path, "code")
    return Seed(data["id"], path.parent.name, data["entry_point"], data["description"].strip(), data["code"],
                check_tests(data, path), check_timeout(data, path), False, path, check_source(data, path))


def load_seeds(roots: list[Path]) -> list[Seed]:
    """Every seed under the given directories or files, sorted by id; ids must be unique."""
    seeds: dict[str, Seed] = {}
    for root in roots:
        files = puzzle_files(Path(root))
        if not files:
            raise PuzzleError(f"{root}: no seed files (*.yaml) found")
        for path in files:
            seed = parse_seed(read_yaml(path), path)
            if seed.id in seeds:
                raise PuzzleError(f"{path}: id: '{seed.id}' is also used by {seeds[seed.id].path}")
            seeds[seed.id] = seed
    return [seeds[k] for k in sorted(seeds)]
