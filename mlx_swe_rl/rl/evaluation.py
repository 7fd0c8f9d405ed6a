"""Evaluate a model on the puzzles (the `eval` command and the trainer's before/after).

Greedy by default (one completion per puzzle at temperature 0). With `--samples K` it draws K
completions per puzzle and reports pass@1 and the unbiased pass@K per puzzle. Every completion,
its extracted code, test results and reward go to a JSON file, so figures and comparisons are
drawn from recorded data. The trainer evaluates through `evaluate` too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from ..env.codefix import CodeFixEnv
from ..models import fastmath
from ..models.sampling import SampleStats
from ..puzzles.format import Puzzle
from .journal import Journal, journal_path
from .rollouts import (END, JOIN, WAIT, Decision, Driver, Episode, LiveEpisode, collect_rollouts, decide_once,
                       open_groups, plan_driver)
from .config import Config, SamplingPlan
from ..runfiles import run_metadata, write_json_atomic
from .stats import bootstrap_ci, compare_reports, format_changes


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021): 1 - C(n-c, k) / C(n, k), for c correct of n samples."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def evaluate(model: Any, tokenizer: Any, env: CodeFixEnv, puzzles: list[Puzzle], plan: SamplingPlan, *,
             best_of_n: bool = False, progress: bool = True, journal: Journal | None = None) -> dict[str, Any]:
    """Sample and score, and return the report: per-puzzle results with every completion,
    and totals per tier and split. `plan.group_size` is the samples per puzzle (K of avg@K).
    With `plan.stop_after_answer` completions end where their answer does (the block the
    answer is read from), so the prose after it is never generated.

    `plan.max_turns` > 1 (an env with a test split) evaluates multi-turn repair: each episode
    answers up to that many times, reading the public tests' feedback; a puzzle's pass@1 is
    then the share of episodes solved (on the hidden tests) within those answers, and
    `multi_turn` holds the per-turn totals (`turn_totals`). `best_of_n` adds the compute-matched
    baseline: as many independent single-turn answers per episode, the first that passes the
    public tests (else the last) judged on the hidden tests.

    `journal` (single-turn, no best-of-n): each puzzle's row is recorded there as soon as its K
    answers are scored, and the puzzles it already holds are not sampled again (`rl.journal`);
    `timing` then counts every sitting's seconds and tokens and says how many there were."""
    start = time.perf_counter()
    samples, turns = plan.group_size, plan.max_turns
    split = getattr(env, "split", None)
    if journal is not None and (turns > 1 or best_of_n):
        raise ValueError("an evaluation journal needs single-turn episodes without best-of-n")
    report_extra: dict[str, Any] = {}
    if journal is None:
        batch = collect_rollouts(model, tokenizer, env, puzzles, plan, progress=progress, desc="eval")
        stats = batch.stats
        rows = [puzzle_row(puzzle, group, samples, split) for puzzle, group in zip(puzzles, batch.groups)]
        if turns > 1:
            report_extra["multi_turn"] = turn_totals([r for g in batch.groups for r in g], turns)
    else:
        stats = _journalled(model, tokenizer, env, [p for p in puzzles if p.id not in journal.rows], plan,
                            progress, journal, split)
        rows = [journal.rows[p.id] for p in puzzles]
    if best_of_n:
        report_extra["best_of_n"] = best_of_public(model, tokenizer, env, puzzles, plan, progress=progress)
    earlier = journal.earlier if journal else []
    return {
        "settings": {"samples": samples, "temperature": plan.temperature, "max_tokens": plan.max_tokens,
                     "seed": plan.seed, "stop_after_answer": plan.stop_after_answer,
                     **({"turns": turns, "split": dataclasses.asdict(split)} if turns > 1 else {})},
        # a resumed evaluation: seconds and tokens count every sitting (an earlier one up to its last
        # finished puzzle: what came after was lost), the other figures this sitting's alone
        "timing": {"seconds": time.perf_counter() - start + sum(e["seconds"] for e in earlier),
                   "sampling_seconds": stats.seconds, "prefill_seconds": stats.prefill_seconds,
                   "generated_tokens": stats.generated_tokens + sum(e["generated_tokens"] for e in earlier),
                   "tokens_per_second": stats.tokens_per_second,
                   "peak_memory_gb": stats.peak_memory_gb, "truncated": stats.truncated,
                   "stopped": stats.stopped,
                   **({"sessions": len(earlier) + 1, "earlier_sessions": earlier} if earlier else {})},
        "totals": totals(rows, samples),
        # puzzles that could not be scored: counted as unsolved in the totals, named here
        "errored": [{"id": r["id"], "completions": r["errored"], "error": r["error"]} for r in rows if "error" in r],
        **report_extra,
        "puzzles": rows,
    }


