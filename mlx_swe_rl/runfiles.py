"""Files a run writes: atomic JSON, and the metadata that says what produced a result.

The lowest layer of the package (with `blas`): data, rl, reports and the command line all
write through these, so none of them needs to import another's module for it.
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
