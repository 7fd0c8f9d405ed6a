"""The harvest: seed functions, with tests, from code nobody here wrote.

For each source (`sources`: the standard library, an installed distribution, a source tree)
whose licence is permissive, in stages, each counted per source (the funnel):

1. files: its `.py` files (tests left out);
2. functions: public module-level functions; sized: 5 to 40 lines; self_contained: runs on
   its own, with the helpers of its module it needs carried along (`candidates`;
   with_helpers counts those that carry some);
3. not_benchmark: not one of the public benchmarks' functions (`decontam`); unique: not a
   copy of a function already harvested (vendored code, the same helper in two packages);
4. tried: all of them, or a seeded sample of `max_functions` per source;
5. tests: the function's doctest examples (`doctests.doctest_tests`), when they give at least
   `min_doctests` asserts that the original passes in the sandbox (doctests); else outputs
   recorded by running it on chosen inputs (`recorded`); tested: either;
6. kept: at least one of the first `probe_mutants` mutants the forge would try (`forge.candidates`,
   in its trial order) fails the tests. A seed whose tests cannot tell a mutant from the
   original teaches nothing and is dropped.

The kept seeds are written in the forge's seed format, one folder per source, each with its
provenance (`source`: file, line, licence, where its tests came from), and `harvest.json`
holds the funnel. The forge then makes the mutants and holds out whole functions; the
command adds its count per source (mutants_kept) to the funnel.
"""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ..puzzles.format import Puzzle, defines, normal_form
from ..sandbox.scorer import Scorer
from .candidates import MAX_HELPER_LINES, STAGES, Candidate, scan_file
from .checks import ORACLE_BUDGET_SHARE
from .decontam import Benchmarks, fingerprints
from .doctests import docstring_of, doctest_tests, with_test_imports
from .forge import ForgeSettings, candidates, seed_function
from .puzzleset import block_yaml, write_file_set
from .recorded import RecordSettings, record_tests
from .seeds import Seed
from .sources import Source

SUMMARY_FILE = "harvest.json"
FUNNEL = ("files", *STAGES, "not_benchmark", "unique", "tried", "doctests", "recorded", "tested", "kept")
MAX_DESCRIPTION = 400
Bar = Callable[[str, int], Any]  # (description, total) -> an object with update(n) and close()


@dataclass(frozen=True)
class HarvestSettings:
    seed: int = 0
    max_functions: int | None = None  # per source: a seeded sample of its candidates (None: all)
    min_doctests: int = 2  # asserts doctests must give to be a seed's tests
    probe_mutants: int = 8  # mutants tried per seed; one must fail its tests
    timeout: float = 1.0  # seconds: every seed's timeout (the forge's validation budget)
    max_helper_lines: int = MAX_HELPER_LINES  # module helpers carried along, lines together (0: none)
    record: RecordSettings = RecordSettings()


@dataclass
class Harvest:
    settings: HarvestSettings
    sources: list[Source]
    seeds: list[Seed] = field(default_factory=list)
    funnel: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))  # source -> stage -> count
    problems: Counter = field(default_factory=Counter)  # why candidates were dropped, in a few words
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        """What harvest.json records: settings, each source (licence, funnel), totals."""
        sources = {s.name: {"spec": s.spec, "version": s.version, "root": str(s.root), "licence": s.licence,
                            "permissive": s.permissive,
                            "funnel": {k: self.funnel[s.name][k] for k in self.stages()}} for s in self.sources}
        return {"settings": asdict(self.settings), "sources": sources,
                "total": {k: sum(self.funnel[s.name][k] for s in self.sources) for k in self.stages()},
                "seeds": len(self.seeds), "problems": dict(self.problems.most_common()),
                "seconds": round(self.seconds, 1)}

    def stages(self) -> tuple[str, ...]:
        extra = tuple(k for k in ("mutants_kept", "functions_forged") if any(k in c for c in self.funnel.values()))
        return FUNNEL + extra


def _no_bar(desc: str, total: int) -> Any:
    class Quiet:
        def update(self, n: int = 1) -> None:
            pass

        def close(self) -> None:
            pass

    return Quiet()


def description_of(candidate: Candidate, spec: str) -> str:
    """The docstring's first paragraph (before any example), or a line naming the function."""
    docstring = docstring_of(candidate.code) or ""
    paragraph = " ".join(docstring.split("\n\n")[0].split(">>>")[0].split())
    if paragraph:
        return paragraph[:MAX_DESCRIPTION]
    return f"The function `{candidate.name}` of the module `{candidate.module}` ({spec})."


