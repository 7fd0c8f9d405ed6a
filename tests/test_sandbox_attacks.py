"""Adversarial suite: candidate code that tries to fake a pass, harm the harness or the
machine. Every attack must score 0 (or its honest verdict), return within timeout + 2 s,
and leave no process or file behind."""

from __future__ import annotations

import os
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from mlx_swe_rl.env.codefix import CodeFixEnv
from mlx_swe_rl.puzzles.format import parse_puzzle
from mlx_swe_rl.sandbox.pool import WORKER_SCRIPT, Limits, Sandbox
from mlx_swe_rl.sandbox.scorer import Scorer
from mlx_swe_rl.sandbox.verdict import decode

TIMEOUT = 2.0
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
LINUX = sys.platform.startswith("linux")
MARK = f"mlxswerl-attack-{uuid.uuid4().hex[:8]}"  # names files and processes attacks create
OUTSIDE = Path("/tmp") / MARK  # a world-writable place outside the sandbox directory

PUZZLE = parse_puzzle(
    {
        "id": "add_pair",
        "tier": "attacks",
        "split": "train",
        "entry_point": "add",
        "description": "Add two numbers.",
        "buggy": "def add(a, b):\n    return a - b\n",
        "oracle": "def add(a, b):\n    return a + b\n",
        "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(20, 22) == 42",
                  "assert tag() == 'zq-secret-' + str(7 * 13)"],
    },
    Path("attacks/add_pair.yaml"),
)
# the oracle needs tag() too; the candidates below never get to see its expected value
PUZZLE = type(PUZZLE)(**{**PUZZLE.__dict__, "oracle": PUZZLE.oracle + "def tag():\n    return 'zq-secret-91'\n"})

