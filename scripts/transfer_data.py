"""The data of the issue "Learning that transfers" (configs/experiments/transfer.yaml), from the SmolLM2-135M
calibrations committed under docs/results/ (G = 8, T = 0.8, 192 tokens), so a fresh machine
trains on the same puzzles without hours of calibration:

- forge-calibration-smollm2.json: a random 100 of the forged training split (outputs/forged);
- forge-calibration-smollm2-short.json: its 214 other short puzzles (buggy code <= 7 lines);
- forge-calibration-smollm2-easy.json: 240 mutants of the 12 easy-tier training functions
  (outputs/forged-easy, 30 per function: the learn experiment's pool).

The mixed puzzles of all three (solved by some of the eight samples, not all) are the pool. The
forged training split's other 441 puzzles (the longer functions) are not calibrated: about three
hours on a 2-core CPU. Writes, under outputs/transfer/:

- puzzles/: the pool's and the validation set's puzzle files in one directory (an id names the
  same mutant in both forged sets, so the union has no clashes);
- train.json: at most --per-function puzzles of each training function (a seeded choice that
  spreads over mutator families), so that no function dominates;
- valid.json: at most --per-function calibrated puzzles (mixed or not) of each of a seeded fifth
  of the pool's functions, never trained on: the split on which configurations are compared (the
  issue forbids choosing on held-out results);
- heldout.json: --heldout-per-function puzzles of every function of the forged held-out split;
- data.json: how many puzzles, functions and families each set covers.

    python scripts/transfer_data.py [--per-function 4] [--heldout-per-function 2] [--seed 0]
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click
import numpy as np

from mlx_swe_rl.forge.spread import capped, coverage, function_of
from mlx_swe_rl.puzzles.format import Puzzle, load_puzzles
from mlx_swe_rl.puzzles.trainset import write_train_set
from mlx_swe_rl.runfiles import write_json_atomic

CALIBRATIONS = {"docs/results/forge-calibration-smollm2.json": "outputs/forged",
                "docs/results/forge-calibration-smollm2-short.json": "outputs/forged",
                "docs/results/forge-calibration-smollm2-easy.json": "outputs/forged-easy"}


@click.command()
@click.option("--per-function", default=4, show_default=True, help="Training / validation puzzles per function (at most).")
@click.option("--heldout-per-function", default=2, show_default=True, help="Held-out puzzles per function (at most).")
@click.option("--valid-frac", default=0.2, show_default=True, help="Share of the pool's functions kept for validation.")
@click.option("--seed", default=0, show_default=True)
@click.option("--out", "out", type=click.Path(path_type=Path), default=Path("outputs/transfer"), show_default=True)
def main(per_function: int, heldout_per_function: int, valid_frac: float, seed: int, out: Path) -> None:
    calibrated: dict[str, tuple[Puzzle, str]] = {}
    for report, directory in CALIBRATIONS.items():
        if not Path(directory).is_dir():
            raise click.ClickException(f"{directory}: missing (the experiment's forge steps make it first)")
        forged = {p.id: p for p in load_puzzles(Path(directory))}
        for row in json.loads(Path(report).read_text())["puzzles"]:
            if row["id"] not in forged:
                # The forge rejects a mutant whose two validation runs disagree, which a loaded
                # machine can cause for one that runs near its time limit.
                raise click.ClickException(
                    f"{directory}: no puzzle {row['id']} that {report} calibrated; the forge made another set "
                    f"(a mutant near its time limit can fail validation on a busy machine): forge it again "
                    f"with --overwrite, on a quiet machine")
            # A puzzle calibrated twice (an easy-function mutant in both forged sets) is mixed if
            # either calibration found it so: both are draws of the same eight-sample test.
            if calibrated.get(row["id"], (None, ""))[1] != "mixed":
                calibrated[row["id"]] = (forged[row["id"]], row["category"])
    mixed = sorted((p for p, category in calibrated.values() if category == "mixed"), key=lambda p: p.id)
    names = sorted({function_of(p) for p in mixed})
    order = np.random.default_rng(seed).permutation(len(names))
    valid_names = {names[i] for i in order[:round(valid_frac * len(names))]}

    shutil.rmtree(out / "puzzles", ignore_errors=True)
    # Validation holds every calibrated puzzle of its functions, not only the mixed ones: like the
    # held-out split, it asks whether training helps on bugs the base model cannot fix yet.
    valid_pool = sorted((p for p, _ in calibrated.values() if function_of(p) in valid_names), key=lambda p: p.id)
    for p in mixed + valid_pool:
        target = out / "puzzles" / p.tier / f"{p.id}.yaml"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p.path, target)
    heldout = [p for p in load_puzzles(Path("outputs/forged")) if p.split == "heldout"]
    sets = {"train": capped([p for p in mixed if function_of(p) not in valid_names], per_function, seed),
            "valid": capped(valid_pool, per_function, seed),
            "heldout": capped(heldout, heldout_per_function, seed)}
    for name, puzzles in sets.items():
        directory = out / "puzzles" if name != "heldout" else Path("outputs/forged")
        write_train_set(out / f"{name}.json", puzzles, directory,
                        {"script": "scripts/transfer_data.py", "set": name, "seed": seed})
    summary = {"pool": coverage(mixed), "calibrations": list(CALIBRATIONS),
               "settings": {"per_function": per_function, "heldout_per_function": heldout_per_function,
                            "valid_frac": valid_frac, "seed": seed},
               **{name: coverage(puzzles) for name, puzzles in sets.items()}}
    write_json_atomic(out / "data.json", summary)
    for name in ("pool", *sets):
        c = summary[name]
        print(f"{name:8s} {c['puzzles']:4d} puzzles from {c['functions']:3d} functions in {len(c['families']):2d} families"
              f" (at most {c['per_function_max']} per function)")


if __name__ == "__main__":
    main()