def open_journal(out: Path, puzzles: list[Puzzle], plan: SamplingPlan, adapter: Path | None = None,
                 **asked: Any) -> Journal:
    """The journal of the evaluation that writes `out` (OUT.journal.jsonl beside it): who was
    asked and how (`adapter`, and `asked`: model, dtype, prompt, JSON-ready), the plan and the
    puzzles; an interrupted evaluation's rows when it is the same one, JournalError otherwise.
    The adapter counts by its weight files' sizes and times too: a run that trained on in
    between (its adapters rewritten in place) is another evaluation."""
    weights = sorted(Path(adapter).glob("*.safetensors")) if adapter is not None else []
    header = {**asked, "adapter": adapter and str(adapter),
              "adapter_files": [[w.name, w.stat().st_size, w.stat().st_mtime_ns] for w in weights],
              "plan": dataclasses.asdict(plan), "puzzles": [p.id for p in puzzles]}
    return Journal.open(journal_path(out), header, what="evaluation")


def _journalled(model: Any, tokenizer: Any, env: CodeFixEnv, todo: list[Puzzle], plan: SamplingPlan,
                progress: bool, journal: Journal, split: Any = None) -> SampleStats:
    """Sample the puzzles `todo` single-turn, each puzzle's row going to the journal as soon as
    its K answers are scored (`split`: the env's test split, as `puzzle_row` takes it); returns
    the sampling totals."""
    if not todo:
        return SampleStats()

    def finished(p: int, group: list[Episode]) -> None:
        journal.add(puzzle_row(todo[p], group, plan.group_size, split))

    driver = plan_driver(model, tokenizer, env, todo, plan, progress, "eval")
    return driver.run(Groups(open_groups(driver, plan), plan, finished))


def puzzle_row(puzzle: Puzzle, group: list[Episode], samples: int, split: Any = None) -> dict[str, Any]:
    """A puzzle's row of the report: its K episodes' solves, pass@1 and pass@K, mean reward and
    every completion (`split`: the env's test split of multi-turn evaluations)."""
    solved = sum(r.solved for r in group)
    errors = [r.error for r in group if r.error]
    return {
        "id": puzzle.id, "tier": puzzle.tier, "split": puzzle.split, "family": puzzle.family,
        "samples": len(group), "solved": solved,
        "pass@1": pass_at_k(len(group), solved, 1),
        f"pass@{samples}": pass_at_k(len(group), solved, samples),
        "mean_reward": sum(r.reward for r in group) / len(group),
        **({"public_tests": list(split.public_indices(puzzle))} if split is not None else {}),
        **({"errored": len(errors), "error": errors[0]} if errors else {}),
        "completions": [r.record() for r in group],
    }


class Groups:
    """A journalled evaluation's policy (single-turn): nothing is held, and once a puzzle's K
    answers have all finished they are scored together and `finished(p, episodes)` is told,
    so its row can be recorded before the rest of the batch is done. Scoring sooner changes no
    sample: the engine never waits on it."""

    def __init__(self, groups: list[list[LiveEpisode]], plan: SamplingPlan,
                 finished: Callable[[int, list[Episode]], None]):
        self.groups, self.plan, self.finished = groups, plan, finished
        self.left = [len(group) for group in groups]

    def answered(self, driver: Driver, live: LiveEpisode) -> None:
        self.left[live.index] -= 1
        if self.left[live.index] == 0:
            group = self.groups[live.index]
            for answer in group:
                driver.verdict(answer)
            self.finished(live.index, [a.episode(driver.puzzles[live.index].id, self.plan.turn_penalty)
                                       for a in group])

    def decide(self, driver: Driver, live: LiveEpisode) -> Decision:
        return END  # single-turn: no request is ever held


