"""The benchmark suite in one command: `python bench/suite.py` (about an hour on a 2-core CPU).

Runs each benchmark in its own process (so one's memory peak cannot leak into another's),
each printing its own table and writing outputs/bench/<name>.json, then prints one summary
against the issue's targets. `--only w1,sampling` picks a subset; `--quick` shrinks W2 to
2 layers for a smoke run (its figures are then not the 1.5B ones).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import click

HERE = Path(__file__).resolve().parent
BENCHMARKS = {
    "w1": ("bench_step.py", []),
    "w2": ("bench_memory.py", ["--mode", "both"]),
    "sampling": ("bench_sampling.py", []),
    "scoring": ("bench_scoring.py", ["--overhead"]),
    "forge": ("bench_forge.py", []),
    "decode": ("bench_decode.py", []),
    "eval": ("bench_eval_sampling.py", []),
}


def summary_rows(results: dict[str, dict]) -> list[tuple[str, str, str, str]]:
    """(figure, measured, target, verdict) for every result that ran."""
    rows = []
    if "w1" in results:
        w1 = results["w1"]
        step, peak, target = w1["phases_median_s"]["whole step"], w1["peak_memory_gb"], w1["targets"]
        rows.append(("W1 median step", f"{step:.1f} s", f"<= {target['step_s']} s",
                     "met" if step <= target["step_s"] else "not met"))
        rows.append(("W1 peak memory", f"{peak:.2f} GB", f"<= {target['peak_memory_gb']} GB",
                     "met" if peak <= target["peak_memory_gb"] else "not met"))
    if "w2" in results:
        for run in results["w2"].get("rows", []):
            target = run.get("target_gb")
            verdict = "-" if target is None else ("met" if run["peak_gb"] <= target else "not met")
            rows.append((f"W2 peak, {run['mode']} + KL (micro-batch {run['micro_batch']}, {run['layers']} layers)",
                         f"{run['peak_gb']:.2f} GB", f"<= {target} GB" if target else "-", verdict))
    if "sampling" in results:
        s = results["sampling"]
        rates = s["tokens_per_second"]
        rows.append(("sampler vs mlx_lm.batch_generate (no sharing)", f"{s['gap']:+.1%}", "no slower than 5%",
                     "met" if s["gap"] >= -0.05 else "not met"))
        rows.append(("sampler with prefix sharing", f"{rates['ours']:.1f} tok/s", "-", "-"))
        p = s["prefill_seconds"]
        rows.append((f"prefill {s['prefill_tokens']} tok x G={s['group_size']}: shared / not",
                     f"{p['shared']:.2f} / {p['not_shared']:.2f} s", "-", "-"))
    if "scoring" in results:
        sc = results["scoring"]
        rows.append((f"scoring {sc['candidates']} candidates", f"{sc['score_s_median']:.2f} s",
                     f"<= {sc['target_s']} s", "met" if sc["score_s_median"] <= sc["target_s"] else "not met"))
        if "confinement_ms_per_candidate" in sc:
            rows.append(("confinement cost per candidate", f"{sc['confinement_ms_per_candidate']:.2f} ms", "<= 2 ms",
                         "met" if sc["confinement_ms_per_candidate"] <= 2 else "not met"))
    if "decode" in results:
        for row in results["decode"]["steps"]:
            if row["batch"] == 64:
                rows.append((f"decode step, batch 64, {row['attention']} attention", f"{row['step_ms']:.0f} ms "
                             f"({row['tok_s']:.0f} tok/s)", f"floor {row['floor_ms']:.0f} ms", "-"))
    if "eval" in results:
        e = results["eval"]
        rows.append((f"eval sampling: {e['prompts']} prompts, greedy, batch {e['batch']}, <= {e['max_tokens']} tokens",
                     f"{e['tokens_per_second']:.1f} tok/s", f"floor {e['floor_tokens_per_second']:.0f} tok/s", "-"))
    if "forge" in results:
        f = results["forge"]
        rows.append((f"forge: {f['candidates_validated']} mutants validated", f"{f['forge_s']:.1f} s", "<= 60 s",
                     "met" if f["met"] else "not met"))
    return rows


@click.command()
@click.option("--only", default=",".join(BENCHMARKS), show_default=True, help="Comma-separated subset.")
@click.option("--quick", is_flag=True, help="W2 on 2 layers instead of 28 (smoke run; not the 1.5B figure).")
@click.option("--out-dir", default="outputs/bench", show_default=True, type=click.Path(path_type=Path))
def main(only: str, quick: bool, out_dir: Path) -> None:
    chosen = [name.strip() for name in only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in BENCHMARKS]
    if unknown:
        raise click.BadParameter(f"unknown benchmark {unknown[0]!r}; choose from {', '.join(BENCHMARKS)}",
                                 param_hint="--only")
    results, failed = {}, []
    for name in chosen:
        script, args = BENCHMARKS[name]
        out = out_dir / f"{name}.json"
        args = args + (["--layers", "2"] if quick and name == "w2" else [])
        click.echo(f"\n=== {name}: python bench/{script} {' '.join(args)}")
        start = time.perf_counter()
        code = subprocess.call([sys.executable, str(HERE / script), *args, "--out", str(out)])
        click.echo(f"=== {name}: exit {code}, {time.perf_counter() - start:.0f} s")
        if code == 0 and out.is_file():
            results[name] = json.loads(out.read_text())
        else:
            failed.append(name)
    rows = summary_rows(results)
    if rows:
        click.echo("\nsummary")
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        for r in rows:
            click.echo("  ".join(text.ljust(w) for text, w in zip(r, widths)))
    if failed:
        click.echo(f"failed: {', '.join(failed)}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
