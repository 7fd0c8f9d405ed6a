"""Fork server that runs untrusted candidate code; the trusted half of the sandbox.

This file is executed as a script (`python -s -S worker.py`, see `pool.worker_environment`) by
`mlx_swe_rl.sandbox.pool`, never imported by the trainer, and uses the standard library
only. It pre-imports the standard library, then serves one job per line of stdin: fork a
child, confine it, let it run the candidate and the test probes, collect what the child
wrote on its result pipe, kill everything the child left behind, and answer with one JSON
line on stdout.

What candidates may import: any standard-library module but those in `REFUSED` (the network,
other processes, foreign code), which raise an ImportError saying so. Every other module is
imported here once, before any fork (`preload_stdlib`), because a confined child may not
read the shared libraries extension modules link (libcrypto for hashlib, say) and, when the
worker runs as root, its child's uid may not read the interpreter's own library directory
(a pyenv under /root). The kernel confinement, not the refusal, is the security boundary.

The child reports *values* (what each probe expression evaluated to), encoded as plain
data; it never reports pass or fail. The parent process compares those values with the
expected values, which come from a separate oracle run and never enter a candidate's
process. See `mlx_swe_rl.sandbox` for why that makes the verdict unforgeable.
"""

import os
import sys

# What -P would do (Python 3.11+ only): this script's directory is not an import root, so
# neither the worker nor a candidate can import the sandbox's other files by their bare names.
# (compared as real paths: Python resolves a symlinked script's directory when it adds it)
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p) != _HERE]

import builtins
import gc
import importlib
import json
import pkgutil
import resource
import select
import shutil
import signal
import subprocess
import tempfile
import time
import warnings

# The 20 modules that were all a candidate could import before the whole standard library
# was preloaded. forge.doctests still takes the imports a forged function may use from this
# list, so the puzzles it writes stay as they were.
PRELOADED = (
    "math cmath collections collections.abc itertools functools heapq bisect copy string "
    "re operator typing dataclasses fractions decimal statistics random enum array "
    "textwrap json"
).split()

# Modules a candidate may not import (a name refuses its submodules too), with the reason its
# ImportError gives. The kernel is what stops a candidate from reaching the network or other
# processes: these module objects stay reachable through modules that imported them (a
# `logging.handlers.socket` opens no socket either, seccomp sees to that). The refusal is so
# that the test output says why at the import, instead of an EPERM later. The list names the
# modules *for* the network or processes; modules that import one only in passing
# (email.utils, logging.handlers, unittest.mock, xml.sax.saxutils) keep working offline.
REFUSED = {
    **dict.fromkeys((
        "socket", "_socket", "ssl", "_ssl", "asyncio", "_asyncio", "asyncore", "asynchat",
        "socketserver", "http.client", "http.server", "urllib.request", "xmlrpc.client",
        "xmlrpc.server", "wsgiref.simple_server", "ftplib", "poplib", "imaplib", "nntplib",
        "smtplib", "smtpd", "telnetlib"), "no network"),
    **dict.fromkeys((
        "subprocess", "_posixsubprocess", "multiprocessing", "_multiprocessing", "_posixshmem",
        "concurrent.futures.process", "webbrowser"), "no processes"),
    **dict.fromkeys(("ctypes", "_ctypes"), "no foreign code"),
}

# Never preloaded: importing them prints (this, __hello__), opens a browser (antigravity),
# may write terminal escapes to stdout, which is this worker's reply pipe (readline), or
# needs a display (tkinter and what uses it). A candidate may still import them where the
# child can read the library directory; they then act as they would anywhere.
NO_PRELOAD = frozenset((
    "this", "antigravity", "readline", "idlelib", "tkinter", "_tkinter", "turtle", "turtledemo",
    "__main__", "__hello__", "__phello__"))