def evaluate_run(model: Any, tokenizer: Any, env: CodeFixEnv, puzzles: list[Puzzle], cfg: Config, name: str,
                 label: str, progress: bool, log: Callable[[str], None]) -> dict[str, Any] | None:
    """A training run's evaluation `name` (before, step-N, after), written to eval-NAME.json in
    the run directory with the settings of `cfg.train`. Rank 0 evaluates (and logs); the other
    ranks wait for it, without a time limit. After training, the paired change from the
    'before' evaluation goes with it."""
    from . import distributed as dist

    report = None
    if dist.is_main():
        run_dir = cfg.run_dir
        model.eval()
        report = evaluate(model, tokenizer, env, puzzles, cfg.eval_sampling(), progress=progress)
        meta = run_metadata(cfg.model.spec, run_dir, cfg.model.dtype, fastmath.patched())
        report = {"meta": {**meta, "eval": name}, **report}
        before_path = run_dir / "eval-before.json"
        if name == "after" and before_path.is_file():
            report["change_vs_before"] = compare_reports(json.loads(before_path.read_text()), report)
        write_json_atomic(run_dir / f"eval-{name}.json", report)
        log(_eval_line(label, report))
        if "change_vs_before" in report:
            log(format_changes(report["change_vs_before"], "change from before training (paired, 95% CI):"))
    dist.barrier(f"rank 0's evaluation '{name}'", timeout=False)
    return report


def turn_totals(episodes: list[Episode], turns: int) -> dict[str, Any]:
    """Per-turn totals of multi-turn episodes: the share solved (hidden tests) after each turn
    (an episode that ended early keeps its last answer), the fix rate (episodes whose first
    answer failed and whose last one passed), the break rate (answers that passed the public
    tests but failed the hidden ones), identical resubmissions (a later answer whose code equals
    the one before, formatting aside), turns used, and episodes dropped for a template mismatch."""
    from ..env.rewards import normalise_source

    n = len(episodes)
    solved_after = [sum(e.turns[min(t, len(e.turns)) - 1].verdict.solved for e in episodes) / n
                    for t in range(1, turns + 1)]
    first_failed = [e for e in episodes if not e.turns[0].verdict.solved]
    answers = [t for e in episodes for t in e.turns]
    public_ok = [t for t in answers if t.verdict.public_ok and t.verdict.public_tests]
    later = [(a, b) for e in episodes for a, b in zip(e.turns, e.turns[1:])]
    same = sum(a.verdict.code is not None and b.verdict.code is not None
               and normalise_source(a.verdict.code) == normalise_source(b.verdict.code) for a, b in later)
    return {
        "turns": turns,
        "episodes": n,
        "solved_after_turn": solved_after,
        "solved_turn_1": solved_after[0],
        f"solved_within_{turns}": solved_after[-1],
        "fix_rate": sum(e.solved for e in first_failed) / len(first_failed) if first_failed else None,
        "break_rate": sum(not t.verdict.solved for t in public_ok) / len(public_ok) if public_ok else None,
        "identical_resubmissions": same / len(later) if later else None,
        "mean_turns": len(answers) / n,
        "dropped": sum(e.dropped for e in episodes),
    }


def best_of_public(model: Any, tokenizer: Any, env: CodeFixEnv, puzzles: list[Puzzle], plan: SamplingPlan, *,
                   progress: bool = True) -> dict[str, Any]:
    """The compute-matched baseline of an N-turn evaluation (`plan`: K episodes of N turns): up
    to N independent answers per episode (single-turn, fresh from the prompt), the next drawn
    only when the one before failed the public tests; the first that passes them, else the
    last, is judged on the hidden tests. `generated_tokens` counts the answers drawn."""
    samples, n = plan.group_size, plan.max_turns
    # the driver reads the plan's engine settings and stop rule only: the chains set the answers
    driver = plan_driver(model, tokenizer, env, puzzles, plan, progress, "best of n")
    retries = Retries(n)
    chains = [[retries.open(driver, p) for _ in range(samples)] for p in range(len(puzzles))]
    stats = driver.run(retries)
    per_puzzle = []
    for puzzle, episodes in zip(puzzles, chains):
        picks = []
        for chain in episodes:
            drawn = [live for live in chain if live.samples]
            pick = next((live for live in drawn if live.verdicts[-1].public_ok), drawn[-1])
            picks.append(pick.episode(puzzle.id, 0.0).solved)
        per_puzzle.append({"id": puzzle.id, "solved": sum(picks), "samples": samples})
    rates = [p["solved"] / p["samples"] for p in per_puzzle]
    mean, low, high = bootstrap_ci(rates)
    return {"n": n, "pass@1": mean, "ci95": [low, high], "generated_tokens": stats.generated_tokens,
            "puzzles": per_puzzle}