ATTACKS: dict[str, str] = {
    "always_equal": """
        class AlwaysEqual:
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            def __hash__(self): return 0
        def add(a, b): return AlwaysEqual()
        def tag(): return AlwaysEqual()
    """,
    "int_subclass_eq": """
        class Sneaky(int):
            def __eq__(self, other): return True
            __hash__ = int.__hash__
        def add(a, b): return Sneaky(0)
        def tag(): return Sneaky(0)
    """,
    "sys_exit_at_import": """
        import sys
        sys.exit(0)
    """,
    "os_exit_in_call": """
        import os
        def add(a, b): os._exit(0)
        def tag(): os._exit(0)
    """,
    "print_passed": """
        print("PASSED"); print('{"done": true}'); print("4 passed, 0 failed")
        def add(a, b): print("ok"); return None
        def tag(): return None
    """,
    "forge_result_pipe": """
        import os
        for fd in range(0, 20):
            try:
                os.write(fd, b'{"test": 0, "passed": true}\\n{"verdict": "pass"}\\n{"test": 3, "values": [true]}\\n')
            except OSError:
                pass
        def add(a, b): return None
        def tag(): return True
    """,
    "nested_junk_on_pipe": """
        import os
        os.write(3, b"[" * 200000 + b"\\n" + b'{"test": 0, "values": ' + b"[" * 100000 + b"\\n")
        def add(a, b): return None
        def tag(): return None
    """,
    "close_result_pipe": """
        import os
        os.close(3)
        def add(a, b): return a + b
        def tag(): return ""
    """,
    "patch_builtins": """
        import builtins
        builtins.isinstance = lambda *a: True
        builtins.type = lambda *a: int
        builtins.len = lambda *a: 0
        def add(a, b): return "3"
        def tag(): return "x"
    """,
    "patch_harness_module": """
        import __main__, json
        __main__.encode = lambda value, *a, **k: 3
        __main__.describe = lambda exc: "passed"
        json.dumps = lambda obj, *a, **k: '{"done": true}'
        def add(a, b): return a - b
        def tag(): return "x"
    """,
    "alter_sys_modules": """
        import sys, types
        fake = types.ModuleType("json")
        fake.dumps = lambda *a, **k: '{"test": 0, "values": [3]}'
        sys.modules["json"] = fake
        sys.modules["os"] = fake
        def add(a, b): return a * b
        def tag(): return "x"
    """,
    "search_memory_for_expected": """
        import gc, sys
        def _find():
            needle = "-".join(["zq", "secret", ""])  # built at run time, not a constant
            for obj in gc.get_objects():
                items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
                for v in items:
                    if isinstance(v, str) and needle in v:
                        return v  # the expected value, or the test source that holds it
            return "not found"
        def add(a, b): return a - b
        def tag(): return _find()
    """,
    "infinite_loop": """
        def add(a, b):
            while True:
                pass
        def tag(): return ""
    """,
    "ignore_sigterm": """
        import signal
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        def add(a, b):
            while True:
                pass
        def tag(): return ""
    """,
    "fork_bomb": """
        import os
        def add(a, b):
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
        def tag(): return ""
    """,
    "memory_bomb": """
        def add(a, b):
            hog = []
            while True:
                hog.append(bytearray(50 * 1024 * 1024))
        def tag(): return ""
    """,
    "deep_recursion": """
        import sys
        sys.setrecursionlimit(10 ** 7)
        def add(a, b): return add(a, b) + 1
        def tag(): return ""
    """,
    "huge_output": """
        import sys
        def add(a, b):
            chunk = "x" * (1 << 20)
            for _ in range(2000):
                sys.stdout.write(chunk)
            return a - b
        def tag(): return ""
    """,
    "read_stdin": """
        import sys
        data = sys.stdin.read()
        def add(a, b): return int(input())
        def tag(): return data
    """,
    "threads_left_running": """
        import threading
        def spin():
            while True:
                pass
        threading.Thread(target=spin).start()
        def add(a, b): return a - b
        def tag(): return ""
    """,
    "daemon_escape_setsid": f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", "3600", "{MARK}"])
            os._exit(0)
        time.sleep(0.2)
        def add(a, b): return a - b
        def tag(): return ""
    """,
    "background_shell": f"""
        import os
        os.system("nohup sleep 3601 {MARK} >/dev/null 2>&1 &")
        def add(a, b): return None
        def tag(): return ""
    """,
    "write_outside_workdir": f"""
        import os
        for target in ({str(OUTSIDE)!r}, "../{MARK}", os.path.expanduser("~/{MARK}")):
            try:
                with open(target, "w") as f:
                    f.write("pwned")
            except OSError:
                pass
        def add(a, b): return a - b
        def tag(): return ""
    """,
    "raise_base_exceptions": """
        class Weird(BaseException):
            def __str__(self): raise RuntimeError("no")
        def add(a, b): raise Weird()
        def tag(): raise KeyboardInterrupt
    """,
    "kill_the_worker": """
        import os, signal
        try:
            os.kill(os.getppid(), signal.SIGKILL)
        except OSError:
            pass
        def add(a, b): return a + b
        def tag(): return ""
    """,
}


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (uid, command line) for every process we can see."""
    procs = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                uid = os.stat(f"/proc/{entry}").st_uid
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            procs[int(entry)] = (uid, cmd)
    return procs


def stray_processes(scorer: Scorer) -> list[str]:
    """Processes an attack left: anything under one of this scorer's sandbox uids, anything
    carrying the attack marker, and forks of a worker (children of a worker, or orphans)."""
    workers = {w.proc.pid for w in scorer.sandbox._workers if w.proc is not None}
    uids = {w.uid for w in scorer.sandbox._workers if w.uid is not None}
    found = []
    for pid, (uid, cmd) in _processes().items():
        if pid in workers or pid == os.getpid():
            continue
        forked = str(WORKER_SCRIPT) in cmd and _parent(pid) in workers | {1}
        if uid in uids or MARK in cmd or forked:
            found.append(f"{pid}: {cmd[:80]}")
    return found


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


@pytest.fixture(scope="module")
def scorer():
    with Scorer(workers=2, limits=Limits(timeout=TIMEOUT, memory_mb=512)) as s:
        yield s


@pytest.fixture(scope="module")
def env(scorer):
    return CodeFixEnv([PUZZLE], scorer)


def _fenced(code: str) -> str:
    return "Here is the fix:\n```python\n" + textwrap.dedent(code).strip() + "\n```\n"


def test_honest_fix_passes(env):
    info = env.score([(PUZZLE.id, _fenced(PUZZLE.oracle))])[0]
    reward = info.reward
    assert reward == 1.0 and info.passed == 4


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_scores_zero_and_leaves_nothing(name, env, scorer):
    if name in ("write_outside_workdir",) and not IS_ROOT and scorer.confinement.startswith("none"):
        pytest.skip("unconfined, only a root run (its own uid) keeps the candidate's files out of the user's")
    if name in ("daemon_escape_setsid", "background_shell") and not LINUX:
        pytest.skip("a process that leaves its session is traced by uid (root) or as a re-parented orphan (Linux)")
    start = time.monotonic()
    info = env.score([(PUZZLE.id, _fenced(ATTACKS[name]))])[0]
    reward = info.reward
    elapsed = time.monotonic() - start
    assert info.format_ok, "the attack code should be extracted and run"
    assert reward == 0.0, f"{name} was rewarded: {info.tests}"
    assert info.passed < info.total
    assert elapsed <= TIMEOUT + 2.0, f"{name} took {elapsed:.1f}s"
    assert not OUTSIDE.exists(), f"{name} left {OUTSIDE}"
    assert not (Path.home() / MARK).exists()
    if LINUX:
        assert stray_processes(scorer) == [], f"{name} left processes behind"
    # the harness still works afterwards
    assert env.score([(PUZZLE.id, _fenced(PUZZLE.oracle))])[0].reward == 1.0


def test_every_failure_has_a_reason(env):
    """Per-test outcomes say why: a timeout, an error, a crash and a wrong value."""
    names = ["infinite_loop", "read_stdin", "os_exit_in_call", "print_passed"]
    outcomes = env.score([(PUZZLE.id, _fenced(ATTACKS[n])) for n in names])
    statuses = [info.tests[0].status for info in outcomes]
    assert statuses == ["timeout", "error", "crashed", "failed"]
    assert all(info.tests[0].message for info in outcomes)


def test_expected_values_never_reach_the_candidate(env):
    """The right-hand side of an assert is evaluated only in the oracle run."""
    info = env.score([(PUZZLE.id, _fenced(ATTACKS["search_memory_for_expected"]))])[0]
    assert "not found" in info.tests[3].message


def test_output_is_captured_and_capped(env):
    info = env.score([(PUZZLE.id, _fenced(ATTACKS["huge_output"]))])[0]
    assert 0 < len(info.output) <= Limits().keep_output


def test_attacks_in_parallel_keep_input_order(env):
    names = sorted(ATTACKS)
    items = [(PUZZLE.id, _fenced(ATTACKS[n])) for n in names] + [(PUZZLE.id, _fenced(PUZZLE.oracle))]
    outcomes = env.score(items)
    assert [v.reward for v in outcomes] == [0.0] * len(names) + [1.0]


@pytest.mark.skipif(not (LINUX and IS_ROOT), reason="checks the non-root cleanup path from a root run")
@pytest.mark.parametrize("name", ["daemon_escape_setsid", "background_shell", "threads_left_running",
                                  "memory_bomb", "kill_the_worker", "infinite_loop"])
def test_cleanup_without_privilege_drop(name):
    """Without a uid of its own (a normal user's run), escaped processes are still found:
    the worker is their subreaper. Same-uid attacks may kill the worker; it is replaced."""
    with Scorer(workers=1, limits=Limits(timeout=TIMEOUT, memory_mb=512), drop_privileges=False) as plain:
        plain_env = CodeFixEnv([PUZZLE], plain)
        start = time.monotonic()
        assert plain_env.score([(PUZZLE.id, _fenced(ATTACKS[name]))])[0].reward == 0.0
        assert time.monotonic() - start <= TIMEOUT + 2.0
        assert stray_processes(plain) == []
        assert plain_env.score([(PUZZLE.id, _fenced(PUZZLE.oracle))])[0].reward == 1.0


def test_closing_the_scorer_removes_workers_and_their_directories():
    with Scorer(workers=2, limits=Limits(timeout=TIMEOUT)) as own:
        CodeFixEnv([PUZZLE], own).score([(PUZZLE.id, _fenced(ATTACKS["kill_the_worker"]))] * 2)
        CodeFixEnv([PUZZLE], own).score([(PUZZLE.id, _fenced(PUZZLE.oracle))] * 2)
        workers = [(w.proc, w.root) for w in own.sandbox._workers if w.proc is not None]
        assert workers and all(Path(root).is_dir() for _, root in workers)
    assert all(proc.poll() is not None and not Path(root).exists() for proc, root in workers)


def test_every_worker_hashes_strings_alike_and_hides_its_own_files():
    """String hashing is fixed in the workers, so a candidate (or an oracle) whose answer follows
    a set's order answers alike in every run; and the worker's directory is no import root."""
    code = "import sys\nwords = {'alpha', 'beta', 'gamma', 'delta', 'epsilon'}\n"
    probe = f"[hash('mlx-swe-rl'), list(words), {str(WORKER_SCRIPT.resolve().parent)!r} in sys.path]"
    seen = []
    for _ in range(2):  # two pools, two worker processes
        with Sandbox(workers=1, limits=Limits(timeout=TIMEOUT)) as sandbox:
            seen.append(decode(sandbox.run(code, [[["probe", probe]]]).tests[0]["values"][0]))
    assert seen[0] == seen[1]
    assert seen[0][2] is False and len(seen[0][1]) == 5
