"""Files a run writes: atomic JSON, the run directory's JSON-lines logs, and the metadata that
says what produced a result.

The lowest layer of the package (with `blas`): data, rl, reports and the command line all
read and write through these, so none of them needs to import another's module for it, and
`history.jsonl` / `rollouts.jsonl` are parsed in one place (`read_jsonl`).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def default_mode(directory: bool = False) -> int:
    """The permissions a plain open()/mkdir() would give under the current umask (mkstemp and
    mkdtemp make 0600/0700 files, which other users, a sandbox uid included, cannot read)."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temporary file and a rename, so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    os.fchmod(fd, default_mode())
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


HISTORY = "history.jsonl"  # one record per training step, appended as the step ends
ROLLOUTS = "rollouts.jsonl"  # one line per scored completion, tagged with its step


class RunFileError(FileNotFoundError):
    """A run directory lacks the file a reader needs; the message is one line for the user."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file, in order (blank lines skipped)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def read_history(run_dir: Path, missing_ok: bool = False) -> list[dict[str, Any]]:
    """The step records of the run in `run_dir`, in order. A run without history.jsonl (one
    that has not finished a step) is an error, or no records with `missing_ok`."""
    path = Path(run_dir) / HISTORY
    if not path.is_file():
        if missing_ok:
            return []
        raise RunFileError(f"{path}: no history (is this a run directory?)")
    return read_jsonl(path)


def append_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    """Append records to a JSON-lines file, one line each (one write, so a reader tailing the
    file sees whole lines)."""
    if records:
        with open(path, "a") as f:
            f.write("".join(json.dumps(record) + "\n" for record in records))


def truncate_after_step(path: Path, last_step: int) -> None:
    """Drop the records of a step log written after step `last_step` (the checkpoint a run
    resumes from); a missing file stays missing."""
    if not Path(path).exists():
        return
    keep = [record for record in read_jsonl(path) if record.get("step", 0) <= last_step]
    Path(path).write_text("".join(json.dumps(record) + "\n" for record in keep))


def run_metadata(model_spec: str, adapter: Path | None, dtype: str) -> dict[str, Any]:
    """What produced a result file: model, adapter, software and machine."""
    import mlx.core as mx

    from . import __version__
    from .blas import blas_in_use

    return {
        "model": model_spec, "adapter": str(adapter) if adapter else None, "dtype": dtype,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "mlx_swe_rl": __version__, "mlx": mx.__version__, "device": str(mx.default_device()),
        "blas": blas_in_use(), "python": sys.version.split()[0], "machine": platform.machine(),
    }


def default_out_path(kind: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("outputs") / kind / f"{kind}-{stamp}.json"