class Retries:
    """Best-of-public's policy: an episode is a chain of up to `n` independent answers to one
    puzzle, each a new request from the prompt (another random draw, not a later turn). The
    first decodes at once; each later one waits, held in its place, and joins only when the one
    before it has failed the public tests (it ends when that one passed, or itself ended)."""

    def __init__(self, n: int):
        self.n = n
        self.chains: list[list[LiveEpisode]] = []
        self.decided: dict[int, Decision] = {}  # by tag: chain * n + attempt

    def open(self, driver: Driver, p: int) -> list[LiveEpisode]:
        """Queue one episode's chain for puzzle `p`: the first answer, then the held retries."""
        chain = len(self.chains)
        self.chains.append([driver.open(p, held=i > 0, tag=chain * self.n + i) for i in range(self.n)])
        return self.chains[-1]

    def answered(self, driver: Driver, live: LiveEpisode) -> None:
        pass

    def decide(self, driver: Driver, live: LiveEpisode) -> Decision | None:
        return decide_once(self.decided, live.tag, lambda: self._gate(driver, live.tag))

    def _gate(self, driver: Driver, tag: int) -> Decision | None:
        before = self.chains[tag // self.n][tag % self.n - 1]
        if self.decided.get(tag - 1) is END:
            return END  # the answer before it was never drawn
        if not before.samples:
            return WAIT  # still decoding
        return END if driver.verdict(before).public_ok else JOIN


def format_turns(report: dict[str, Any]) -> list[str]:
    """The per-turn lines of a multi-turn evaluation."""
    m, split = report["multi_turn"], report["settings"]["split"]

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    lines = [f"\nmulti-turn repair: up to {m['turns']} answers, reward on {split['reward_on']} tests, "
             f"{'detailed' if split['detailed'] else 'generic'} feedback",
             "solved after turn " + ", ".join(f"{t}: {v:.3f}" for t, v in enumerate(m["solved_after_turn"], 1)),
             f"fix rate (first answer failed, last passed) {rate(m['fix_rate'])}; break rate (public passed, "
             f"hidden failed) {rate(m['break_rate'])}; identical resubmissions {rate(m['identical_resubmissions'])}; "
             f"{m['mean_turns']:.2f} answers per episode; {m['dropped']} dropped (template mismatch)"]
    if "best_of_n" in report:
        b = report["best_of_n"]
        lines.append(f"best of {b['n']} independent answers by public tests: {b['pass@1']:.3f} "
                     f"[{b['ci95'][0]:.3f}, {b['ci95'][1]:.3f}] ({b['generated_tokens']} tokens)")
    return lines


def read_report(path: Path) -> dict[str, Any]:
    """An evaluation report written earlier, or ValueError naming the file."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read an evaluation report: {exc}") from None
    if not isinstance(report, dict) or not isinstance(report.get("puzzles"), list):
        raise ValueError(f"{path}: not an evaluation report (no 'puzzles' list)")
    return report


def totals(rows: list[dict[str, Any]], samples: int) -> list[dict[str, Any]]:
    """Mean pass@1 (avg@K when sampled) with its 95% bootstrap interval over puzzles, pass@K
    and solved puzzles per (tier, split), per split, and overall; then per mutator family for
    forged puzzles (rows with "family" instead of "tier")."""
    key_k = f"pass@{samples}"
    buckets: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        for tier in (row["tier"], "all"):
            for split in (row["split"], "all"):
                buckets[(tier, split)].append(row)
    order = {"easy": 0, "medium": 1, "hard": 2, "all": 9}
    out = sorted((_bucket({"tier": tier, "split": split}, members, key_k)
                  for (tier, split), members in buckets.items()),
                 key=lambda t: (order.get(t["tier"], 5), t["tier"], t["split"] == "all", t["split"]))
    families: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row.get("family"):
            families[row["family"]].append(row)
    return out + [_bucket({"family": f, "split": "all"}, families[f], key_k) for f in sorted(families)]


def _bucket(label: dict[str, str], members: list[dict[str, Any]], key_k: str) -> dict[str, Any]:
    mean, low, high = bootstrap_ci([r["pass@1"] for r in members])
    return {**label, "puzzles": len(members),
            "pass@1": mean, "ci95": [low, high],
            key_k: sum(r[key_k] for r in members) / len(members),
            "any_solved": sum(r["solved"] > 0 for r in members)}


def format_report(report: dict[str, Any]) -> str:
    """The per-puzzle table and the totals, as printed by the command."""
    samples = report["settings"]["samples"]
    key_k = f"pass@{samples}"
    rows = report["puzzles"]
    width = max([len(r["id"]) for r in rows] + [6])
    tier_width = max([len(r["tier"]) for r in rows] + [6])
    lines = [f"{'puzzle':<{width}}  {'tier':<{tier_width}}  {'split':<7}  {'solved':>7}  {'pass@1':>6}"
             + (f"  {key_k:>7}" if samples > 1 else "") + f"  {'reward':>6}  {'tokens':>6}"]
    for r in rows:
        tokens = sum(c["num_tokens"] for c in r["completions"]) / len(r["completions"])
        lines.append(f"{r['id']:<{width}}  {r['tier']:<{tier_width}}  {r['split']:<7}  "
                     f"{r['solved']:>3}/{r['samples']:<3}  {r['pass@1']:>6.2f}"
                     + (f"  {r[key_k]:>7.2f}" if samples > 1 else "")
                     + f"  {r['mean_reward']:>6.2f}  {tokens:>6.0f}")
    lines.append("")
    group_width = max([len(t.get("tier") or t["family"]) for t in report["totals"]] + [6])
    rate = f"avg@{samples}" if samples > 1 else "pass@1"  # the mean sampled pass@1 over K samples
    kind = None
    for t in report["totals"]:  # tier rows, then (forged sets) family rows, each under its header
        if ("tier" if "tier" in t else "family") != kind:
            kind = "tier" if "tier" in t else "family"
            lines.append(("" if kind == "tier" else "\n") + f"{kind:<{group_width}}  {'split':<7}  {'puzzles':>7}  "
                         f"{rate:>6}  {'95% CI':>14}" + (f"  {key_k:>7}" if samples > 1 else "")
                         + f"  {'solved (any sample)':>19}")
        low, high = t["ci95"]
        lines.append(f"{t[kind]:<{group_width}}  {t['split']:<7}  {t['puzzles']:>7}  {t['pass@1']:>6.3f}  "
                     f"[{low:.3f}, {high:.3f}]" + (f"  {t[key_k]:>7.3f}" if samples > 1 else "")
                     + f"  {t['any_solved']:>10}/{t['puzzles']}")
    for e in report.get("errored") or []:
        lines.append(f"\nnot scored (counted as unsolved): {e['id']}, {e['completions']} completion(s): {e['error']}")
    if "multi_turn" in report:
        lines += format_turns(report)
    timing = report["timing"]
    lines.append(f"\n{timing['generated_tokens']} tokens in {timing['sampling_seconds']:.1f}s sampling "
                 f"({timing['tokens_per_second']:.1f} tok/s), {timing['seconds']:.1f}s in all")
    return "\n".join(lines)


def _eval_line(name: str, report: dict[str, Any]) -> str:
    parts = [f"{t['tier']}/{t['split']} {t['pass@1']:.2f}" for t in report["totals"]
             if t.get("tier", "all") != "all"]
    samples = report["settings"]["samples"]
    return f"{'greedy' if samples == 1 else f'avg@{samples}'} eval {name}: " + ", ".join(parts)
