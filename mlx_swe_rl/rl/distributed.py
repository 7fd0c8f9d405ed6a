"""Data-parallel training over MLX's distributed engine (`mlx.launch`).

    mlx.launch --backend ring -n 2 python -m mlx_swe_rl.train --config C     # one host, 2 processes
    mlx.launch --hosts ip1,ip2 python -m mlx_swe_rl.train --config C         # two hosts

Not launched, `mx.distributed.init()` gives a group of one and every helper below returns
its input unchanged: a single-process run does no extra work.

The trainer splits each step's puzzles among the ranks by whole puzzles (`shard`), so group
statistics stay on one rank, sums the counts that normalise the loss and the gradients over
all ranks (`all_sum`, `all_sum_tree`), and gathers what rank 0 records (`unshard`). Rank 0
alone touches the run directory; `broadcast_tree` hands its weights to the others.

Failures. When one rank exits non-zero, `mlx.launch` terminates the others (SIGTERM), and the
ring backend also fails a pending collective on the survivors at once ("connection to a peer
was lost"), raised here as `DistributedError`. A rank that hangs instead (a deadlock, a host
that vanished without closing its sockets) would block the others forever inside a
collective, so every wait is bounded: after MLX_SWE_RL_DIST_TIMEOUT seconds (default 3600)
the waiting rank prints why and exits with code 75, and `mlx.launch` then stops the rest.
Note that `mlx.launch` itself (MLX 0.32) exits 0 even when a rank failed: read its
"[WARN] Node with rank N exited with code X" lines.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
import zlib
from contextlib import contextmanager
from typing import Any, Iterator

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_map, tree_unflatten

TIMEOUT_ENV = "MLX_SWE_RL_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 3600.0
HUNG_EXIT_CODE = 75  # EX_TEMPFAIL: another rank stopped answering
CHUNK_BYTES = 64 * 1024**2  # arrays are concatenated into buffers of about this size per all_sum

_group: mx.distributed.Group | None = None


class DistributedError(RuntimeError):
    """Another rank is gone, or the ranks disagree; the message is one line for the user."""


# --- the group ---------------------------------------------------------------------------------

def init() -> mx.distributed.Group:
    """The global group (size 1 when the process was not started by a launcher); idempotent."""
    global _group
    if _group is None:
        launched = "MLX_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ
        with _waiting("joining the other ranks (mx.distributed.init)", enabled=launched):
            _group = mx.distributed.init()
    return _group


def rank() -> int:
    return init().rank()


def size() -> int:
    return init().size()


def is_main() -> bool:
    """Rank 0 writes the run directory, prints and evaluates."""
    return rank() == 0


def shard(items: list) -> list:
    """This rank's share of `items`: every size-th item, starting at the rank."""
    return items[rank()::size()]


