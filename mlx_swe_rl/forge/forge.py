"""The puzzle forge: correct seed functions -> AST mutants -> validated bug-fix puzzles.

For each seed, every single-site mutant (`mutators`) is a candidate. Candidates are tried in a
seeded order that takes the families in turn, and validated through the one scorer until
`per_seed` are kept. A mutant is kept only when it defines the entry point, differs from the
seed and from every other mutant of it (normalised AST), fails at least one test, and gives
the same per-test verdict twice within its time budget. A mutant that hangs is kept: its
puzzle carries the forge's short timeout, like every forged puzzle.

The split is by seed function: every mutant of a held-out seed is held out, so a held-out
score measures transfer to functions never trained on. Seeds taken from held-out puzzles
stay held out; of the others, a seeded hash picks `heldout_frac`.

Same seeds and settings, same puzzles, byte for byte (verdicts permitting: a mutant whose
verdict depends on timing is rejected as unstable or too slow).

Multi-turn repair's default split (one public test) must hold for every kept puzzle: a test
that is the only one to catch its mutant, or whose public run cannot rebuild the state earlier
tests leave, is written into the puzzle's `hidden_tests`, so the split passes over it. The
mutants kept, and their ids, do not depend on it.
"""

from __future__ import annotations

import ast
import hashlib
import random
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ..puzzles.format import Puzzle, defines
from ..sandbox.scorer import Scorer, TestRun
from ..sandbox.verdict import TIMEOUT
from .checks import ORACLE_BUDGET_SHARE, keep_split_sound
from .mutators import FAMILIES, Mutant, mutants
from .puzzleset import puzzle_yaml, write_puzzle_set

__all__ = ["ForgeResult", "ForgeSettings", "forge", "format_summary", "puzzle_yaml", "write_forged"]
from .seeds import Seed

REASONS = ("invalid", "equivalent", "duplicate", "no_test_fails", "unstable", "too_slow")
SUMMARY_FILE = "forge.json"


@dataclass(frozen=True)
class ForgeSettings:
    per_seed: int = 4  # puzzles kept per seed function (at most)
    families: tuple[str, ...] = FAMILIES
    heldout_frac: float = 0.25  # of the seeds not already held out
    seed: int = 0
    timeout: float = 1.0  # seconds: the validation budget, and every forged puzzle's timeout


@dataclass
class ForgeResult:
    puzzles: list[Puzzle]
    settings: ForgeSettings
    counts: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))  # family -> kept / reasons
    seed_problems: dict[str, str] = field(default_factory=dict)  # seed id -> why it gave nothing
    seeds: int = 0

    def summary(self) -> dict[str, Any]:
        """What `forge.json` records: settings, counts per family and split, seed problems."""
        families = {f: {k: self.counts[f][k] for k in ("kept", *REASONS)} for f in self.settings.families}
        return {
            "settings": {**asdict(self.settings), "families": list(self.settings.families)},
            "seeds": self.seeds,
            "puzzles": len(self.puzzles),
            "splits": dict(sorted(Counter(p.split for p in self.puzzles).items())),
            "seed_functions": {split: len({seed_function(p.id) for p in self.puzzles if p.split == split})
                               for split in ("train", "heldout")},
            "families": families,
            "hidden_tests": sum(bool(p.hidden_tests) for p in self.puzzles),
            "seed_problems": self.seed_problems,
        }


def puzzle_id(seed_id: str, family: str, number: int) -> str:
    """A forged puzzle's id: its seed function, its mutator family and its number within both."""
    return f"{seed_id}__{family}_{number}"


def seed_function(forged_id: str) -> str:
    """The seed function a forged puzzle id names (the inverse of `puzzle_id`'s first part)."""
    return forged_id.rsplit("__", 1)[0]


def heldout_ids(seeds: list[Seed], frac: float, rng_seed: int) -> set[str]:
    """Seeds whose mutants are held out: those from held-out puzzles, plus a seeded-hash
    choice of `frac` of the rest."""
    forced = {s.id for s in seeds if s.heldout}
    rest = sorted((s.id for s in seeds if not s.heldout),
                  key=lambda i: hashlib.sha256(f"{rng_seed}:{i}".encode()).hexdigest())
    return forced | set(rest[:round(frac * len(rest))])


def _normal(code: str) -> str:
    return ast.dump(ast.parse(code))


def entry_lines(seed: Seed) -> range | None:
    """The lines of the seed's entry point when the seed carries helpers of its module
    (harvested seeds say so in `source.helpers`); None: every line may hold the bug."""
    if not (seed.source or {}).get("helpers"):
        return None
    node = next((n for n in ast.parse(seed.code).body if isinstance(n, ast.FunctionDef) and n.name == seed.entry_point),
                None)
    return range(node.lineno, (node.end_lineno or node.lineno) + 1) if node is not None else None


def candidates(seed: Seed, settings: ForgeSettings) -> list[Mutant]:
    """The seed's mutants in trial order: each family's shuffled, families taken in turn. A
    seed that carries helpers gets its bug in the entry point, the function its description
    and tests are about; the helpers are context."""
    rng = random.Random(f"{settings.seed}:{seed.id}")
    by_family: dict[str, list[Mutant]] = defaultdict(list)
    focus = entry_lines(seed)
    for m in mutants(seed.code, settings.families):
        if focus is None or m.line in focus:
            by_family[m.family].append(m)
    order = list(by_family)
    rng.shuffle(order)
    for family in order:
        rng.shuffle(by_family[family])
    ordered = []
    for i in range(max((len(v) for v in by_family.values()), default=0)):
        ordered += [by_family[f][i] for f in order if i < len(by_family[f])]
    return ordered