def _load_confine():
    """confine.py beside this file (this script cannot import the package)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "confine.py")
    spec = importlib.util.spec_from_file_location("_mlx_swe_rl_confine", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


confine = _load_confine()
PLAN = {"mode": "none", "reason": "not set up", "abi": 0, "seccomp": False, "read": []}

RESULT_FD = 3
OUTPUT_FILE = "output.txt"
MAX_NODES = 20_000
MAX_DEPTH = 40
MAX_TEXT = 100_000
DONE_LINE = b'{"done": true}\n'

# Held before candidate code runs, so a candidate that rebinds builtins cannot break
# the encoder (it could only make its own values unreadable, which scores as a failure).
_type, _len, _repr, _isinstance = type, len, repr, isinstance
_dumps = json.dumps
_write, _exit = os.write, os._exit


# ----------------------------------------------------------------------------- imports
def listed(name, names):
    """The entry of `names` that covers module `name` (itself or a package above it), or None."""
    while name:
        if name in names:
            return name
        name = name.rpartition(".")[0]
    return None


class Refuser:
    """A `sys.meta_path` finder that stops the import of listed modules with an ImportError
    naming the module and the reason. Code that tries an optional import and falls back
    catches it. Not ModuleNotFoundError: `from urllib import request` would turn that
    into a bare "cannot import name 'request'"."""

    def __init__(self, reasons):
        self.reasons = reasons

    def find_spec(self, name, path=None, target=None):
        entry = listed(name, self.reasons)
        if entry is None:
            return None  # not ours: the next finder looks
        raise ImportError(f"sandbox: module {name!r} is refused here ({self.reasons[entry]})", name=name)


def preloadable(name):
    """Whether the server imports `name` ahead of the jobs: not a test package, not a
    package's `__main__` (it runs a program: lib2to3's converts the files named in argv),
    not one of NO_PRELOAD or REFUSED (a refused module is loaded only where another one
    imports it)."""
    parts = name.split(".")
    if listed(name, NO_PRELOAD) or listed(name, REFUSED) or parts[-1] == "__main__":
        return False
    return not any(p.startswith(("test", "_test")) or p.endswith("_test") for p in parts)


def _import_tree(name):
    """Import `name` and, if it is a package, every preloadable module below it."""
    try:
        module = importlib.import_module(name)
    except BaseException:  # another platform's module, a missing library: a candidate sees the same error
        return
    for info in pkgutil.iter_modules(getattr(module, "__path__", None) or (), name + "."):
        if preloadable(info.name):
            _import_tree(info.name)


def preload_stdlib():
    """Import every preloadable standard-library module, and with them the refused ones
    they import in passing (email.utils imports socket; each child unloads those again,
    see `refuse_imports`). Runs once in the server, before any fork: children share the
    modules copy-on-write. Returns how many modules are loaded."""
    blocker = Refuser(dict.fromkeys(NO_PRELOAD, "not preloaded"))  # rlcompleter tries readline, say
    sys.meta_path.insert(0, blocker)
    sys.stdout.flush()
    saved, quiet = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)  # what a module writes at import must not reach the reply pipe
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated modules warn when imported
            for name in sorted(sys.stdlib_module_names):
                if preloadable(name):
                    _import_tree(name)
    finally:
        sys.stdout.flush()  # into /dev/null, not later into the pipe
        os.dup2(saved, 1)
        os.close(saved)
        os.close(quiet)
        sys.meta_path.remove(blocker)
    _PRELOADED_STATE.update(modules=len(sys.modules), refused=_loaded_refused())
    # Out of the collector's sight: a full collection in a child (candidate code may cause
    # one) would otherwise touch every preloaded object and copy their shared pages,
    # 40-80 ms instead of 2.
    gc.collect()
    gc.freeze()
    return len(sys.modules)


# What the preload left, so that each child need not scan sys.modules: touching every
# module's name there copies the shared pages they sit on (2 ms a job).
_PRELOADED_STATE = {"modules": -1, "refused": []}


def _loaded_refused():
    """The names in sys.modules that REFUSED covers, with their parent package and attribute."""
    found = []
    for name in sys.modules:
        if listed(name, REFUSED):
            parent, _, child = name.rpartition(".")
            found.append((name, parent, child))
    return found


def refuse_imports():
    """In a child, just before candidate code runs: unload the REFUSED modules (the server
    itself needs subprocess and ctypes) and refuse importing them again. Their attributes
    on parent packages go too, so `from urllib import request` is refused like
    `import urllib.request`."""
    state = _PRELOADED_STATE
    loaded = state["refused"] if len(sys.modules) == state["modules"] else _loaded_refused()
    for name, parent, child in loaded:
        module = sys.modules.pop(name, None)
        if module is not None and parent and getattr(sys.modules.get(parent), child, None) is module:
            delattr(sys.modules[parent], child)
    sys.meta_path.insert(0, Refuser(REFUSED))


# ----------------------------------------------------------------------------- child side
def encode(value, budget=None, depth=0):
    """Encode a value as tagged JSON data. Only exact builtin types are kept: a subclass or
    any other object (an AlwaysEqual, say) becomes {"o": type name}, which equals nothing."""
    if budget is None:
        budget = [MAX_NODES]
    budget[0] -= 1
    t = _type(value)
    if budget[0] < 0 or depth > MAX_DEPTH:
        return {"o": "<too large>"}
    if value is None or t is bool or t is str and _len(value) <= MAX_TEXT:
        return value
    if t is int:
        return value if value.bit_length() <= 4096 else {"o": "<huge int>"}
    if t is float:
        return {"f": value}
    if t is bytes and _len(value) <= MAX_TEXT:
        return {"b": value.hex()}
    tags = {list: "l", tuple: "t", set: "s", frozenset: "z"}
    if t in tags:
        # exact builtin containers: iteration cannot be overridden
        return {tags[t]: [encode(v, budget, depth + 1) for v in value]}
    if t is dict:
        return {"d": [[encode(k, budget, depth + 1), encode(v, budget, depth + 1)] for k, v in value.items()]}
    return {"o": getattr(t, "__name__", "?") if _isinstance(t, type) else "?"}


def describe(exc):
    """One line naming an exception raised by candidate code (never raises itself)."""
    try:
        name = _type(exc).__name__
        text = str(exc)
    except BaseException:  # a hostile __str__
        return "exception"
    return f"{name}: {text}"[:500] if text else name


def emit(obj):
    data = (_dumps(obj) + "\n").encode()
    while data:
        data = data[_write(RESULT_FD, data):]


def run_candidate(code, tests):
    """Execute the candidate, then each test's steps in one shared namespace, emitting one
    line per test. Steps are ["exec", source] or ["probe", expression]."""
    namespace = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        exec(compile(code, "<candidate>", "exec"), namespace)
    except BaseException as exc:
        emit({"load_error": describe(exc)})
        emit({"done": True})
        return
    for index, steps in enumerate(tests):
        values = []
        try:
            for kind, source in steps:
                if kind == "exec":
                    exec(compile(source, f"<test {index}>", "exec"), namespace)
                else:
                    values.append(encode(eval(compile(source, f"<test {index}>", "eval"), namespace)))
            emit({"test": index, "values": values})
        except BaseException as exc:
            emit({"test": index, "values": values, "error": describe(exc)})
    emit({"done": True})


def _set_limit(which, value):
    try:
        resource.setrlimit(which, (value, value))
    except (ValueError, OSError):
        pass  # not supported here (RLIMIT_AS on macOS, say); the watchdog covers memory


def _count_processes_of(uid):
    try:
        return sum(1 for p in os.listdir("/proc") if p.isdigit() and os.stat(f"/proc/{p}").st_uid == uid)
    except OSError:
        return 0


def child_main(job, workdir, result_w, jail=None):
    """Confine this freshly forked process, then run the candidate. Never returns."""
    os.setsid()
    os.chdir(workdir)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    out = os.open(OUTPUT_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.dup2(result_w, RESULT_FD)
    os.closerange(RESULT_FD + 1, 1 << 16)
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over-long output fails a write instead
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)

    cpu = int(job["timeout"]) + 2
    _set_limit(resource.RLIMIT_CPU, cpu)
    _set_limit(resource.RLIMIT_FSIZE, job["output_bytes"])
    _set_limit(resource.RLIMIT_CORE, 0)
    _set_limit(resource.RLIMIT_NOFILE, 64)
    if sys.platform.startswith("linux"):
        _set_limit(resource.RLIMIT_AS, job["memory_mb"] << 20)
    plan = PLAN
    if job.get("kind") == "pytest":  # trusted set-up, before confinement: no candidate code has run
        prepare_repository(job, workdir)
        plan = dict(PLAN, read=sorted(set(PLAN["read"]) | set(job["site"])))
    try:  # before the uid drop: a root worker's mounts need root; the rest survives setuid
        confine.apply(plan, workdir, jail)
    except Exception as exc:  # fail closed: no candidate code runs unconfined by accident
        emit({"load_error": f"sandbox: confinement failed: {exc}"})
        emit({"done": True})
        _exit(0)
    uid = job.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        _set_limit(resource.RLIMIT_NPROC, job["max_procs"])
        os.setresuid(uid, uid, uid)
    elif sys.platform.startswith("linux"):
        # RLIMIT_NPROC counts every process of the user, so allow what already runs plus a few
        _set_limit(resource.RLIMIT_NPROC, _count_processes_of(os.getuid()) + job["max_procs"])
    refuse_imports()
    if job.get("kind") == "pytest":
        run_pytest(job, os.path.join(workdir, REPO_DIR))
    else:
        run_candidate(job["code"], job["tests"])
    _exit(0)


# ----------------------------------------------------------------------------- repository tests
REPO_DIR = "repo"
FAILURE_CHARS = 600
PYTEST_MODULES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "exceptiongroup", "tomli")


def prepare_repository(job, workdir):
    """Copy the snapshot (a commit's files, no .git) into the job's work directory, write the
    candidate's files over it and import pytest, all before confinement: the confined child
    then reads only its own copy and the interpreter's libraries, and a candidate that edits a
    test file or the snapshot changes nothing outside this job."""
    repo = os.path.join(workdir, REPO_DIR)
    shutil.copytree(job["snapshot"], repo, symlinks=True)
    for rel, text in job["files"].items():
        target = os.path.normpath(os.path.join(repo, rel))
        if not target.startswith(repo + os.sep):
            continue  # a path outside the copy is never written
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)
    uid = job.get("uid")
    if uid is not None:
        for base, dirs, files in os.walk(repo):
            for name in [base] + [os.path.join(base, n) for n in dirs + files]:
                os.lchown(name, uid, uid)
    sys.path[:0] = [p for p in job["site"] if p not in sys.path]
    # All of pytest, its lazily imported modules included: a root worker's dropped uid may not
    # read a pyenv under /root once it runs the tests.
    for name in PYTEST_MODULES:
        _import_tree(name)


def run_pytest(job, repo):
    """Run the chosen test ids with pytest in the copy and emit one line per id: its outcome
    ("passed", "failed", "skipped", "error" or "missing" when pytest never ran it)."""
    import pytest
    os.chdir(repo)
    sys.path[:0] = [p for p in (os.path.join(repo, "src"), repo) if os.path.isdir(p)]
    outcomes, failures = {}, {}

    class Collector:
        def pytest_runtest_logreport(self, report):
            previous = outcomes.get(report.nodeid)
            if report.failed:
                outcomes[report.nodeid] = "failed" if report.when == "call" else "error"
                # the end of the failure (its assert and error line), what watch and feedback show
                failures.setdefault(report.nodeid, report.longreprtext[-FAILURE_CHARS:])
            elif report.skipped and previous is None:
                outcomes[report.nodeid] = "skipped"
            elif report.when == "call" and report.passed and previous is None:
                outcomes[report.nodeid] = "passed"

    ids = list(job["tests"])
    # The repository's tests run with pytest's own plugins only. The trainer's environment may
    # hold others (pytest-benchmark imports subprocess, which is refused here), and whether they
    # loaded used to depend on who could read site-packages: for root's dropped uid nothing in
    # /root/.pyenv was readable, for a normal user everything was, and every run failed there.
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        pytest.main(["-q", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", repo, *ids],
                    plugins=[Collector()])
    except BaseException as exc:
        emit({"load_error": describe(exc)})
    for index, nodeid in enumerate(ids):
        outcome = outcomes.get(nodeid, "missing")
        line = {"test": index, "values": [outcome]}
        if outcome != "passed":
            line["error"] = f"{nodeid}: {outcome}" + (f"\n{failures[nodeid]}" if nodeid in failures else "")
        emit(line)
    emit({"done": True})


# ---------------------------------------------------------------------------- server side
def _rss_bytes(pid):
    """Resident memory of a process, for the watchdog where RLIMIT_AS does not work."""
    try:
        out = subprocess.run(["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, timeout=2)
        return int(out.stdout.strip() or 0) * 1024
    except (OSError, ValueError, subprocess.SubprocessError):
        return 0


def collect(read_fd, pid, deadline, cap, memory_bytes):
    """Read the child's result pipe until it reports done, closes, or the deadline passes."""
    received = bytearray()
    watchdog = not sys.platform.startswith("linux")
    next_check = 0.0
    while True:
        now = time.monotonic()
        if now >= deadline:
            return bytes(received), "timeout"
        if watchdog and now >= next_check:
            next_check = now + 0.1
            if _rss_bytes(pid) > memory_bytes:
                return bytes(received), "memory"
        ready, _, _ = select.select([read_fd], [], [], min(0.1, deadline - now))
        if not ready:
            continue
        data = os.read(read_fd, 65536)
        if not data:
            return bytes(received), None
        received += data
        if len(received) > cap:
            return bytes(received[:cap]), "oversize"
        if received.endswith(DONE_LINE):  # the harness's last line: stop waiting for stragglers
            return bytes(received), None


def kill_user(uid):
    """Kill every process owned by `uid`, including ones that left the process group."""
    for _ in range(3):
        pid = os.fork()
        if pid == 0:
            try:
                os.setresuid(uid, uid, uid)
                os.kill(-1, signal.SIGKILL)  # every process this uid may signal, but itself
            finally:
                os._exit(0)
        os.waitpid(pid, 0)


def remove_files_of(uid):
    """Delete what `uid` left in the world-writable directories it could reach."""
    for top in ("/tmp", "/var/tmp", "/dev/shm"):
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                pass


def become_subreaper():
    """On Linux, orphaned descendants of a job (daemons that left its session) are
    re-parented to this worker instead of init, so it can find, kill and reap them."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            return ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
        except (OSError, AttributeError):
            pass
    return False


def _children():
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children") as f:
            return [int(pid) for pid in f.read().split()]
    except OSError:
        return []


def _reap_exited():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def reap_descendants():
    """Kill and reap every remaining child of this worker (the job's re-parented orphans;
    killing one may orphan its own children to us, hence the rounds)."""
    for _ in range(400):
        children = _children()
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _reap_exited()
        if not children:
            return
        time.sleep(0.005)


def exit_description(status):
    if os.WIFSIGNALED(status):
        try:
            return signal.Signals(os.WTERMSIG(status)).name
        except ValueError:
            return f"signal {os.WTERMSIG(status)}"
    return f"exit {os.WEXITSTATUS(status)}"


def run_job(job, root, subreaper):
    """Run one candidate in a fresh child and return what it reported."""
    workdir = tempfile.mkdtemp(prefix="job-", dir=root)
    jail = tempfile.mkdtemp(prefix="jail-", dir=root) if PLAN["mode"] == "namespaces" else None
    uid = job.get("uid")
    if uid is not None:
        os.chown(workdir, uid, uid)
    read_fd, write_fd = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            child_main(job, workdir, write_fd, jail)
        finally:
            os._exit(70)
    os.close(write_fd)
    data, stop = collect(read_fd, pid, start + job["timeout"], job["result_bytes"], job["memory_mb"] << 20)
    os.close(read_fd)
    seconds = time.monotonic() - start
    try:
        os.killpg(pid, signal.SIGKILL)  # threads left running, children in the group
    except OSError:
        pass
    if uid is not None and not subreaper:
        kill_user(uid)  # without a subreaper, escaped processes are found by their uid
    _, status = os.waitpid(pid, 0)
    reap_descendants()
    if uid is not None:
        remove_files_of(uid)
    try:
        with open(os.path.join(workdir, OUTPUT_FILE), "rb") as f:
            output = f.read(job["keep_output"]).decode("utf-8", "replace")
    except OSError:
        output = ""
    shutil.rmtree(workdir, ignore_errors=True)
    if jail is not None:
        shutil.rmtree(jail, ignore_errors=True)
    return {
        "report": data.decode("utf-8", "replace"),
        "stop": stop,
        "exit": exit_description(status),
        "output": output,
        "seconds": seconds,
    }


def self_test(plan, root):
    """Apply `plan` in a throw-away child; None if it worked, else the error."""
    workdir = tempfile.mkdtemp(prefix="probe-", dir=root)
    jail = tempfile.mkdtemp(prefix="jail-", dir=root)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            try:
                confine.apply(plan, workdir, jail)
                os.listdir(workdir)  # the work directory must stay usable
            except BaseException as exc:
                os.write(write_fd, str(exc).encode()[:500])
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        error = f.read().decode(errors="replace")
    os.waitpid(pid, 0)
    shutil.rmtree(workdir, ignore_errors=True)
    shutil.rmtree(jail, ignore_errors=True)
    return error or None


def choose_plan(mode, root):
    """The confinement to use: the requested mode if it works here; for "auto", the first of
    Landlock, namespaces that works; otherwise none, with the reason."""
    plan = confine.setup(mode)
    failures = []
    while plan["mode"] != "none":
        error = self_test(plan, root)
        if error is None:
            return plan
        failures.append(f"{plan['mode']}: {error}")
        if mode != "auto" or plan["mode"] != "landlock":
            break
        plan = confine.setup("namespaces")
    if failures:
        plan = dict(plan, mode="none", reason="; ".join(failures))
    return plan


def main():
    global PLAN
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    preload_stdlib()  # before any fork, the self-tests' included
    root = sys.argv[1]  # created (0711, so a dropped uid can reach its job directory) and removed by the parent
    PLAN = choose_plan(sys.argv[2] if len(sys.argv) > 2 else "auto", root)
    subreaper = become_subreaper()
    out = sys.stdout.buffer
    out.write(json.dumps({"confinement": confine.describe(PLAN), "mode": PLAN["mode"]}).encode() + b"\n")
    out.flush()
    for line in sys.stdin.buffer:
        reply = run_job(json.loads(line), root, subreaper)
        out.write(json.dumps(reply).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
