"""Run untrusted candidate code against test probes, in confined child processes.

Why the verdict cannot be forged
--------------------------------
The candidate runs in a child process it fully controls: it can exit early, print
anything, patch builtins, the harness or `sys.modules`, and return objects whose
`__eq__` always says True. None of that can produce a pass, because of how the verdict
is built:

1. The child never decides pass or fail. It evaluates each test's *probe* (the left
   side of `assert probe == expected`) and writes the value, encoded as plain tagged data
   (`worker.encode`: exact builtin types only; any other object becomes an opaque
   tag that equals nothing), to a dedicated result pipe. Exit codes, stdout and files are
   never read as verdicts.
2. The expected values are not in the child. They come from running the oracle in a
   separate worker (`Sandbox(...)` instance of its own, see `scorer.Scorer`); the test
   code sent to a candidate holds only the probe expressions, never the right-hand sides.
3. The parent decodes the values into fresh builtin objects and compares them itself
   (`verdict.same_value`), so no candidate-defined `__eq__` is ever called.

So a candidate can only make a test pass by emitting the right value for it, which it has
to compute (or know). A missing value (early exit, crash, timeout) is a failure.

Limits (per candidate): a fresh forked child in its own session and process group, in its
own temporary directory, stdin at /dev/null, stdout and stderr captured to a capped file, a
wall-clock deadline after which the whole group is killed, RLIMIT_CPU, RLIMIT_AS (Linux;
elsewhere a watchdog polls the child's resident memory), RLIMIT_FSIZE, RLIMIT_NOFILE,
RLIMIT_NPROC. On Linux each worker is a child subreaper: processes that leave the job's
session (daemons) are re-parented to it and killed and reaped after the job. When the
trainer runs as root the child also drops to an unprivileged uid of its own (one per worker
slot); its files in /tmp, /var/tmp and /dev/shm are removed afterwards and, where there is
no subreaper, every process of that uid is killed.

Confinement (per candidate, `confine.py`): before any candidate code runs, the child is
confined by the kernel, without privileges: Landlock and a seccomp filter on Linux (user,
mount and network namespaces where Landlock is missing), Seatbelt on macOS. It may read the
standard library and read and write its work directory, nothing else, and open no socket.
Each worker reports the mechanism it applies; `Sandbox.confinement` says it in words.

Imports (per candidate, `worker.py`): the whole standard library, as in a plain interpreter,
but for the modules for the network, other processes and foreign code (`worker.REFUSED`:
socket, ssl, subprocess, multiprocessing, ctypes, asyncio, urllib.request, http.client, ...),
whose import raises "ImportError: sandbox: module 'socket' is refused here (no network)".
Each worker imports the rest once at start (0.3-0.5 s on 2 cores, 40 MB shared copy-on-write
by its children) so that extension modules work in a child that may not read their shared
libraries, and every module in a child whose uid may not read the standard library.
docs/sandbox-stdlib.md lists what imports where (`scripts/stdlib_probe.py`).
"""

from __future__ import annotations

import functools
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from queue import Queue

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
UID_BASE = 1_500_000_000
SLOTS_PER_PROCESS = 64
REPLY_GRACE_S = 15.0  # how long past the job deadline a silent worker is given before it is replaced


@dataclass(frozen=True)
class Limits:
    """Resource limits applied to each candidate run."""

    timeout: float = 4.0  # wall-clock seconds for loading the code and running all tests
    memory_mb: int = 1024
    output_bytes: int = 1 << 20  # stdout + stderr, captured to a file this big at most
    result_bytes: int = 1 << 20  # the result pipe
    max_procs: int = 16  # processes the candidate may start (where the OS enforces it)
    keep_output: int = 2000  # bytes of captured output returned for logs


@dataclass
class Execution:
    """What one candidate run reported: per-test lines from the child, and how it ended."""

    load_error: str | None = None
    tests: dict[int, dict] = field(default_factory=dict)  # index -> {"values": [...], "error": str?}
    done: bool = False  # the harness reached its end
    stop: str | None = None  # "timeout", "memory", "oversize" or None
    exit: str = ""  # "exit 0", "SIGKILL", ...
    output: str = ""
    seconds: float = 0.0


