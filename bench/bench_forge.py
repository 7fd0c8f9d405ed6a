"""Benchmark: forging and validating at least 1,000 candidate mutants (target: 60 s on 2 cores).

Runs the forge on the bundled seed bank and puzzles, as `mlx-swe-rl puzzles forge` does,
with `--per-seed` chosen so that at least `--candidates` mutants go through the scorer (two
runs each). Prints mutant generation, the seeds' oracle runs and validation separately, and
writes JSON. Not a test: `python bench/bench_forge.py`.
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import click

from common import machine, machine_line, print_table, write_result
from mlx_swe_rl.forge.forge import ForgeSettings, candidates, forge, write_forged
from mlx_swe_rl.forge.seeds import BUNDLED_SEEDS, load_seeds
from mlx_swe_rl.puzzles.format import default_puzzle_dir
from mlx_swe_rl.sandbox.scorer import Scorer

TARGET_S = 60.0


@click.command()
@click.option("--candidates", "wanted", default=1000, show_default=True, help="Mutants to validate, at least.")
@click.option("--workers", default=None, type=int, help="Sandbox processes (default: one per core).")
@click.option("--out", default="outputs/bench/forge.json", show_default=True, type=click.Path(path_type=Path))
def main(wanted: int, workers: int | None, out: Path) -> None:
    info = machine()
    click.echo(machine_line(info))
    start = time.perf_counter()
    seeds = load_seeds([BUNDLED_SEEDS, default_puzzle_dir()])
    # the forge validates about 1.25 candidates per kept puzzle, plus the rejected ones
    settings = ForgeSettings(per_seed=max(1, math.ceil(wanted / len(seeds) / 1.25)))
    t = time.perf_counter()
    generated = sum(len(candidates(s, settings)) for s in seeds)
    generate_s = time.perf_counter() - t
    validated = [0]
    with Scorer(workers) as scorer:
        t = time.perf_counter()
        result = forge(seeds, scorer, settings, progress=lambda n: validated.__setitem__(0, validated[0] + n))
        forge_s = time.perf_counter() - t
        confinement = scorer.confinement
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        write_forged(result, Path(tmp) / "set")
        write_s = time.perf_counter() - t
    total = time.perf_counter() - start
    rows = [
        {"phase": "load seeds + generate every mutant (timed once more)", "seconds": generate_s, "count": generated},
        {"phase": "forge: oracles, mutants, validation (2 runs each)", "seconds": forge_s, "count": validated[0]},
        {"phase": "write puzzle files", "seconds": write_s, "count": len(result.puzzles)},
        {"phase": "whole benchmark", "seconds": total, "count": None},
    ]
    print_table(rows, [("phase", "phase", ""), ("seconds", "seconds", ".1f"), ("count", "count", "d")],
                echo=click.echo)
    rate = validated[0] / forge_s
    met = validated[0] >= wanted and forge_s <= TARGET_S
    click.echo(f"{len(seeds)} seeds, per-seed {settings.per_seed}: {validated[0]} candidates validated in "
               f"{forge_s:.1f} s ({rate:.1f}/s; sandbox: {confinement}), {len(result.puzzles)} puzzles kept. "
               f"Target: {wanted} in <= {TARGET_S:.0f} s: {'met' if met else 'not met'}")
    write_result(out, {"machine": info, "confinement": confinement, "seeds": len(seeds),
                       "per_seed": settings.per_seed, "candidates_validated": validated[0],
                       "mutants_generated": generated, "puzzles_kept": len(result.puzzles),
                       "forge_s": forge_s, "generate_s": generate_s, "write_s": write_s, "total_s": total,
                       "candidates_per_s": rate, "target_s": TARGET_S, "met": met})
    click.echo(f"wrote {out}")


if __name__ == "__main__":
    main()
