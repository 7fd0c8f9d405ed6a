"""Files a run writes: atomic JSON, the run directory's JSON-lines logs, and the metadata that
says what produced a result.

The lowest layer of the package (with `blas`): data, rl, reports and the command line all
read and write through these, so none of them needs to import another's module for it, and
`history.jsonl` / `rollouts.jsonl` are parsed in one place (`read_jsonl`).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator


def default_mode(directory: bool = False) -> int:
    """The permissions a plain open()/mkdir() would give under the current umask (mkstemp and
    mkdtemp make 0600/0700 files, which other users, a sandbox uid included, cannot read)."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


@contextlib.contextmanager
def staged_directory(out: Path, overwrite: bool = False) -> Iterator[Path]:
    """A new directory beside `out` to write into, renamed to `out` when the block ends, and
    removed if it raises: `out` appears whole or not at all, with the permissions a plain mkdir()
    would give it. `out` must be absent or empty (OSError otherwise), unless `overwrite`: then
    what it holds is replaced. A symlink at `out` stays and the directory appears where it points
    (outputs linked to another disk); a file there is refused before the block runs."""
    if out.is_symlink():  # rename() would replace the link itself, or fail on a dangling one
        out = Path(os.path.realpath(out))
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out}: a file is there, not a directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    staging.chmod(default_mode(directory=True))  # mkdtemp's 0700 would hide it from other users
    try:
        yield staging
        if out.exists():
            shutil.rmtree(out) if overwrite else out.rmdir()
        staging.replace(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


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


@dataclass
class StepRecord:
    """One training step, as `run_step` fills it and history.jsonl keeps it: one JSON line per
    step, these fields in this order (`to_json`). Means are over the step's episodes, counts
    over all ranks of a data-parallel run; timings and memory are the slowest / largest rank's.

    The loss fields are None in a step whose groups all dropped out (nothing to update), `kl`
    also when beta is 0. `tokens_total` is filled by the training loop (the run's sampled tokens
    so far: the x-axis of learning per token); `lora_b_zero` and `alarms` by the alarms
    (rl.alarms), and only in the step where they trip: they are left out of the line otherwise.

    A record read back (`from_json`) from a run made before a field existed has None there,
    except for the fields whose old value is known (`_FILLED_IN`)."""

    step: int
    reward_mean: float
    solve_rate: float
    loss: float | None
    policy_loss: float | None
    kl: float | None
    entropy: float | None
    clip_frac: float | None
    grad_norm: float | None
    zero_var_frac: float
    loss_completions: int  # completions in the loss (zero: no update)
    groups_sampled: int  # all of the step's groups, replacements included
    groups_kept: int  # the groups the loss read
    extra_groups: int  # replacement groups of dynamic sampling
    sampled_tokens: int  # the model's tokens sampled this step
    extra_tokens: int  # those of the replacement groups
    completion_len: float  # the model's tokens per episode, all turns
    turns: float  # answers per episode
    truncation_rate: float
    errored: int  # episodes whose puzzle could not be scored (reward 0, no loss)
    tokens_per_s: float  # summed over the ranks
    lr: float
    sample_s: float
    prefill_s: float  # part of sample_s: the prompts' forwards
    score_s: float
    reference_s: float  # old/reference log-prob forwards (and the frozen bottom blocks, `Entry`)
    optimizer_s: float  # part of update_s: the optimizer's updates
    update_s: float  # reference_s + forward/backward + optimizer_s
    step_s: float
    peak_memory_gb: float
    puzzles: list[str]  # the step's puzzles, then the replacements'
    tokens_total: int | None = None
    lora_b_zero: bool | None = None
    alarms: list[dict[str, str]] | None = None

    def to_json(self) -> dict[str, Any]:
        """The history.jsonl line: every field, in order, less the alarms' fields when unset."""
        record = asdict(self)
        for key in _ONLY_WHEN_SET:
            if record[key] is None:
                del record[key]
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any], group_size: int | None = None) -> StepRecord:
        """A history.jsonl line of this or an older version (see `_FILLED_IN`); keys this
        version does not know are ignored. `group_size` (the run's sampling.group_size) lets a
        record written before `sampled_tokens` existed estimate it (else it stays None)."""
        record = upgrade_history_line(record, group_size)
        return cls(**{f.name: record.get(f.name) for f in fields(cls)})


def _estimated_tokens(record: dict[str, Any], group_size: int | None) -> int | None:
    """Records written before `sampled_tokens` existed: mean length x episodes (G per puzzle)."""
    if group_size is None:
        return None
    return round((record.get("completion_len") or 0.0) * group_size * len(record.get("puzzles") or []))


