"""Writing a made puzzle set: one YAML file per puzzle plus a summary JSON, all at once.

The forge and the miner both write through here, so their files read alike and a set is
never left half-written."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ..puzzles.format import Puzzle
from ..runfiles import default_mode


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
    data = {k: v for k, v in data.items() if v is not None}
    return yaml.dump(data, Dumper=_BlockDumper, sort_keys=False, allow_unicode=True, width=100)


def write_puzzle_set(puzzles: list[Puzzle], out: Path, summary_file: str, summary: dict[str, Any],
                     overwrite: bool = False, kind: str = "puzzle set") -> None:
    """Write `<out>/<tier>/<id>.yaml` for each puzzle and `<out>/<summary_file>`, all at once:
    the set is built beside `out` and renamed into place. An existing non-empty `out` is
    replaced only with `overwrite`, and only if it holds `summary_file` (a set of this kind)."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out}: not empty; pass --overwrite to replace a {kind}")
        if not (out / summary_file).is_file():
            raise FileExistsError(f"{out}: not a {kind} (no {summary_file}); refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    os.chmod(staging, default_mode(directory=True))
    try:
        for p in puzzles:
            folder = staging / p.tier
            folder.mkdir(exist_ok=True)
            (folder / f"{p.id}.yaml").write_text(puzzle_yaml(p), encoding="utf-8")
        (staging / summary_file).write_text(json.dumps(summary, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