def scan_sources(sources: list[Source], harvest: Harvest, benchmarks: Benchmarks, bar: Bar) -> list[Candidate]:
    """Stages 1 to 4: every source's candidates, decontaminated, without copies, sampled."""
    chosen: list[Candidate] = []
    seen_bodies: set[str] = set()
    for source in sources:
        counts = harvest.funnel[source.name]
        if not source.permissive:
            harvest.problems[f"licence not permissive: {source.licence}"] += 1
            continue
        counts["files"] = len(source.files)
        progress = bar(f"scan {source.name}", len(source.files))
        found: list[Candidate] = []
        for path in source.files:
            scan = scan_file(path, source.root, source.name, harvest.settings.max_helper_lines)
            counts.update(scan.counts)
            for candidate in scan.candidates:
                if benchmarks.match(candidate.code):
                    harvest.problems["a benchmark's function"] += 1
                    continue
                counts["not_benchmark"] += 1
                body = fingerprints(candidate.code)[-1].body  # the function, after its imports
                if body in seen_bodies:
                    harvest.problems["a copy of a function harvested already"] += 1
                    continue
                seen_bodies.add(body)
                counts["unique"] += 1
                found.append(candidate)
            progress.update(1)
        progress.close()
        limit = harvest.settings.max_functions
        if limit is not None and len(found) > limit:
            found = sorted(random.Random(f"{harvest.settings.seed}:{source.name}").sample(found, limit),
                           key=lambda c: (c.path, c.line))
        counts["tried"] = len(found)
        chosen += found
    return chosen


def unique_ids(found: list[Candidate]) -> list[str]:
    """Seed ids, a number added where two functions share one (`name_2`)."""
    used: Counter = Counter()
    ids = []
    for c in found:
        used[c.seed_id] += 1
        ids.append(c.seed_id if used[c.seed_id] == 1 else f"{c.seed_id}_{used[c.seed_id]}")
    return ids


def _seed(candidate: Candidate, seed_id: str, tests: tuple[str, ...], kind: str, source: Source,
          settings: HarvestSettings) -> Seed:
    provenance = {"harvest": source.spec, "version": source.version, "path": candidate.path, "line": candidate.line,
                  "module": candidate.module, "licence": source.licence, "tests": kind}
    if candidate.helpers:  # the forge mutates only the entry point of a seed that carries helpers
        provenance["helpers"] = ", ".join(candidate.helpers)
    return Seed(seed_id, source.name, candidate.name, description_of(candidate, source.spec), candidate.code, tests,
                settings.timeout, source=provenance)


def _puzzle(seed: Seed, code: str | None = None) -> Puzzle:
    """The seed as the scorer sees it: itself as the oracle, `code` (a mutant) as the buggy code."""
    return Puzzle(seed.id, seed.topic, "train", seed.entry_point, seed.description, code or seed.code, seed.code,
                  seed.tests, seed.timeout)


def oracle_problems(seeds: list[Seed], scorer: Scorer, budget: float) -> dict[str, str]:
    """{seed id: why its tests cannot be used}: the original fails them, or takes over half
    the budget."""
    found = {}
    for seed_id, (problems, seconds) in scorer.prepare([_puzzle(s) for s in seeds]).items():
        if problems:
            found[seed_id] = f"the original fails its tests: {problems[0]}"
        elif seconds > budget * ORACLE_BUDGET_SHARE:
            found[seed_id] = "the original is too slow on its tests"
    return found


def attach_tests(found: list[Candidate], ids: list[str], sources: dict[str, Source], scorer: Scorer,
                 harvest: Harvest, bar: Bar) -> list[Seed]:
    """Stage 5: doctest tests where the original passes enough of them, else recorded outputs."""
    settings = harvest.settings
    by_id = dict(zip(ids, found))
    doctested = []
    for seed_id, c in by_id.items():
        tests = doctest_tests(docstring_of(c.code) or "", c.name, set(c.imports))
        if len(tests) >= settings.min_doctests:
            tests = with_test_imports(tests, c.imports, list(c.carried))
            doctested.append(_seed(c, seed_id, tuple(tests), "doctests", sources[c.source], settings))
    broken = oracle_problems(doctested, scorer, settings.timeout)
    seeds = [s for s in doctested if s.id not in broken]
    done = {s.id for s in seeds}
    todo = [(seed_id, c) for seed_id, c in by_id.items() if seed_id not in done]
    progress = bar("record outputs", len(todo))
    recorded: list[Seed] = []
    record = replace(settings.record, seed=settings.seed)
    step = 64  # functions per batch: the bar moves, and memory stays small
    for start in range(0, len(todo), step):
        batch = todo[start:start + step]
        recordings = record_tests([(i, c.code, c.name, c.literals) for i, c in batch], scorer.sandbox, record)
        for seed_id, c in batch:
            if recordings[seed_id].tests:
                recorded.append(_seed(c, seed_id, recordings[seed_id].tests, "recorded", sources[c.source], settings))
            else:
                harvest.problems[f"recorded: {_kind_of_problem(recordings[seed_id].problem)}"] += 1
        progress.update(len(batch))
    progress.close()
    broken.update(oracle_problems(recorded, scorer, settings.timeout))
    for problem in broken.values():
        harvest.problems[problem.split(":")[0]] += 1
    seeds += [s for s in recorded if s.id not in broken]
    for s in seeds:
        counts = harvest.funnel[s.topic]
        counts[s.source["tests"]] += 1
        counts["tested"] += 1
    return seeds