def verdict(first: TestRun, second: TestRun, budget: float) -> str:
    """'kept' or the reason to reject, from two runs of the same mutant."""
    statuses = [r.status for r in first.results]
    if statuses != [r.status for r in second.results]:
        return "unstable"
    if first.all_passed:
        return "no_test_fails"
    if TIMEOUT not in statuses and max(first.seconds, second.seconds) > budget:
        return "too_slow"
    return "kept"


def _seed_puzzle(seed: Seed, settings: ForgeSettings, code: str = "") -> Puzzle:
    """The puzzle the scorer sees while validating: the seed's id, oracle and tests (so its
    expected values are computed once), the mutant as buggy code."""
    return Puzzle(seed.id, seed.topic, "train", seed.entry_point, seed.description, code or seed.code, seed.code,
                  seed.tests, settings.timeout, source=seed.source)


def forge(seeds: list[Seed], scorer: Scorer, settings: ForgeSettings = ForgeSettings(),
          progress: Callable[[int], None] | None = None) -> ForgeResult:
    """Mutate and validate; returns the kept puzzles (ordered by seed, then trial order) and
    the counts. `progress(n)` is called with the number of candidates each batch validated."""
    result = ForgeResult([], settings, seeds=len(seeds))
    checked = scorer.prepare([_seed_puzzle(s, settings) for s in seeds if s.tests])
    usable = []
    for s in seeds:
        problems, seconds = checked.get(s.id, ([], 0.0))
        if not s.tests:  # a task without tests (a mined one) cannot tell a mutant from its seed
            result.seed_problems[s.id] = "no tests: a seed needs tests that catch its mutants"
        elif problems:
            result.seed_problems[s.id] = f"oracle: {problems[0]}"
        elif seconds > settings.timeout * ORACLE_BUDGET_SHARE:
            result.seed_problems[s.id] = f"oracle took {seconds:.2f}s, over half the {settings.timeout:g}s budget"
        else:
            usable.append(s)
    queues = {s.id: candidates(s, settings) for s in usable}
    seen = {s.id: {_normal(s.code)} for s in usable}
    kept: dict[str, list[tuple[Mutant, list[str]]]] = {s.id: [] for s in usable}  # with its per-test verdict
    while True:
        batch: list[tuple[Seed, Mutant]] = []
        for s in usable:
            need = settings.per_seed - len(kept[s.id])
            want = need + (need + 3) // 4 if need > 0 else 0  # a margin: about 1 in 15 is rejected
            while want > 0 and queues[s.id]:
                m = queues[s.id].pop(0)
                reason = _precheck(s, m, seen[s.id])
                if reason:
                    result.counts[m.family][reason] += 1
                else:
                    batch.append((s, m))
                    want -= 1
        if not batch:
            break
        items = [(_seed_puzzle(s, settings, m.code), m.code) for s, m in batch for _ in range(2)]
        runs = scorer.run_many(items)
        for i, (s, m) in enumerate(batch):
            outcome = verdict(runs[2 * i], runs[2 * i + 1], settings.timeout)
            if outcome == "kept" and len(kept[s.id]) >= settings.per_seed:
                continue  # enough already: neither kept nor rejected
            result.counts[m.family][outcome] += 1
            if outcome == "kept":
                kept[s.id].append((m, [r.status for r in runs[2 * i].results]))
        if progress:
            progress(len(batch))
    held = heldout_ids(usable, settings.heldout_frac, settings.seed)
    made, made_statuses = [], []
    for s in usable:
        numbers: Counter = Counter()
        for m, statuses in kept[s.id]:
            numbers[m.family] += 1
            made.append(replace(
                _seed_puzzle(s, settings, m.code), id=puzzle_id(s.id, m.family, numbers[m.family]),
                split="heldout" if s.id in held else "train", family=m.family, mutation=m.description))
            made_statuses.append(statuses)
    result.puzzles = keep_split_sound(made, scorer, made_statuses)
    return result


def _precheck(seed: Seed, mutant: Mutant, seen: set[str]) -> str | None:
    """Rejections that need no run; records the mutant's normal form when it passes."""
    if not defines(mutant.code, seed.entry_point):
        return "invalid"
    normal = _normal(mutant.code)
    if normal == _normal(seed.code):
        return "equivalent"
    if normal in seen:
        return "duplicate"
    seen.add(normal)
    return None


def write_forged(result: ForgeResult, out: Path, overwrite: bool = False) -> None:
    """Write `<out>/<tier>/<id>.yaml` for each puzzle and `<out>/forge.json`, all at once (see
    `puzzleset.write_puzzle_set`); an existing `out` is replaced only with `overwrite`, and
    only if it is a forge output (has forge.json)."""
    write_puzzle_set(result.puzzles, out, SUMMARY_FILE, result.summary(), overwrite, kind="forged set")


def format_summary(result: ForgeResult) -> str:
    """The per-family table the command prints."""
    head = ["family", "kept", *REASONS]
    rows = [[f] + [str(result.counts[f][k]) for k in head[1:]] for f in result.settings.families]
    rows.append(["all"] + [str(sum(result.counts[f][k] for f in result.settings.families)) for k in head[1:]])
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [head] + rows]
    summary = result.summary()
    lines.append(f"{summary['puzzles']} puzzles from {summary['seeds']} seeds: "
                 + ", ".join(f"{n} {split} ({summary['seed_functions'][split]} functions)"
                             for split, n in summary["splits"].items()))
    by_problem: dict[str, list[str]] = defaultdict(list)  # one line for many seeds without tests, say
    for seed_id, problem in result.seed_problems.items():
        by_problem[problem].append(seed_id)
    for problem, ids in by_problem.items():
        which = f"seed {ids[0]}" if len(ids) == 1 else f"{len(ids)} seeds ({ids[0]}, ...)"
        lines.append(f"{which} skipped: {problem}")
    return "\n".join(lines)