def parse_report(reply: dict) -> Execution:
    """Turn a worker reply into an Execution. Lines are untrusted: the candidate could have
    written to the pipe too, so malformed lines are skipped and the first line for a test wins."""
    run = Execution(stop=reply.get("stop"), exit=reply.get("exit", ""), output=reply.get("output", ""),
                    seconds=float(reply.get("seconds", 0.0)))
    for line in reply.get("report", "").splitlines():
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # junk the candidate wrote to the pipe
            continue
        if not isinstance(obj, dict):
            continue
        if obj.get("done") is True:
            run.done = True
            break
        if isinstance(obj.get("load_error"), str) and not run.tests:
            run.load_error = obj["load_error"]
        index = obj.get("test")
        if type(index) is int and index not in run.tests and isinstance(obj.get("values"), list):
            run.tests[index] = obj
    return run


def unconfined_message(confinement: str, override: str = "set sandbox.require_confinement=false") -> str:
    """One line: why candidate code would run unconfined, what that means, how to go ahead anyway."""
    reason = confinement[len("none ("):-1] if confinement.startswith("none (") else confinement
    return (f"candidate code would run unconfined ({reason}): model output could read your files and "
            f"reach the network; {override} to run it anyway")


class ConfinementError(RuntimeError):
    """Candidate code would run unconfined and the caller asked for confinement."""

    def __init__(self, confinement: str):
        self.confinement = confinement  # the worker's own words, e.g. "none (switched off)"
        super().__init__(unconfined_message(confinement))


@functools.cache
def pytest_site() -> tuple[str, ...]:
    """The directories a confined pytest run must read: where pytest and its plugins live
    (found once: every repository-test job names them)."""
    import pytest
    import pluggy
    return tuple(sorted({os.path.dirname(os.path.dirname(os.path.realpath(m.__file__))) for m in (pytest, pluggy)}))


def pytest_job(snapshot: str, files: dict[str, str], tests: list[str]) -> dict:
    """The worker's job that runs pytest ids in a confined copy of `snapshot` (`Sandbox.run_pytest`)."""
    return {"kind": "pytest", "snapshot": snapshot, "files": files, "tests": tests, "site": list(pytest_site())}


