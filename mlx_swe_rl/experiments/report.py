"""The experiment's report, drawn from the files its pieces leave (evaluation reports, the runs'
history.jsonl and wall_time.json): every run's paired change from the base model on every set
with its 95% bootstrap CI over puzzles and up/down counts (rl/stats.py), each variant's mean over
its seeds, the variant-minus-variant rows the file asks for, the puzzles each run newly solved
and lost, each run's step curves, sampled tokens, wall time and peak memory, and its training
puzzles visit by visit (how many of each step's samples solved them: what training gained or
lost on the puzzles it trained on, as it went). An
evaluation-only variant gets the paired change and the puzzles rows too (under "evaluated").

Written as OUTPUT_DIR/report.json and report.md (and report.png, figure.py).
"""

from __future__ import annotations

import functools
import json
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

from ..puzzles.format import Puzzle, PuzzleError
from ..puzzles.trainset import CALIBRATION_FILE, TRAIN_SET_FILE, TrainSetError
from ..runfiles import ROLLOUTS, read_history, read_jsonl, wall_seconds, write_json_atomic
from ..rl.stats import compare_reports
from .pieces import DataPiece, EvalPiece, Piece, RunPiece
from .spec import Experiment, Pair, Variant

# per step, per run: what was learned, what could teach, and what each phase cost
CURVES = ("reward_mean", "completion_len", "truncation_rate", "kl", "zero_var_frac", "tokens_total", "sample_s",
          "reference_s", "update_s", "step_s", "peak_memory_gb")
# a harvest's funnel as the report shows it: where functions are lost between reading and puzzles
FUNNEL = ("files", "functions", "self_contained", "unique", "doctests", "recorded", "kept", "mutants_kept")
SHOWN_IDS = 8  # puzzle ids per cell of the Markdown table (all of them are in the JSON)


