"""Writing a made puzzle set: one YAML file per puzzle plus a summary JSON, all at once.

The forge, the miner and the harvest write through here, so their files read alike and a set is
never left half-written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from ..puzzles.format import Puzzle
from ..runfiles import staged_directory


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings as `|` blocks, so made files read like hand-written ones."""


_BlockDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def puzzle_yaml(p: Puzzle) -> str:
    """The puzzle file's text (fixed key order: byte-identical for the same puzzle). Optional
    fields that are not set are left out."""
    data = {"id": p.id, "tier": p.tier, "split": p.split, "entry_point": p.entry_point, "family": p.family,
            "mutation": p.mutation, "description": p.description, "buggy": p.buggy, "oracle": p.oracle,
            "tests": list(p.tests), "hidden_tests": list(p.hidden_tests) or None, "timeout": p.timeout,
            "source": p.source}
    return block_yaml(data)


def block_yaml(data: dict[str, Any]) -> str:
    """A mapping as YAML in its key order, multi-line strings as `|` blocks; None values left out."""
    data = {k: v for k, v in data.items() if v is not None}
    return yaml.dump(data, Dumper=_BlockDumper, sort_keys=False, allow_unicode=True, width=100)


def write_puzzle_set(puzzles: list[Puzzle], out: Path, summary_file: str, summary: dict[str, Any],
                     overwrite: bool = False, kind: str = "puzzle set") -> None:
    """Write `<out>/<tier>/<id>.yaml` for each puzzle and `<out>/<summary_file>`, all at once
    (`write_file_set`)."""
    files = {f"{p.tier}/{p.id}.yaml": puzzle_yaml(p) for p in puzzles}
    write_file_set(files, out, summary_file, summary, overwrite, kind)


def write_file_set(files: dict[str, str], out: Path, summary_file: str, summary: dict[str, Any],
                   overwrite: bool = False, kind: str = "puzzle set") -> None:
    """Write `files` ({path relative to out: text}) and `<out>/<summary_file>`, all at once:
    the set is built beside `out` and renamed into place. An existing non-empty `out` is
    replaced only with `overwrite`, and only if it holds `summary_file` (a set of this kind)."""
    out = Path(out)
    if out.is_dir() and any(out.iterdir()):  # a file there: staged_directory says so
        if not overwrite:
            raise FileExistsError(f"{out}: not empty; pass --overwrite to replace a {kind}")
        if not (out / summary_file).is_file():
            raise FileExistsError(f"{out}: not a {kind} (no {summary_file}); refusing to replace it")
    with staged_directory(out, overwrite=True) as staging:
        for relative, text in files.items():
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        (staging / summary_file).write_text(json.dumps(summary, indent=1) + "\n")
