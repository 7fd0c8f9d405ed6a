"""What stopping calibration early saves, replayed on recorded calibrations (no model run).

`mlx-swe-rl rollouts --rounds R` samples G completions per puzzle in R rounds and stops a puzzle
once it is mixed. Completions of a group are exchangeable, so the first k recorded completions
of a full-G calibration are a fair stand-in for a k-sample round: this replays each rule on
such a file and prints the share of generated tokens it would have cost and how many of the
puzzles that full sampling found mixed it keeps. Two lossy rules for comparison also stop
puzzles that are all-failed or all-solved after a first part of the samples.

    python bench/bench_calibration_rounds.py outputs/calib-forged-easy240.json [...]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import click

from common import print_table, write_result  # first: it loads OpenBLAS, which must precede mlx.core


def mixed(solved: list[bool]) -> bool:
    return 0 < sum(solved) < len(solved)


def stop_when_mixed(rounds: int) -> Callable[[list[bool]], int]:
    """`--rounds R`: samples drawn before stopping, for a group's outcomes in sampling order."""
    def drawn(solved: list[bool]) -> int:
        size = -(-len(solved) // rounds)
        for k in range(size, len(solved), size):
            if mixed(solved[:k]):
                return k
        return len(solved)
    return drawn


def stop_uniform_after(first: int) -> Callable[[list[bool]], int]:
    """Lossy: also give up on a puzzle whose first `first` samples agree."""
    def drawn(solved: list[bool]) -> int:
        return first if not mixed(solved[:first]) else stop_when_mixed(len(solved) // 2)(solved)
    return drawn


def replay(report: dict, rule: Callable[[list[bool]], int]) -> dict:
    full_tokens = kept_tokens = 0
    found = kept = 0
    for row in report["puzzles"]:
        solved = [c["solved"] for c in row["completions"]]
        tokens = [c["num_tokens"] for c in row["completions"]]
        k = rule(solved)
        full_tokens += sum(tokens)
        kept_tokens += sum(tokens[:k])
        found += mixed(solved)
        kept += mixed(solved) and mixed(solved[:k])
    return {"token_share": kept_tokens / full_tokens, "mixed_full": found, "mixed_kept": kept}


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", default="outputs/bench/calibration_rounds.json", show_default=True,
              type=click.Path(path_type=Path))
def main(files: tuple[Path, ...], out: Path) -> None:
    rows = []
    for path in files:
        report = json.loads(path.read_text())
        group = report["settings"]["group_size"]
        rules = {f"--rounds {r}": stop_when_mixed(r) for r in (2, 4, group) if r <= group}
        rules |= {f"lossy: stop uniform after {k}": stop_uniform_after(k) for k in (group // 2, 3 * group // 4)}
        for name, rule in rules.items():
            rows.append({"file": path.name, "puzzles": len(report["puzzles"]), "rule": name, **replay(report, rule)})
    print_table(rows, [("file", "calibration", ""), ("puzzles", "puzzles", "d"), ("rule", "rule", ""),
                       ("token_share", "tokens vs full G", ".0%"), ("mixed_kept", "mixed kept", "d"),
                       ("mixed_full", "of mixed", "d")], click.echo)
    write_result(out, {"rows": rows}, click.echo)
    click.echo(f"wrote {out}")


if __name__ == "__main__":
    main()