_ONLY_WHEN_SET = ("lora_b_zero", "alarms")
# The fields older records lack whose value is known: errors were not recorded before `errored`
# existed because there were no error verdicts; the tokens follow from the mean length.
_FILLED_IN = {
    "errored": lambda record, group_size: 0,
    "sampled_tokens": _estimated_tokens,
}


def upgrade_history_line(record: dict[str, Any], group_size: int | None = None) -> dict[str, Any]:
    """A history.jsonl line with the fields it predates filled in where their value is known
    (`_FILLED_IN`), for readers that keep the JSON form (the watch page)."""
    filled = {key: fill(record, group_size) for key, fill in _FILLED_IN.items() if record.get(key) is None}
    return {**record, **{key: value for key, value in filled.items() if value is not None}}


def read_steps(run_dir: Path, group_size: int | None = None, missing_ok: bool = False) -> list[StepRecord]:
    """The step records of the run in `run_dir` (`read_history`), typed, older lines upgraded."""
    return [StepRecord.from_json(r, group_size) for r in read_history(run_dir, missing_ok)]


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


RUN_LOCK = "run.lock"  # held (flock) by the process training the run; says its pid and host


class RunInUseError(RuntimeError):
    """The run directory cannot be claimed: another process is training it, or it cannot be
    written (the message is one line)."""


def _try_lock(fd: int, exclusive: bool) -> bool:
    """flock without blocking: True when taken; False when another process holds it. Where the
    file system cannot lock (some network mounts) or the platform has no flock, it is taken:
    the lock guards against a mistake, it is not what makes a checkpoint safe."""
    try:
        import fcntl
    except ImportError:
        return True
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


@contextlib.contextmanager
def run_in_use(run_dir: Path) -> Iterator[None]:
    """Mark `run_dir` as being trained by this process for the block; RunInUseError when another
    process is training it already (two trainers would overwrite each other's checkpoints and
    logs). The kernel drops the lock when the process ends, killed or not: nothing goes stale."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / RUN_LOCK, os.O_RDWR | os.O_CREAT, default_mode())
    except OSError as exc:
        raise RunInUseError(f"{run_dir}: cannot write the run directory ({exc.strerror or exc})") from exc
    try:
        for _ in range(20):  # a reader (run_holder) takes the lock for an instant: wait it out
            if _try_lock(fd, exclusive=True):
                break
            time.sleep(0.1)
        else:
            holder = run_holder(run_dir) or "it has just ended"
            raise RunInUseError(f"{run_dir} is being trained by another process ({holder}): "
                                "wait for it to end, or stop it and resume")
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {platform.node()}\n".encode())
        yield
    finally:
        os.close(fd)  # closing releases the lock


def run_holder(run_dir: Path) -> str | None:
    """Who trains `run_dir` now ("pid N on HOST"), or None when no process does."""
    path = run_dir / RUN_LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        if _try_lock(fd, exclusive=False):
            return None
        return path.read_text().strip() or "a process that has not written its pid yet"
    finally:
        os.close(fd)


WALL_TIME = "wall_time.json"  # a run's wall time over all its sittings, written by `mlx-swe-rl experiment`


def add_wall_time(run_dir: Path, seconds: float) -> None:
    """Add `seconds` to the run's wall_time.json (a resumed run adds each sitting's time)."""
    before = wall_seconds(run_dir) or 0.0
    write_json_atomic(run_dir / WALL_TIME, {"seconds": before + seconds})


def wall_seconds(run_dir: Path) -> float | None:
    """The run's wall time over all its sittings, or None when nothing recorded it."""
    path = run_dir / WALL_TIME
    return json.loads(path.read_text())["seconds"] if path.is_file() else None


def run_metadata(model_spec: str, adapter: Path | None, dtype: str, model_patches: list[str]) -> dict[str, Any]:
    """What produced a result file: model, adapter, software and machine, and the mlx-lm
    functions the model ran replaced (`models.fastmath.patched()`: the code that ran is not
    all in mlx-lm's architecture files)."""
    import mlx.core as mx

    from . import __version__
    from .blas import blas_in_use

    return {
        "model": model_spec, "adapter": str(adapter) if adapter else None, "dtype": dtype,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "mlx_swe_rl": __version__, "mlx": mx.__version__, "device": str(mx.default_device()),
        "blas": blas_in_use(), "python": sys.version.split()[0], "machine": platform.machine(),
        "model_patches": model_patches,
    }


def default_out_path(kind: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("outputs") / kind / f"{kind}-{stamp}.json"