def load_report(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


Evaluated = tuple[EvalPiece, dict[str, Any], dict[str, Any]]  # an evaluation, the base's report and its own


def overall(report: dict[str, Any]) -> list[float]:
    """[avg@K, CI low, CI high] over every puzzle of an evaluation report."""
    row = next(t for t in report["totals"] if t.get("tier") == "all" and t["split"] == "all")
    return [row["pass@1"], *row["ci95"]]


def cost(report: dict[str, Any]) -> dict[str, Any]:
    """What an evaluation cost: its answers, their tokens, how many hit the token limit and how many
    ended on the answer-end stop, its seconds."""
    t = report["timing"]
    return {"answers": sum(r["samples"] for r in report["puzzles"]), "generated_tokens": t["generated_tokens"],
            "truncated": t["truncated"], "stopped": t["stopped"], "seconds": t["seconds"]}


def puzzle_rows(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Each puzzle's avg@K before and after and its split (the seed's table), and the puzzles
    newly solved (no sample passed before, one does after) and lost (the other way round)."""
    from ..reports.figures import puzzle_changes

    changes = puzzle_changes(before, after)
    rates = {r["id"]: r["pass@1"] for r in before["puzzles"]}
    return {"newly_solved": changes["newly_solved"], "lost": changes["regressed"],
            "rates": {r["id"]: [rates[r["id"]], r["pass@1"]] for r in after["puzzles"] if r["id"] in rates},
            "splits": {r["id"]: r.get("split") for r in after["puzzles"] if r["id"] in rates}}


def answers(piece: EvalPiece, report: dict[str, Any]) -> dict[str, Any] | None:
    """What the evaluated answers did, as shares of its completions (rewards.answer_kind: solved,
    no answer, the buggy code given back, an edit toward the fix, another edit), and how large
    their edits were against the fix's (rewards.edit_sizes, under `edit`); None when the set's
    puzzles cannot be read any more (a data file removed)."""
    from ..env.rewards import answer_kind_shares, edit_sizes

    try:
        puzzles = {p.id: p for p in piece.puzzles()}
    except (PuzzleError, TrainSetError, OSError):
        return None
    rows = [r for r in report["puzzles"] if r["id"] in puzzles and r.get("completions")]
    return {**answer_kind_shares(rows, puzzles), "edit": edit_sizes(rows, puzzles)} if rows else None


def run_puzzles(piece: RunPiece) -> dict[str, Puzzle]:
    """The run's training puzzles by id (its pool, before any calibration); empty when they
    cannot be read any more (a data file removed)."""
    from ..rl.rundir import training_puzzles

    try:
        return {p.id: p for p in training_puzzles(piece.config)}
    except (PuzzleError, TrainSetError, OSError):
        return {}


def calibration_entry(run_dir: Path, puzzles: dict[str, Puzzle]) -> dict[str, Any] | None:
    """How the run chose its puzzles, when it calibrated: the count per category (mixed, always
    solved, never solved), the same per mutation family and per source (`bands`), and the
    puzzles it trained on."""
    report, chosen = load_report(run_dir / CALIBRATION_FILE), load_report(run_dir / TRAIN_SET_FILE)
    if report is None:
        return None
    return {"categories": report["categories"], "bands": bands(report, puzzles),
            "train_set": chosen["puzzles"] if chosen else None}


def bands(report: dict[str, Any], puzzles: dict[str, Puzzle]) -> dict[str, dict[str, dict[str, int]]]:
    """The calibration's categories counted per mutation family and per source (the harvest's
    source; "this project" for puzzles written or forged here): where the learnable band lies.
    A grouping with one group only says what `categories` says, and is left out."""
    groups: dict[str, dict[str, Counter]] = {"family": defaultdict(Counter), "source": defaultdict(Counter)}
    for row in report["puzzles"]:
        if (puzzle := puzzles.get(row["id"])) is not None:
            groups["family"][puzzle.family or "hand-written"][row["category"]] += 1
            groups["source"][str((puzzle.source or {}).get("harvest", "this project"))][row["category"]] += 1
    return {key: {name: dict(count) for name, count in sorted(by.items())} for key, by in groups.items() if len(by) > 1}


def visits(rollouts: list[dict[str, Any]]) -> dict[str, list[list[int]]]:
    """Each training puzzle's visits in step order, [step, solved, sampled] per step that sampled
    it (from the run's rollouts.jsonl lines)."""
    counts: dict[str, dict[int, list[int]]] = {}
    for line in rollouts:
        count = counts.setdefault(line["puzzle_id"], {}).setdefault(line["step"], [0, 0])
        count[0] += bool(line["solved"])
        count[1] += 1
    return {puzzle: [[step, *count] for step, count in sorted(by_step.items())]
            for puzzle, by_step in sorted(counts.items())}


def unchanged_shares(rollouts: list[dict[str, Any]], puzzles: dict[str, Puzzle], steps: int) -> list[float | None]:
    """Per step, the share of its completions that hand the buggy code back unchanged
    (rewards.answer_kind): the answer that earns nothing and that repair training should wean
    the model off. None for a step without a line of a puzzle in `puzzles`."""
    from ..env.rewards import Completion, answer_kind

    counts = [[0, 0] for _ in range(steps)]
    for line in rollouts:
        if 1 <= line["step"] <= steps and (puzzle := puzzles.get(line["puzzle_id"])) is not None:
            kind = answer_kind(Completion(puzzle, line.get("code"), None), line["solved"])
            counts[line["step"] - 1][0] += kind == "buggy code unchanged"
            counts[line["step"] - 1][1] += 1
    return [unchanged / n if n else None for unchanged, n in counts]


def only(report: dict[str, Any], ids: set[str]) -> dict[str, Any]:
    return {**report, "puzzles": [r for r in report["puzzles"] if r["id"] in ids]}


def by_training(entry: dict[str, Any], functions: list[str] | None, evaluations: list[Evaluated]) -> None:
    """Split each set's paired change by what the model trained on (`functions`: their entry points,
    rundir.sampled): puzzles of a function it was trained on (the puzzle itself, or another bug
    in the same function) and the rest, which alone say whether what it learned carries over.
    Filled only where a set has both."""
    if not functions:
        return
    trained = set(functions)
    for piece, before, after in evaluations:
        try:
            names = {p.id: p.entry_point for p in piece.puzzles()}
        except (PuzzleError, TrainSetError, OSError):
            continue
        seen = {r["id"] for r in after["puzzles"] if names.get(r["id"]) in trained}
        unseen = {r["id"] for r in after["puzzles"]} - seen
        if seen and unseen:
            entry["by_training"][piece.set_name] = parts_change(before, after, {"trained": seen, "not_trained": unseen})


def by_split(entry: dict[str, Any], evaluations: list[Evaluated]) -> None:
    """Split each set's paired change by the puzzles' split (train / heldout), where a set has
    more than one: one evaluation of all of them samples as it did before the split was read
    (a sampled set drawn in two evaluations would draw other answers)."""
    for piece, before, after in evaluations:
        splits: dict[str, set[str]] = {}
        for row in after["puzzles"]:
            splits.setdefault(row.get("split") or "none", set()).add(row["id"])
        if len(splits) > 1:
            entry["by_split"][piece.set_name] = parts_change(before, after, dict(sorted(splits.items())))


def parts_change(before: dict[str, Any], after: dict[str, Any], parts: dict[str, set[str]]) -> dict[str, Any]:
    """The paired change on each part of a set (puzzle ids by part)."""
    return {part: compare_reports(only(before, ids), only(after, ids))["all"] for part, ids in parts.items()}


def variant_trained_on(variant: Variant) -> list[str] | None:
    """The functions an evaluation-only variant's adapter had trained on: a soup's, its run's; an
    exported adapter's, as its export.json records them; None when unknown (no adapter)."""
    from ..rl.export import EXPORT_FILE, ExportError, run_config
    from ..rl.rundir import trained_on

    if variant.adapter is None:
        return None
    if variant.soup:
        try:
            seen = trained_on(variant.adapter, run_config(variant.adapter))
        except ExportError:  # the run is not there (yet)
            return None
    else:
        seen = (load_report(variant.adapter / EXPORT_FILE) or {}).get("trained_on")
    return seen["functions"] if seen else None


def data_entry(piece: DataPiece) -> dict[str, Any]:
    """What a data step's outputs say of themselves: a harvest's funnel per source (harvest.json:
    licence, version and the count at each stage) and a forge's puzzles per split and family
    (forge.json). Empty for steps that write neither."""
    from ..forge import forge, harvest

    entry: dict[str, Any] = {}
    for out in piece.step.outputs:
        if (record := load_report(out / harvest.SUMMARY_FILE) if out.is_dir() else None) is not None:
            entry["harvest"] = {"sources": {name: {k: source[k] for k in ("licence", "version", "funnel")}
                                            for name, source in record["sources"].items()},
                                "total": record["total"], "seconds": record["seconds"]}
        if (record := load_report(out / forge.SUMMARY_FILE) if out.is_dir() else None) is not None:
            entry["forge"] = {k: record[k] for k in ("seeds", "puzzles", "splits", "seed_functions", "families")}
    return entry


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def seed_mean(by_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The per-setting row: each seed's paired change and their mean (seeds weigh alike)."""
    return {"seeds": by_seed, "runs": len(by_seed),
            "before": mean([c["before"] for c in by_seed.values()]),
            "after": mean([c["after"] for c in by_seed.values()]),
            "mean_change": mean([c["change"] for c in by_seed.values()])}


def run_entry(piece: RunPiece) -> dict[str, Any]:
    """A run's curves and costs from its history.jsonl and wall_time.json, and what it sampled
    from rollouts.jsonl."""
    from ..rl.rundir import sampled
    from ..rl.trainer import sampled_tokens

    history = read_history(piece.run_dir, missing_ok=True)
    rollouts = read_jsonl(piece.run_dir / ROLLOUTS) if (piece.run_dir / ROLLOUTS).is_file() else []
    puzzles = run_puzzles(piece)
    return {"variant": piece.variant, "seed": piece.seed, "steps": len(history),
            "of_steps": piece.config.train.steps,
            "sampled_tokens": sum(sampled_tokens(h, piece.config) for h in history),
            "train_seconds": sum(h.get("step_s", 0.0) for h in history),
            "wall_seconds": wall_seconds(piece.run_dir),
            "peak_memory_gb": max((h["peak_memory_gb"] for h in history if "peak_memory_gb" in h), default=None),
            "curves": {**{k: [h.get(k) for h in history] for k in CURVES},
                       "unchanged": unchanged_shares(rollouts, puzzles, len(history))},
            "calibration": calibration_entry(piece.run_dir, puzzles), "visits": visits(rollouts),
            "trained_on": sampled(rollouts, puzzles, len(history)) if rollouts and puzzles else None,
            "change": {}, "puzzles": {}, "by_training": {}, "by_split": {}}


def evaluated(model: str, pieces: list[Piece], load: Callable[[Path], dict[str, Any] | None]) -> list[Evaluated]:
    """`model`'s evaluations whose report and base evaluation (the same set, asked the same way)
    are both on disk, with those two reports (`load`: one read per file for the whole report)."""
    found = []
    for piece in pieces:
        if isinstance(piece, EvalPiece) and piece.model == model and piece.baseline is not None:
            before, after = load(piece.baseline), load(piece.out)
            if before is not None and after is not None:
                found.append((piece, before, after))
    return found


def paired(entry: dict[str, Any], evaluations: list[Evaluated]) -> bool:
    """Fill `entry`'s paired change from the base and puzzle rows, per set evaluated; whether any was."""
    for piece, before, after in evaluations:
        entry["change"][piece.set_name] = compare_reports(before, after)["all"]
        entry["puzzles"][piece.set_name] = puzzle_rows(before, after)
    return bool(entry["change"])


def collect(experiment: Experiment, pieces: list[Piece]) -> dict[str, Any]:
    """Every number the report shows, from the files on disk (pieces not done yet are left out)."""
    result: dict[str, Any] = {"experiment": str(experiment.path), "name": experiment.name,
                              "about": experiment.about, "base": str(experiment.base) if experiment.base else None,
                              "overrides": experiment.overrides, "sets": {}, "levels": {}, "runs": {},
                              "variants": {}, "pairs": {}, "evaluated": {}, "answers": {}, "costs": {},
                              "data": {p.name: e for p in pieces if isinstance(p, DataPiece) if (e := data_entry(p))}}
    runs = {p.name: p for p in pieces if isinstance(p, RunPiece)}
    load = functools.cache(load_report)  # each evaluation read once, however many tables use it
    reports: dict[tuple[str, str], dict[str, Any]] = {}  # (model, set) -> evaluation report
    for piece in (p for p in pieces if isinstance(p, EvalPiece)):
        report = load(piece.out)
        if report is None:
            continue
        reports[(piece.model, piece.set_name)] = report
        result["levels"].setdefault(piece.model, {})[piece.set_name] = overall(report)
        result["costs"].setdefault(piece.model, {})[piece.set_name] = cost(report)
        result["answers"].setdefault(piece.model, {})[piece.set_name] = answers(piece, report)
        result["sets"].setdefault(piece.set_name, {"about": piece.eval_set.about, **report["settings"],
                                                   "puzzles": len(report["puzzles"])})
    for name, run in runs.items():
        result["runs"][name] = entry = run_entry(run)
        evaluations = evaluated(name, pieces, load)
        if paired(entry, evaluations):
            by_training(entry, (entry["trained_on"] or {}).get("functions"), evaluations)
            by_split(entry, evaluations)
    for variant in (v for v in experiment.variants.values() if not v.trains):
        entry = {"variant": variant.name, "adapter": str(variant.adapter) if variant.adapter else None,
                 "overrides": variant.overrides, "change": {}, "puzzles": {}, "by_training": {}, "by_split": {}}
        evaluations = evaluated(variant.name, pieces, load)
        if paired(entry, evaluations):
            result["evaluated"][variant.name] = entry
            by_training(entry, variant_trained_on(variant), evaluations)
            by_split(entry, evaluations)
    for variant in experiment.variants:
        for set_name in experiment.sets:
            by_seed = {r["seed"]: r["change"][set_name] for r in result["runs"].values()
                       if r["variant"] == variant and set_name in r["change"]}
            if by_seed:
                result["variants"].setdefault(variant, {})[set_name] = seed_mean(by_seed)
    for pair in experiment.pairs:
        matched = pair_models(experiment, runs, pair)
        for set_name in experiment.sets:
            by_seed = {}
            for key, (model, minus) in matched.items():
                before, after = reports.get((minus, set_name)), reports.get((model, set_name))
                if before is not None and after is not None:
                    by_seed[key] = compare_reports(before, after)["all"]
            if by_seed:
                result["pairs"].setdefault(pair.label, {})[set_name] = seed_mean(by_seed)
    return result


def pair_models(experiment: Experiment, runs: dict[str, RunPiece], pair: Pair) -> dict[int | str, tuple[str, str]]:
    """The models a pair compares, (variant's, minus's), keyed by seed: two trained variants meet at
    the seeds both have; an evaluation-only variant (one model, no seed) meets every seed of a
    trained one, or the other evaluation-only variant under the key "adapter"."""
    def models(name: str) -> dict[int | None, str]:
        if not experiment.variants[name].trains:
            return {None: name}
        return {run.seed: run.name for run in runs.values() if run.variant == name}

    ours, theirs = models(pair.variant), models(pair.minus)
    if None in ours and None in theirs:
        return {"adapter": (ours[None], theirs[None])}
    seeds = set(theirs) if None in ours else set(ours) if None in theirs else set(ours) & set(theirs)
    return {seed: (ours.get(seed, ours.get(None)), theirs.get(seed, theirs.get(None))) for seed in sorted(seeds)}


def seed_label(seed: int | str) -> str:
    """s0 for a seed; a pair of two evaluation-only variants has none ("adapter")."""
    return f"s{seed}" if isinstance(seed, int) else seed


def points(x: float) -> str:
    return f"{100 * x:.1f}"


def change_cell(c: dict[str, Any]) -> str:
    low, high = c["ci95"]
    return f"{100 * c['change']:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"


def ids_cell(ids: list[str]) -> str:
    shown = ", ".join(ids[:SHOWN_IDS])
    return (shown + f" (+{len(ids) - SHOWN_IDS} more)" if len(ids) > SHOWN_IDS else shown) or "none"


def markdown(result: dict[str, Any]) -> str:
    """The report's tables, in Markdown."""
    sets = result["sets"]
    lines = [f"# Experiment {result['name']}", "", *([result["about"], ""] if result["about"] else []),
             "## Paired change from the base model (avg@K in %, change in points, 95% bootstrap CI over puzzles)", "",
             "| run | set (puzzles) | K | before | after | change [95% CI] | up / down |", "|---|---|---|---|---|---|---|"]
    for run, entry in {**result["runs"], **result["evaluated"]}.items():
        for s, c in entry["change"].items():
            lines.append(f"| {run} | {s} ({c['puzzles']}) | {sets[s]['samples']} | {points(c['before'])} | "
                         f"{points(c['after'])} | {change_cell(c)} | {c['improved']} / {c['worsened']} |")
    for key, title, column in (
            ("by_split", "The same change, per split of the set's puzzles", "split"),
            ("by_training", "The same change, split by what the model trained on (a function trained on: the "
             "puzzle itself, or another bug in the same function)", "functions")):
        split = [(run, s, part, c) for run, entry in {**result["runs"], **result["evaluated"]}.items()
                 for s, parts in entry.get(key, {}).items() for part, c in parts.items()]
        if split:
            lines += ["", f"## {title}", "",
                      f"| run | set | {column} | puzzles | before | after | change [95% CI] | up / down |",
                      "|---|---|---|---|---|---|---|---|"]
            lines += [f"| {run} | {s} | {part.replace('_', ' ')} | {c['puzzles']} | {points(c['before'])} | "
                      f"{points(c['after'])} | {change_cell(c)} | {c['improved']} / {c['worsened']} |"
                      for run, s, part, c in split]
    for title, rows in (("Per setting: the mean over seeds", result["variants"]),
                        ("Variant minus variant, paired per seed", result["pairs"])):
        if not rows:
            continue
        lines += ["", f"## {title}", "", "| setting | set | seeds | before | after | mean change | per seed |",
                  "|---|---|---|---|---|---|---|"]
        for label, by_set in rows.items():
            for s, row in by_set.items():
                per_seed = ", ".join(f"{seed_label(seed)} {change_cell(c)}" for seed, c in row["seeds"].items())
                lines.append(f"| {label} | {s} | {row['runs']} | {points(row['before'])} | {points(row['after'])} | "
                             f"{100 * row['mean_change']:+.1f} | {per_seed} |")
    evaluated = [(model, s, level, result["costs"][model][s]) for model, by_set in result["levels"].items()
                 for s, level in by_set.items()]
    if evaluated:
        lines += ["", "## Every evaluation: avg@K (%, 95% bootstrap CI over puzzles) and what it cost", "",
                  "| model | set | K | avg@K [95% CI] | answers | tokens | tokens per answer | at the token limit | "
                  "at the answer's end | minutes |", "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {model} | {s} | {sets[s]['samples']} | {points(level[0])} [{points(level[1])}, "
                  f"{points(level[2])}] | {c['answers']} | {c['generated_tokens']:,} | "
                  f"{c['generated_tokens'] / max(c['answers'], 1):.0f} | {c['truncated']} | {c['stopped']} | "
                  f"{c['seconds'] / 60:.1f} |" for model, s, level, c in evaluated]
    lines += ["", "## Puzzles newly solved and lost (no sample passed before / after)", "",
              "| run | set | newly solved | lost |", "|---|---|---|---|"]
    for run, entry in {**result["runs"], **result["evaluated"]}.items():
        for s, rows in entry["puzzles"].items():
            lines.append(f"| {run} | {s} | {len(rows['newly_solved'])}: {ids_cell(rows['newly_solved'])} | "
                         f"{len(rows['lost'])}: {ids_cell(rows['lost'])} |")
    lines += seed_tables(result)
    shares = [(model, s, row) for model, by_set in result["answers"].items() for s, row in by_set.items() if row]
    if shares:
        from ..env.rewards import ANSWER_KINDS

        lines += ["", "## What the answers did (share of completions, %)", "",
                  "| model | set | " + " | ".join(ANSWER_KINDS) + " |", "|---|---|" + "---|" * len(ANSWER_KINDS)]
        lines += [f"| {model} | {s} | " + " | ".join(points(row[k]) for k in ANSWER_KINDS) + " |"
                  for model, s, row in shares]
        edits = [(model, s, row["edit"]) for model, s, row in shares if row.get("edit")]
        if edits:
            lines += ["", "## How large the edits were (changed lines, answers with code)", "",
                      "| model | set | answers | answer's lines | the fix's lines | larger than the fix |",
                      "|---|---|---|---|---|---|"]
            lines += [f"| {model} | {s} | {e['answers']} | {e['answer_lines']:.1f} | {e['fix_lines']:.1f} | "
                      f"{points(e['larger_than_fix'])}% |" for model, s, e in edits]
    for step, entry in result.get("data", {}).items():
        lines += ["", f"## Data: `{step}`"]
        if "harvest" in entry:
            stages = [k for k in FUNNEL if k in entry["harvest"]["total"]]
            lines += ["", "| source | licence | version | " + " | ".join(stages) + " |",
                      "|---|---|---|" + "---:|" * len(stages)]
            lines += [f"| {name} | {s['licence']} | {s['version']} | "
                      + " | ".join(str(s["funnel"].get(k, 0)) for k in stages) + " |"
                      for name, s in entry["harvest"]["sources"].items()]
            total = entry["harvest"]["total"]
            lines.append("| **all** | | | " + " | ".join(f"**{total[k]}**" for k in stages) + " |")
        if "forge" in entry:
            f = entry["forge"]
            lines += ["", f"{f['puzzles']} puzzles from {f['seeds']} seed functions: "
                      + ", ".join(f"{split} {n} ({f['seed_functions'].get(split, 0)} functions)"
                                  for split, n in f["splits"].items())
                      + "; kept per family: "
                      + ", ".join(f"{family} {c['kept']}" for family, c in f["families"].items())]
    lines += ["", "## Runs", "", "| run | steps | sampled tokens | training time | wall time | peak memory | "
              "reward, first -> last step |", "|---|---|---|---|---|---|---|"]
    for run, entry in result["runs"].items():
        rewards = [r for r in entry["curves"]["reward_mean"] if r is not None]
        wall = entry["wall_seconds"]
        peak = entry["peak_memory_gb"]
        lines.append(f"| {run} | {entry['steps']} of {entry['of_steps']} | {entry['sampled_tokens']:,} | "
                     f"{entry['train_seconds'] / 60:.1f} min | {'n/a' if wall is None else f'{wall / 60:.1f} min'} | "
                     f"{'n/a' if peak is None else f'{peak:.2f} GB'} | "
                     + (f"{rewards[0]:.3f} -> {rewards[-1]:.3f} |" if rewards else "n/a |"))
    revisited = [(run, puzzle, seen) for run, e in result["runs"].items()
                 for puzzle, seen in e.get("visits", {}).items() if len(seen) > 1]
    if revisited:
        lines += ["", "## Training puzzles visited more than once (solved of sampled, per visit)", "",
                  "| run | puzzle | first visit | last visit | every visit (step: solved) |", "|---|---|---|---|---|"]
        lines += [f"| {run} | {puzzle} | {seen[0][1]}/{seen[0][2]} | {seen[-1][1]}/{seen[-1][2]} | "
                  + ", ".join(f"{step}: {solved}" for step, solved, _ in seen) + " |"
                  for run, puzzle, seen in revisited]
    calibrated = {run: e["calibration"] for run, e in result["runs"].items() if e.get("calibration")}
    if calibrated:
        lines += ["", "## Calibration", ""]
        lines += [f"- {run}: " + ", ".join(f"{k} {n}" for k, n in c["categories"].items())
                  + (f"; trained on {len(c['train_set'])}: {ids_cell(c['train_set'])}" if c["train_set"] else "")
                  for run, c in calibrated.items()]
        from ..rl.rollouts import ALL_FAILED, ALL_SOLVED, MIXED

        for run, c in calibrated.items():
            for key, by in c.get("bands", {}).items():
                lines += ["", f"{run}, by {key}:", "", f"| {key} | puzzles | mixed (learnable) | all solved | "
                          "all failed | mixed share |", "|---|---|---|---|---|---|"]
                lines += [f"| {name} | {sum(n.values())} | {n.get(MIXED, 0)} | {n.get(ALL_SOLVED, 0)} | "
                          f"{n.get(ALL_FAILED, 0)} | {points(n.get(MIXED, 0) / sum(n.values()))}% |"
                          for name, n in by.items()]
    return "\n".join(lines) + "\n"


SEED_TABLE_PUZZLES = 60  # larger sets keep their per-puzzle rows in report.json only


def seed_tables(result: dict[str, Any]) -> list[str]:
    """The seed's table for each set of at most SEED_TABLE_PUZZLES puzzles: every puzzle's avg@K
    (%) before training and after, for every model evaluated on it, newly solved and lost marked."""
    lines: list[str] = []
    entries = {**result["runs"], **result["evaluated"]}
    for s, info in result["sets"].items():
        models = {name: e["puzzles"][s] for name, e in entries.items() if s in e["puzzles"]}
        if not models or info["puzzles"] > SEED_TABLE_PUZZLES:
            continue
        first = next(iter(models.values()))
        lines += ["", f"## Per puzzle on {s}, avg@{info['samples']} in % (the seed's table: new = newly solved, "
                  "lost = no longer solved)", "", "| puzzle | split | base | " + " | ".join(models) + " |",
                  "|---|---|---|" + "---|" * len(models)]
        for puzzle, (before, _) in first["rates"].items():
            cells = []
            for rows in models.values():
                after = rows["rates"].get(puzzle, [None, None])[1]
                mark = " new" if puzzle in rows["newly_solved"] else " lost" if puzzle in rows["lost"] else ""
                cells.append("n/a" if after is None else f"{points(after)}{mark}")
            lines.append(f"| {puzzle} | {first['splits'].get(puzzle) or ''} | {points(before)} | "
                         + " | ".join(cells) + " |")
    return lines


def write_report(experiment: Experiment, pieces: list[Piece]) -> list[Path]:
    """report.json, report.md and (when a run has steps) report.png in the output directory."""
    from .figure import draw

    result = collect(experiment, pieces)
    out = experiment.output_dir
    write_json_atomic(out / "report.json", result)
    (out / "report.md").write_text(markdown(result))
    written = [out / "report.json", out / "report.md"]
    if any(entry["steps"] for entry in result["runs"].values()):
        written.append(draw(result, out / "report.png"))
    return written
