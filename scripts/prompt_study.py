"""The prompt study (issue "Before the mission's long run"): each model evaluated with each
prompt (`prompt.template` x `prompt.system`) on the same puzzles, same scorer and token limit,
and every prompt's paired change from today's (block + expert), per split, with bootstrap 95% CIs.

Evaluations are run with `mlx-swe-rl eval` (kept under --out and reused when present), then the
study is written to docs/results/prompts.json. Choose on the training split; the held-out split
and the forged held-out functions confirm.

    python scripts/prompt_study.py --model qwen2.5-coder-1.5b --tiers medium,hard
    python scripts/prompt_study.py --model smollm2-135m --tiers easy
    python scripts/prompt_study.py --model qwen2.5-coder-1.5b --puzzles outputs/transfer/heldout.json \
        --set forged-heldout --prompts block/expert,seed/none
    python scripts/prompt_study.py --report-only
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import click

from mlx_swe_rl.env.rewards import answer_kind_shares
from mlx_swe_rl.puzzles.format import load_puzzles
from mlx_swe_rl.puzzles.trainset import load_train_set
from mlx_swe_rl.rl.stats import compare_reports
from mlx_swe_rl.runfiles import write_json_atomic

BASELINE = "block/expert"
PROMPTS = "block/expert,block/none,seed/none,find/none"


def eval_path(out: Path, model: str, prompt: str, set_name: str, k: int) -> Path:
    return out / f"{model}--{prompt.replace('/', '-')}--{set_name}--k{k}.json"


def run_eval(path: Path, model: str, prompt: str, selection: list[str], k: int, max_tokens: int,
             batch_size: int) -> None:
    template, system = prompt.split("/")
    command = ["mlx-swe-rl", "eval", "--model", model, *selection, "--prompt-template", template,
               "--prompt-system", system, "--max-tokens", str(max_tokens), "--batch-size", str(batch_size),
               "-K", str(k), "--out", str(path)]
    click.echo("$ " + " ".join(command), err=True)
    subprocess.run(command, check=True)


def set_puzzles(selection: dict) -> dict:
    """{id: Puzzle} of a set as `sets.json` records it (bundled tiers, or a directory or set file)."""
    if selection.get("tiers"):
        found = load_puzzles(None, selection["tiers"].split(","), "all")
    elif selection["puzzles"].endswith(".json"):
        found = load_train_set(Path(selection["puzzles"]), None, "all")
    else:
        found = load_puzzles(Path(selection["puzzles"]), None, "all")
    return {p.id: p for p in found}


def study(out: Path) -> dict:
    """Every evaluation under `out`, grouped by model, set and K, with each prompt's paired change
    from the baseline prompt's evaluation of the same puzzles."""
    sets = json.loads((out / "sets.json").read_text())
    puzzles = {name: set_puzzles(selection) for name, selection in sets.items()}
    reports: dict[tuple[str, str, int], dict[str, dict]] = {}
    for path in sorted(out.glob("*--*--*--k*.json")):
        model, prompt, set_name, k = path.stem.split("--")
        reports.setdefault((model, set_name, int(k[1:])), {})[prompt.replace("-", "/", 1)] = json.loads(path.read_text())
    rows = []
    for (model, set_name, k), by_prompt in sorted(reports.items()):
        base = by_prompt.get(BASELINE)
        for prompt, report in sorted(by_prompt.items()):
            solved = {split: sum(r["pass@1"] for r in report["puzzles"] if split in ("all", r["split"]))
                      for split in ("train", "heldout", "all")}
            counts = {split: sum(1 for r in report["puzzles"] if split in ("all", r["split"]))
                      for split in ("train", "heldout", "all")}
            rows.append({"model": model, "set": set_name, "k": k, "prompt": prompt,
                         "solved": solved, "puzzles": counts,
                         "tokens": report["timing"]["generated_tokens"],
                         "answer_kinds": answer_kind_shares(report["puzzles"], puzzles[set_name]),
                         "change_vs_baseline": compare_reports(base, report) if base and prompt != BASELINE else None})
    return {"baseline": BASELINE, "note": "pass@1 summed over puzzles (greedy: solved puzzles; K > 1: avg@K "
            "in puzzles); change_vs_baseline: paired change in per-puzzle pass@1 with a bootstrap 95% CI over "
            "puzzles (rl.stats.paired_change)", "rows": rows}


@click.command()
@click.option("--model", default=None, help="Model spec to evaluate (omit with --report-only).")
@click.option("--tiers", default=None, help="Bundled tiers, comma-separated.")
@click.option("--puzzles", default=None, help="A puzzle directory or puzzle-set file instead of bundled tiers.")
@click.option("--set", "set_name", default=None, help="Name of the puzzle set in the study (default: the tiers).")
@click.option("--prompts", default=PROMPTS, show_default=True, help="template/system pairs, comma-separated.")
@click.option("-K", "samples", default=1, show_default=True, help="Completions per puzzle (1 = greedy).")
@click.option("--max-tokens", default=384, show_default=True)
@click.option("--batch-size", default=64, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=Path("outputs/prompts"), show_default=True)
@click.option("--results", type=click.Path(path_type=Path), default=Path("docs/results/prompts.json"),
              show_default=True)
@click.option("--report-only", is_flag=True, help="Only rewrite the study from the evaluations present.")
def main(model: str | None, tiers: str | None, puzzles: str | None, set_name: str | None, prompts: str,
         samples: int, max_tokens: int, batch_size: int, out: Path, results: Path, report_only: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if not report_only:
        if model is None or (tiers is None) == (puzzles is None):
            raise click.UsageError("give --model and one of --tiers / --puzzles")
        selection = ["--tiers", tiers, "--split", "all"] if tiers else ["--puzzles", puzzles]
        set_name = set_name or (tiers.replace(",", "+") if tiers else Path(puzzles).stem)
        sets_file = out / "sets.json"
        sets = json.loads(sets_file.read_text()) if sets_file.is_file() else {}
        sets[set_name] = {"tiers": tiers, "puzzles": puzzles}
        write_json_atomic(sets_file, sets)
        for prompt in prompts.split(","):
            path = eval_path(out, Path(model).name, prompt, set_name, samples)
            if not path.is_file():
                run_eval(path, model, prompt, selection, samples, max_tokens, batch_size)
    write_json_atomic(results, study(out))
    click.echo(f"wrote {results}")


if __name__ == "__main__":
    main()