def worker_environment() -> dict[str, str]:
    """The worker's environment: this process's, without Python's own variables (as `-E`
    would drop them), and with string hashing fixed. A candidate or an oracle whose output
    follows the order of a set of strings then answers alike in every worker, run and resumed
    run, where each worker used to draw its own salt. `-I` cannot be used for this: it ignores
    PYTHONHASHSEED too."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    env["PYTHONHASHSEED"] = "0"
    return env


class _Worker:
    """One fork-server process; serves one job at a time."""

    def __init__(self, uid: int | None, confinement: str):
        self.uid = uid
        self.mode = confinement  # requested: auto, landlock, namespaces, seatbelt or none
        self.proc: subprocess.Popen | None = None
        self.root: str | None = None
        self.confinement = ""  # what the worker applies, in words (its first line)
        self.confined = False

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self.root = tempfile.mkdtemp(prefix="mlx-swe-rl-sandbox-")
            os.chmod(self.root, 0o711)  # a dropped uid must reach its own job directory inside
            self.proc = subprocess.Popen(
                [sys.executable, "-s", "-S", str(WORKER_SCRIPT), self.root, self.mode],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                close_fds=True, env=worker_environment(),
            )
            ready, _, _ = select.select([self.proc.stdout], [], [], REPLY_GRACE_S)
            try:
                hello = json.loads(self.proc.stdout.readline() if ready else b"")
            except ValueError:
                hello = {"confinement": "none (the sandbox worker did not start)", "mode": "none"}
            self.confinement, self.confined = hello["confinement"], hello["mode"] != "none"
        return self.proc

    def run(self, job: dict, limits: Limits) -> Execution:
        proc = self._start()
        job = dict(job, uid=self.uid, timeout=limits.timeout, memory_mb=limits.memory_mb,
                   output_bytes=limits.output_bytes, result_bytes=limits.result_bytes,
                   max_procs=limits.max_procs, keep_output=limits.keep_output)
        try:
            proc.stdin.write(json.dumps(job).encode() + b"\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], limits.timeout + REPLY_GRACE_S)
            line = proc.stdout.readline() if ready else b""
            return parse_report(json.loads(line))
        except (OSError, ValueError):
            self.close()  # a dead or confused worker is replaced on the next job
            return Execution(stop="crashed", exit="sandbox worker died")

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout):
                stream.close()
            self.proc = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


class Sandbox:
    """A pool of sandbox workers; runs candidates in parallel, results in input order.

    `confinement` picks the kernel mechanism (see `confine`: auto, landlock, namespaces,
    seatbelt, none). With `require_confinement` the pool refuses to start (ConfinementError)
    where candidates would run unconfined."""

    def __init__(self, workers: int | None = None, limits: Limits = Limits(), drop_privileges: bool | None = None,
                 confinement: str = "auto", require_confinement: bool = False):
        self.limits = limits
        self.size = max(1, workers or os.cpu_count() or 1)
        if drop_privileges is None:
            drop_privileges = hasattr(os, "geteuid") and os.geteuid() == 0
        base = UID_BASE + (os.getpid() % 100_000) * SLOTS_PER_PROCESS
        self._workers = [_Worker(base + i if drop_privileges else None, confinement) for i in range(self.size)]
        self._free: Queue[_Worker] = Queue()
        for worker in self._workers:
            self._free.put(worker)
        self._pool = ThreadPoolExecutor(self.size, thread_name_prefix="sandbox")
        self._lock = threading.Lock()
        if require_confinement:
            description = self.confinement  # starts the first worker, which tests its confinement
            if not self._workers[0].confined:
                self.close()
                raise ConfinementError(description)

    @property
    def confinement(self) -> str:
        """What confines candidate processes here, in words, e.g. 'landlock ABI 7, no network'."""
        worker = self._workers[0]
        with self._lock:
            if worker.proc is None:
                worker._start()
        return worker.confinement

    def run(self, code: str, tests: list[list[list[str]]], limits: Limits | None = None) -> Execution:
        """Execute `code`, then each test (a list of ["exec", src] / ["probe", expr] steps)."""
        return self.run_job({"code": code, "tests": tests}, limits)

    def run_job(self, job: dict, limits: Limits | None = None) -> Execution:
        """Run one job of any kind the worker serves (see worker.child_main) on a free worker."""
        worker = self._free.get()
        try:
            return worker.run(job, limits or self.limits)
        finally:
            self._free.put(worker)

    def run_pytest(self, snapshot: str, files: dict[str, str], tests: list[str],
                   limits: Limits | None = None) -> Execution:
        """Run pytest test ids in a confined copy of `snapshot` (a directory of a commit's
        files) with `files` (relative path -> text) written over it. Each test's outcome is
        `run.tests[i]["values"][0]` ("passed", "failed", ...). The outcomes come from the
        child that ran the candidate's code, so unlike `run`'s values they are not
        unforgeable: the confinement, not the verdict, is the boundary here."""
        return self.run_job(pytest_job(snapshot, files, tests), limits)

    def run_many(self, jobs: list[tuple[str, list, Limits | None]]) -> list[Execution]:
        """Run (code, tests, limits) jobs in parallel across the workers."""
        return list(self._pool.map(lambda job: self.run(*job), jobs))

    def run_jobs(self, jobs: list[tuple[dict, Limits | None]]) -> list[Execution]:
        """Run (job, limits) pairs of any kind in parallel across the workers."""
        return list(self._pool.map(lambda job: self.run_job(*job), jobs))

    def close(self) -> None:
        with self._lock:
            self._pool.shutdown(wait=True)
            for worker in self._workers:
                worker.close()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