def _kind_of_problem(problem: str) -> str:
    """A recording problem without its numbers, so that the problems table groups them."""
    return "too few calls returned plain values" if "calls returned" in problem and "same value" not in problem \
        else problem


def mutant_check(seeds: list[Seed], scorer: Scorer, harvest: Harvest, bar: Bar) -> list[Seed]:
    """Stage 6: the seeds at least one of whose first `probe_mutants` forge mutants fails a test."""
    settings = ForgeSettings(seed=harvest.settings.seed, timeout=harvest.settings.timeout)
    items, owners = [], []
    for s in seeds:
        original = normal_form(s.code)
        tried = 0
        for m in candidates(s, settings):
            if tried >= harvest.settings.probe_mutants:
                break
            if defines(m.code, s.entry_point) and normal_form(m.code) != original:
                items.append((_puzzle(s, m.code), m.code))
                owners.append(s.id)
                tried += 1
    progress = bar("mutant check", len(items))
    caught: Counter = Counter()
    step = 256
    for start in range(0, len(items), step):
        for owner, run in zip(owners[start:start + step], scorer.run_many(items[start:start + step])):
            if run.results and not run.all_passed:
                caught[owner] += 1
        progress.update(len(items[start:start + step]))
    progress.close()
    kept = [s for s in seeds if caught[s.id]]
    if len(kept) < len(seeds):
        harvest.problems["no mutant fails its tests"] += len(seeds) - len(kept)
    for s in kept:
        harvest.funnel[s.topic]["kept"] += 1
    return kept


def harvest(sources: list[Source], scorer: Scorer, benchmarks: Benchmarks,
            settings: HarvestSettings = HarvestSettings(), bar: Bar | None = None) -> Harvest:
    """Run the stages over `sources` (see the module's docstring)."""
    start = time.monotonic()
    bar = bar or _no_bar
    result = Harvest(settings, list(sources))
    for s in sources:
        result.funnel[s.name]  # every source has a row, an empty one too
    found = scan_sources(sources, result, benchmarks, bar)
    by_name = {s.name: s for s in sources}
    tested = attach_tests(found, unique_ids(found), by_name, scorer, result, bar)
    result.seeds = sorted(mutant_check(tested, scorer, result, bar), key=lambda s: s.id)
    result.seconds = time.monotonic() - start
    return result


def seed_yaml(seed: Seed) -> str:
    """A seed file's text (`seeds` reads it)."""
    return block_yaml({"id": seed.id, "entry_point": seed.entry_point, "description": seed.description,
                       "code": seed.code, "tests": list(seed.tests), "timeout": seed.timeout, "source": seed.source})


def write_harvest(result: Harvest, out: Path, overwrite: bool = False) -> None:
    """`<out>/<source>/<id>.yaml` per seed and `<out>/harvest.json`, all at once."""
    files = {f"{s.topic}/{s.id}.yaml": seed_yaml(s) for s in result.seeds}
    write_file_set(files, out, SUMMARY_FILE, result.summary(), overwrite, kind="harvest")


def add_forged(result: Harvest, puzzles: list[Puzzle]) -> None:
    """The forge's output per source: mutants kept and the functions they come from."""
    for name in result.funnel:
        mine = [p for p in puzzles if p.tier == name]
        result.funnel[name]["mutants_kept"] = len(mine)
        result.funnel[name]["functions_forged"] = len({seed_function(p.id) for p in mine})


def format_funnel(result: Harvest) -> str:
    """The funnel table the command prints: one row per source, then the total."""
    stages = result.stages()
    summary = result.summary()
    head = ["source", "licence", *stages]
    rows = [[name, row["licence"], *(str(row["funnel"][k]) for k in stages)] for name, row in summary["sources"].items()]
    rows.append(["all", "", *(str(summary["total"][k]) for k in stages)])
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [head] + rows]
    lines += [f"dropped: {count} {why}" for why, count in summary["problems"].items() if count]
    return "\n".join(lines)
