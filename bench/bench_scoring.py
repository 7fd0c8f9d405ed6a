"""Benchmark: how long the sandbox takes to score 360 candidates (45 puzzles x 8).

Each puzzle gets 8 candidates: 4 copies of its oracle and 4 of its buggy code, so the
run includes real failures, exceptions and (for a hanging bug) timeouts. Prints a table
and writes JSON. Not a test: run it by hand, `python bench/bench_scoring.py`.

`--overhead` also times the same workload unconfined, alternating the two scorers repeat by
repeat, and prints what confinement costs per candidate.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path

import click

from common import write_result  # first: it loads OpenBLAS, which must precede mlx.core

from mlx_swe_rl.puzzles.format import load_puzzles
from mlx_swe_rl.sandbox.scorer import Scorer


@click.command()
@click.option("--puzzles", "n_puzzles", default=45, show_default=True, help="Number of puzzles.")
@click.option("--group", default=8, show_default=True, help="Candidates per puzzle.")
@click.option("--repeats", default=3, show_default=True, help="Timed repeats (median reported).")
@click.option("--workers", default=None, type=int, help="Sandbox processes (default: one per core).")
@click.option("--confinement", default="auto", show_default=True,
              type=click.Choice(["auto", "landlock", "namespaces", "seatbelt", "none"]))
@click.option("--overhead", is_flag=True, help="Also time the workload unconfined, alternating, and print the cost.")
@click.option("--out", default="outputs/bench_scoring.json", show_default=True, type=click.Path(path_type=Path))
def main(n_puzzles: int, group: int, repeats: int, workers: int | None, confinement: str, overhead: bool,
         out: Path) -> None:
    puzzles = load_puzzles()[:n_puzzles]
    items = [(p, p.oracle if i < group // 2 else p.buggy) for p in puzzles for i in range(group)]
    hanging = [p.id for p in puzzles if p.timeout]
    start = time.perf_counter()
    with Scorer(workers, confinement=confinement) as scorer:
        scorer.run_many(items[:1])
        scorer.expectations(puzzles)
        cold = time.perf_counter() - start  # worker start-up + every oracle's expected values
        times, passed = [], 0
        for _ in range(repeats):
            t = time.perf_counter()
            runs = scorer.run_many(items)
            times.append(time.perf_counter() - t)
            passed = sum(r.all_passed for r in runs)
        no_hang = [(p, c) for p, c in items if not p.timeout]
        t = time.perf_counter()
        scorer.run_many(no_hang)
        no_hang_s = time.perf_counter() - t
        size = scorer.sandbox.size
        mode = scorer.confinement
        cost = confinement_cost(scorer, items, workers, repeats) if overhead else None
    result = {
        "workload": f"{len(puzzles)} puzzles x {group} candidates (half oracle, half buggy)",
        "candidates": len(items),
        "workers": size,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "machine": f"{platform.system()} {platform.machine()}",
        "confinement": mode,
        "startup_and_oracles_s": round(cold, 3),
        "score_s_median": round(statistics.median(times), 3),
        "score_s_all": [round(t, 3) for t in times],
        "candidates_per_s": round(len(items) / statistics.median(times), 1),
        "all_passed": passed,
        "hanging_puzzles": hanging,
        "score_s_without_hanging": round(no_hang_s, 3),
        "target_s": 8.0,
    }
    if cost is not None:
        result.update(cost)
    width = max(len(k) for k in result)
    for key, value in result.items():
        click.echo(f"{key:<{width}}  {value}")
    write_result(out, result, click.echo)
    click.echo(f"wrote {out}")


def confinement_cost(scorer: Scorer, items: list, workers: int | None, repeats: int) -> dict:
    """Median seconds of the workload confined and unconfined, timed alternately (so drift
    in the machine's speed hits both), and the difference per candidate in milliseconds.
    The workers run in parallel, so the per-candidate figure is wall time per candidate."""
    confined, plain = [], []
    with Scorer(workers, confinement="none") as unconfined:
        unconfined.run_many(items[:1])
        for _ in range(repeats):
            for box, times in ((unconfined, plain), (scorer, confined)):
                t = time.perf_counter()
                box.run_many(items)
                times.append(time.perf_counter() - t)
    c, u = statistics.median(confined), statistics.median(plain)
    return {"unconfined_score_s_median": round(u, 3), "confined_score_s_median": round(c, 3),
            "confinement_ms_per_candidate": round((c - u) / len(items) * 1000, 3),
            "confinement_overhead_pct": round((c / u - 1) * 100, 1)}


if __name__ == "__main__":
    main()