def unshard(mine: list) -> list:
    """The inverse of `shard` on every rank: all ranks' shares, back in the original order.
    The items must be JSON-serialisable."""
    n = size()
    if n == 1:
        return list(mine)
    shares = all_gather_json(mine)
    out = []
    for i in range(sum(len(s) for s in shares)):
        out.append(shares[i % n][i // n])
    return out


# --- collectives on Python values --------------------------------------------------------------

def all_sum(values: dict[str, float]) -> dict[str, float]:
    """Sum a dict of numbers over the ranks (same keys on every rank), in float64."""
    return _reduce(values, mx.distributed.all_sum, "all_sum")


def broadcast(values: dict[str, float]) -> dict[str, float]:
    """Rank 0's numbers on every rank."""
    return all_sum({k: v if is_main() else 0.0 for k, v in values.items()})


def all_max(values: dict[str, float]) -> dict[str, float]:
    """Maximum of a dict of numbers over the ranks (same keys on every rank)."""
    return _reduce(values, mx.distributed.all_max, "all_max")


def barrier(what: str, timeout: bool = True) -> None:
    """Wait until every rank gets here. With `timeout=False` the wait is unbounded (use it
    where one rank does long work alone, like rank 0's evaluation: a crash of that rank is
    still noticed at once, through the lost connection)."""
    if size() > 1:
        _run(lambda: mx.distributed.all_sum(mx.array(1.0), stream=mx.cpu), what, timeout)


def all_gather_json(value: Any) -> list[Any]:
    """Every rank's `value` (JSON-serialisable), in rank order, on every rank."""
    if size() == 1:
        return [value]
    data = json.dumps(value).encode()
    longest = int(all_max({"n": len(data)})["n"])
    buffer = mx.array(np.frombuffer(data.ljust(longest, b"\0"), dtype=np.uint8))
    gathered = _run(lambda: mx.distributed.all_gather(buffer, stream=mx.cpu), "all_gather")
    raw = np.array(gathered).tobytes()
    return [json.loads(raw[i * longest:(i + 1) * longest].rstrip(b"\0")) for i in range(size())]


def _reduce(values: dict[str, float], op, name: str) -> dict[str, float]:
    if size() == 1:
        return dict(values)
    keys = sorted(values)
    local = mx.array([float(values[k]) for k in keys], dtype=mx.float64)
    total = _run(lambda: op(local, stream=mx.cpu), f"{name}({', '.join(keys)})")
    return dict(zip(keys, total.tolist()))


# --- collectives on parameter trees -----------------------------------------------------------

def all_sum_tree(tree: Any, what: str = "gradient all_sum") -> Any:
    """Sum every array of a tree (gradients) over the ranks. Arrays are concatenated into
    buffers of about CHUNK_BYTES (one collective each) and evaluated one buffer at a time."""
    if size() == 1:
        return tree
    flat = tree_flatten(tree)
    arrays = [(i, v) for i, (_, v) in enumerate(flat) if isinstance(v, mx.array)]
    out = [v for _, v in flat]
    chunk: list[tuple[int, mx.array]] = []
    nbytes = 0
    for n, (i, v) in enumerate(arrays):
        chunk.append((i, v))
        nbytes += v.nbytes
        last = n == len(arrays) - 1
        if last or nbytes >= CHUNK_BYTES or arrays[n + 1][1].dtype != v.dtype:
            for j, summed in zip([j for j, _ in chunk], _sum_chunk([a for _, a in chunk], what)):
                out[j] = summed
            chunk, nbytes = [], 0
    return tree_unflatten([(k, v) for (k, _), v in zip(flat, out)])


def _sum_chunk(arrays: list[mx.array], what: str) -> list[mx.array]:
    flat = mx.concatenate([a.reshape(-1) for a in arrays])
    total = _run(lambda: mx.distributed.all_sum(flat), what)
    offsets = [0]
    for a in arrays:
        offsets.append(offsets[-1] + a.size)
    return [total[offsets[k]:offsets[k + 1]].reshape(a.shape) for k, a in enumerate(arrays)]


def broadcast_tree(tree: Any, what: str = "broadcast from rank 0") -> Any:
    """Rank 0's arrays on every rank (an all_sum of rank 0's values and everyone else's zeros,
    exact in any dtype). Every rank must pass a tree of the same structure and shapes."""
    if size() == 1:
        return tree
    shapes = [(k, v.shape, str(v.dtype)) for k, v in tree_flatten(tree) if isinstance(v, mx.array)]
    signature = float(zlib.crc32(json.dumps(shapes).encode()))
    if all_max({"s": signature, "-s": -signature}) != {"s": signature, "-s": -signature}:  # all equal
        raise DistributedError(f"rank {rank()}: the ranks hold different parameter trees ({what}); "
                               "run the same code, model and config on every host")
    main = is_main()
    mine = tree_map(lambda v: v if main or not isinstance(v, mx.array) else mx.zeros_like(v), tree)
    return all_sum_tree(mine, what)


# --- bounded waits -----------------------------------------------------------------------------

@functools.cache
def timeout_s() -> float:
    """How long one rank waits in a collective for the others (MLX_SWE_RL_DIST_TIMEOUT)."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        value = -1.0
    if value <= 0:
        sys.stderr.write(f"warning: ignoring {TIMEOUT_ENV}={raw!r} (not a positive number of seconds)\n")
        value = DEFAULT_TIMEOUT_S
    return value


def _run(make, what: str, timeout: bool = True) -> mx.array:
    """Build and evaluate one collective, bounded by the watchdog; a lost peer becomes a
    DistributedError."""
    with _waiting(what, enabled=timeout):
        try:
            result = make()
            mx.eval(result)
        except RuntimeError as exc:
            raise DistributedError(f"rank {rank()}: lost the other ranks during {what} ({exc}); one of "
                                   f"them probably failed, see its output") from exc
    return result


class _Watchdog:
    """One daemon thread that ends the process when a wait outlives its deadline. MLX
    releases the GIL while it blocks in a collective, so the thread gets to run."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.deadline: float | None = None
        self.seconds = 0.0
        self.what = ""
        self.thread: threading.Thread | None = None

    def arm(self, what: str, seconds: float) -> None:
        with self.lock:
            self.deadline, self.seconds, self.what = time.monotonic() + seconds, seconds, what
            if self.thread is None:
                self.thread = threading.Thread(target=self._watch, name="dist-watchdog", daemon=True)
                self.thread.start()

    def disarm(self) -> None:
        with self.lock:
            self.deadline = None

    def _watch(self) -> None:
        while True:
            time.sleep(0.5)
            with self.lock:
                expired = self.deadline is not None and time.monotonic() > self.deadline
                what, seconds = self.what, self.seconds
            if expired:
                who = f"rank {_group.rank()}" if _group is not None else f"rank {os.environ.get('MLX_RANK', '?')}"
                sys.stderr.write(f"\nError: {who} waited more than {seconds:.0f}s for the other ranks in "
                                 f"{what}; one of them hangs or is unreachable. Stopping "
                                 f"(set {TIMEOUT_ENV} to wait longer).\n")
                sys.stderr.flush()
                os._exit(HUNG_EXIT_CODE)


_watchdog = _Watchdog()


@contextmanager
def _waiting(what: str, enabled: bool = True) -> Iterator[None]:
    if not enabled:
        yield
        return
    _watchdog.arm(what, timeout_s())
    try:
        yield
    finally:
        _watchdog.disarm()


def sync_ranks(model: Any, optimizer: Any, start_step: int) -> int:
    """Data-parallel: every rank takes rank 0's start step, trainable weights and (when resuming)
    optimizer state, so the ranks agree and hosts without the run directory can resume."""
    if size() == 1:
        return start_step
    start_step = int(broadcast({"step": start_step})["step"])
    model.update(broadcast_tree(model.trainable_parameters(), "the broadcast of the weights"))
    if start_step > 0:
        if not is_main():
            optimizer.init(model.trainable_parameters())
        optimizer.state = broadcast_tree(optimizer.state, "the broadcast of the optimizer state")
    mx.eval(model.parameters(), optimizer.state)
    return start_step
