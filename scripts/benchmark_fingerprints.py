"""Build the benchmark fingerprints the harvest decontaminates against
(mlx_swe_rl/forge/data/benchmark_fingerprints.json; see `forge.decontam` for what a
fingerprint is). Only names and hashes are written, never benchmark code.

Each input is one benchmark:

- humaneval: a JSON-lines file (openai/human-eval, data/HumanEval.jsonl.gz, gzipped or
  not); a function is `prompt` + `canonical_solution`;
- mbpp: a JSON-lines file (full or sanitized; google-research mbpp/mbpp.jsonl or a copy); a
  function is `code`;
- python: a directory of Python files (QuixBugs' python_programs/ and
  correct_python_programs/); every module-level function of every file but `*_test.py`.

    python scripts/benchmark_fingerprints.py --benchmark humaneval=PATH[@ORIGIN] \\
        --benchmark mbpp=PATH[@ORIGIN] [--out FILE]

ORIGIN (a repository and commit, say) is recorded beside the counts.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import click

from mlx_swe_rl.forge.decontam import FINGERPRINTS, Benchmarks, fingerprints

CODE_FIELDS = {"humaneval": ("prompt", "canonical_solution"), "mbpp": ("code",), "python": ()}


def read_codes(kind: str, path: Path) -> list[str]:
    """The code of each task of one benchmark file (or directory, for `python`)."""
    if kind == "python":
        return [f.read_text(encoding="utf-8") for f in sorted(path.rglob("*.py")) if not f.name.endswith("_test.py")]
    return ["".join(row[k] for k in CODE_FIELDS[kind]) for row in read_lines(path)]


def read_lines(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


@click.command()
@click.option("--benchmark", "benchmarks", multiple=True, required=True, metavar="KIND=PATH[@ORIGIN]",
              help=f"A benchmark file; KIND is one of {', '.join(CODE_FIELDS)}.")
@click.option("--out", type=click.Path(path_type=Path), default=FINGERPRINTS, show_default=True)
def main(benchmarks: tuple[str, ...], out: Path) -> None:
    """Fingerprint the functions of the given benchmark files."""
    result = Benchmarks(about={"benchmarks": {}})
    for spec in benchmarks:
        kind, _, rest = spec.partition("=")
        path_text, _, origin = rest.partition("@")
        if kind not in CODE_FIELDS or not path_text:
            raise click.ClickException(f"--benchmark: '{spec}' is not KIND=PATH with KIND in {', '.join(CODE_FIELDS)}")
        codes = read_codes(kind, Path(path_text))
        prints = [p for code in codes for p in fingerprints(code)]
        result.add(prints)
        name = f"{kind}:{Path(path_text).name}"
        result.about["benchmarks"][name] = {"tasks": len(codes), "functions": len(prints), "origin": origin or None}
        click.echo(f"{name}: {len(codes)} tasks, {len(prints)} functions")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result.to_json(), indent=0) + "\n")
    click.echo(f"wrote {out} ({len(result.bodies)} bodies, {len(result.named_sizes)} names)")


if __name__ == "__main__":
    main()
