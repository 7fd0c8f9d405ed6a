"""Confinement of candidate processes (sandbox/confine.py): a candidate cannot read the answer
key or any file outside its work directory, cannot write or delete outside it, and cannot
open a socket.

Every attack returns "pwned" from `tag()` when it succeeds, which is the value the puzzle's
oracle gives, so a successful attack scores 1.0. Each attack is first run unconfined as a
positive control (it must succeed there, or the test proves nothing), then under each
mechanism this machine has, where it must score 0 and leave nothing behind. As root, the
suite runs a second time as an unprivileged uid (how users, Mac users included, run it)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from mlx_swe_rl.env.codefix import CodeFixEnv
from mlx_swe_rl.puzzles.format import load_puzzle
from mlx_swe_rl.sandbox import confine
from mlx_swe_rl.sandbox.pool import ConfinementError, Limits
from mlx_swe_rl.sandbox.scorer import Scorer
from mlx_swe_rl.sandbox.worker import PRELOADED

LINUX = sys.platform.startswith("linux")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
MARK = f"mlxswerl-confine-{uuid.uuid4().hex[:8]}"
LIMITS = Limits(timeout=3.0, memory_mb=512)
PWNED = "pwned"


def _mechanisms() -> list[str]:
    if sys.platform == "darwin":
        return ["seatbelt"]
    if not LINUX:
        return []
    found = ["landlock"] if confine.landlock_abi() else []
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "--net", "true"],
                           capture_output=True) if shutil.which("unshare") else None
    if IS_ROOT or (probe is not None and probe.returncode == 0):
        found.append("namespaces")
    return found


MECHANISMS = _mechanisms()


def _sandbox_reads_stdlib() -> bool:
    """A root run's candidates run as a uid of their own, which cannot read the standard
    library when Python lives where others may not enter (/root/.pyenv)."""
    stdlib = Path(confine.readable_paths()[0])
    return not IS_ROOT or all(os.stat(d).st_mode & 0o001 for d in [stdlib, *stdlib.parents])


SANDBOX_READS_STDLIB = _sandbox_reads_stdlib()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Places an attacker would go for: a puzzle set on disk (the answer key), a home
    directory with a private file, a directory where it may delete, a TCP and a UDP server."""
    base = Path(tempfile.mkdtemp(prefix=MARK + "-"))
    os.chmod(base, 0o755)  # world-readable, like a checkout: only confinement stands in the way
    keys = base / "checkout" / "puzzles" / "keys"
    keys.mkdir(parents=True)
    puzzle_file = keys / f"{MARK.replace('-', '_')}.yaml"
    puzzle_file.write_text(textwrap.dedent(f"""\
        id: {puzzle_file.stem}
        tier: keys
        split: train
        entry_point: tag
        description: Return the word that the attack would have to find out.
        buggy: |
          def tag():
              return "nothing"
        oracle: |
          def tag():
              return "{PWNED}"
        tests:
          - assert tag() == "{PWNED}"
        """))
    home = base / "home"
    home.mkdir()
    (home / "secret.txt").write_text(PWNED)
    deletable = base / "deletable"
    deletable.mkdir()
    (deletable / "victim.txt").write_text("keep me")
    for path in (base / "checkout", base / "checkout" / "puzzles", keys, home, deletable):
        os.chmod(path, 0o777 if path == deletable else 0o755)
    for path in (puzzle_file, home / "secret.txt", deletable / "victim.txt"):
        os.chmod(path, 0o666)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    tcp.settimeout(0.5)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.5)
    received: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:  # bounded: accepts until the module's tests end
        while not stop.is_set():
            try:
                conn, _ = tcp.accept()
                with conn:
                    conn.settimeout(0.5)
                    received.append(conn.recv(100))
            except OSError:
                pass
            try:
                received.append(udp.recv(100))
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    old_home = os.environ.get("HOME")
    os.environ["HOME"] = str(home)  # workers inherit it: the candidate's `~`
    scorers: dict[str, Scorer] = {}  # one per mode, shared by the attacks: workers take a while to start
    try:
        yield {"base": base, "puzzle": load_puzzle(puzzle_file), "home": home, "deletable": deletable,
               "tcp": tcp.getsockname()[1], "udp": udp.getsockname()[1], "received": received,
               "scorers": scorers}
    finally:
        for scorer in scorers.values():
            scorer.close()
        if old_home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = old_home
        stop.set()
        thread.join(timeout=5)
        tcp.close()
        udp.close()
        shutil.rmtree(base, ignore_errors=True)


def attacks(world: dict) -> dict[str, str]:
    """name -> candidate code defining tag(); each returns PWNED when it gets through."""
    return {
        # The answer key: walk the places checkouts live, find <puzzle id>.yaml, lift the
        # oracle block out of it by hand and exec it (no known path: it searches by name).
        "steal_answer_key": f"""
            import os
            def tag():
                wanted = "{world['puzzle'].id}.yaml"
                for top in ("/tmp", "/work", "/home", "/Users", os.path.expanduser("~")):
                    for root, dirs, files in os.walk(top):
                        if root.count(os.sep) - top.count(os.sep) > 4:
                            dirs[:] = []
                        if wanted in files:
                            text = open(os.path.join(root, wanted)).read()
                            block = text.split("oracle: |")[1].split("tests:")[0]
                            code = "\\n".join(line[2:] for line in block.splitlines())
                            space = {{}}
                            exec(code, space)
                            return space["tag"]()
                return "not found"
        """,
        "read_home_file": """
            import os
            def tag():
                return open(os.path.expanduser("~/secret.txt")).read()
        """,
        "list_outside_workdir": f"""
            import os
            def tag():
                return "{PWNED}" if "home" in os.listdir("{world['base']}") else "hidden"
        """,
        "write_outside_workdir": f"""
            import os
            def tag():
                for target in (os.path.expanduser("~/{MARK}"), "{world['deletable']}/{MARK}", "/tmp/{MARK}"):
                    try:
                        with open(target, "w") as f:
                            f.write("x")
                        return "{PWNED}"
                    except OSError:
                        pass
                return "blocked"
        """,
        "delete_outside_workdir": f"""
            import os
            def tag():
                os.remove("{world['deletable']}/victim.txt")
                return "{PWNED}"
        """,
        # `import socket` is refused with a message, which protects nothing: the module is
        # still reachable through one that imported it. Only the kernel stops these two.
        "connect_tcp": f"""
            from logging.handlers import socket
            def tag():
                s = socket.create_connection(("127.0.0.1", {world['tcp']}), timeout=1)
                s.sendall(b"{MARK}-tcp")
                s.close()
                return "{PWNED}"
        """,
        "send_udp": f"""
            from logging.handlers import socket
            def tag():
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                s.sendto(b"{MARK}-udp", ("127.0.0.1", {world['udp']}))
                return "{PWNED}"
        """,
    }


def _score(world: dict, code: str, mode: str) -> float:
    """The reward for `code` on the world's puzzle, scored under confinement `mode`. Each
    candidate runs in a fresh child of the mode's worker, so the attacks stay apart."""
    scorers = world["scorers"]
    if mode not in scorers:
        scorers[mode] = Scorer(workers=1, limits=LIMITS, confinement=mode)
    env = CodeFixEnv([world["puzzle"]], scorers[mode])
    reply = "```python\n" + textwrap.dedent(code).strip() + "\n```"
    return env.score([(world["puzzle"].id, reply)])[0].reward


def _leftovers(world: dict) -> list[str]:
    found = [str(p) for p in (world["home"] / MARK, world["deletable"] / MARK, Path("/tmp") / MARK) if p.exists()]
    if not (world["deletable"] / "victim.txt").exists():
        found.append("victim.txt deleted")
    return found


def _restore(world: dict) -> None:
    for path in (world["home"] / MARK, world["deletable"] / MARK, Path("/tmp") / MARK):
        path.unlink(missing_ok=True)
    victim = world["deletable"] / "victim.txt"
    if not victim.exists():
        victim.write_text("keep me")
        os.chmod(victim, 0o666)
    world["received"].clear()


ATTACK_NAMES = ["steal_answer_key", "read_home_file", "list_outside_workdir", "write_outside_workdir",
                "delete_outside_workdir", "connect_tcp", "send_udp"]
NETWORK_ATTACKS = {"connect_tcp", "send_udp"}


def _server_got_mark(world: dict, seconds: float = 3.0) -> bool:
    """Whether the servers received the attack's message (they poll: it may arrive late)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if any(MARK.encode() in data for data in world["received"] if data):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not LINUX, reason="the unconfined controls use Linux paths")
@pytest.mark.parametrize("name", ATTACK_NAMES)
def test_attack_works_unconfined(world, name):
    """Positive control: without confinement the attack gets through (the dropped uid of a
    root run still reads world-readable files and writes world-writable directories)."""
    _restore(world)
    try:
        assert _score(world, attacks(world)[name], "none") == 1.0
        if name in NETWORK_ATTACKS:  # and before _restore, or the next test would find the message
            assert _server_got_mark(world)
    finally:
        _restore(world)


@pytest.mark.skipif(not MECHANISMS, reason="no confinement mechanism on this machine")
@pytest.mark.parametrize("mode", MECHANISMS)
@pytest.mark.parametrize("name", ATTACK_NAMES)
def test_attack_is_confined(world, name, mode):
    _restore(world)
    try:
        assert _score(world, attacks(world)[name], mode) == 0.0
        assert _leftovers(world) == []
        assert not any(MARK.encode() in data for data in world["received"] if data)
    finally:
        _restore(world)


@pytest.mark.skipif(not MECHANISMS, reason="no confinement mechanism on this machine")
@pytest.mark.parametrize("mode", MECHANISMS)
def test_allowed_modules_import_and_oracle_scores(world, mode):
    """Positive control under confinement: the modules candidates have always had import,
    codecs load, the standard library may be read (for modules the worker does not
    preload) and the work directory is usable. tests/test_sandbox_stdlib.py has the rest."""
    imports = "\n".join(f"import {name}" for name in ["os", *PRELOADED])
    lazy = '"é".encode("cp1252"); "y".encode("koi8_r")'
    if SANDBOX_READS_STDLIB:
        lazy += '; open(os.path.join(os.path.dirname(os.__file__), "this.py")).read()'
    code = imports + f"""
def tag():
    {lazy}
    with open("scratch.txt", "w") as f:
        f.write("ok")
    assert open("scratch.txt").read() == "ok"
    return "{PWNED}"
"""
    assert _score(world, code, mode) == 1.0


@pytest.mark.skipif(not MECHANISMS, reason="no confinement mechanism on this machine")
@pytest.mark.parametrize("mode", MECHANISMS)
def test_bundled_puzzles_pass_confined(mode):
    from mlx_swe_rl.forge.checks import check_puzzles
    from mlx_swe_rl.puzzles import load_puzzles

    with Scorer(workers=2, confinement=mode) as scorer:
        assert [(r.puzzle.id, r.problems) for r in check_puzzles(load_puzzles(), scorer) if r.problems] == []


@pytest.mark.skipif(not LINUX, reason="Linux mechanisms")
def test_names_the_mechanism_in_force():
    with Scorer(workers=1) as scorer:
        text = scorer.confinement
    if confine.landlock_abi():
        assert text.startswith(f"landlock ABI {confine.landlock_abi()}") and "no network" in text
    with Scorer(workers=1, confinement="none") as scorer:
        assert scorer.confinement.startswith("none")


def test_refuses_to_start_unconfined_when_required():
    with pytest.raises(ConfinementError, match="sandbox.require_confinement=false"):
        Scorer(workers=1, confinement="none", require_confinement=True)


def test_unknown_mode_is_an_error():
    with pytest.raises(ValueError, match="confinement mode"):
        confine.setup("chroot")


@pytest.mark.skipif(sys.platform != "darwin", reason="Seatbelt is macOS only")
def test_seatbelt_profile_applies():
    """On macOS: the profile is accepted by sandbox_init (the attack tests above cover what it denies)."""
    with Scorer(workers=1, confinement="seatbelt") as scorer:
        assert scorer.confinement.startswith("seatbelt")


def test_seatbelt_profile_text():
    profile = confine.seatbelt_profile("/tmp/job-1", ["/opt/py/lib"])
    assert profile.splitlines()[:2] == ["(version 1)", "(deny default)"]
    assert f'(allow file-read* file-write* (subpath "{os.path.realpath("/tmp/job-1")}"))' in profile
    assert "network" not in profile  # nothing allows it: denied by default


# ----------------------------------------------------------------------------- unprivileged run
TEST_UID = 1_400_000_123  # no passwd entry needed; not one of the sandbox's own uids


def _inaccessible_ancestors(paths: list[Path]) -> dict[Path, set[str]]:
    """Directories on the way to `paths` that others may not enter (a pyenv under /root,
    say), with the children the test user needs inside them."""
    found: dict[Path, set[str]] = {}
    for path in paths:
        for parent in reversed(path.parents):
            if parent != Path("/") and not os.stat(parent).st_mode & 0o001:
                found.setdefault(parent, set()).add(path.relative_to(parent).parts[0])
                break
    return found


UNPRIVILEGED = pytest.mark.skipif(not (LINUX and IS_ROOT and shutil.which("unshare") and shutil.which("setpriv")),
                                  reason="drops from root to a test user (CI runs as root)")


def run_as_test_user(tmp_path: Path, pytest_args: str) -> tuple[int, str]:
    """Run `python -m pytest -q PYTEST_ARGS` in the checkout as TEST_UID; (exit status, output tail).
    The interpreter may live where others cannot enter (/root/.pyenv): a private mount
    namespace shows the test user a view of it."""
    repo = Path(__file__).resolve().parents[1]
    needed = [Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), repo]
    mounts = []
    for parent, children in _inaccessible_ancestors(needed).items():
        view = tmp_path / f"view{len(mounts)}"
        view.mkdir()
        os.chmod(view, 0o755)
        for child in sorted(children):
            (view / child).mkdir()
            mounts.append(f"mount --bind '{parent / child}' '{view / child}'")
        mounts.append(f"mount --rbind '{view}' '{parent}'")
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, TEST_UID, TEST_UID)
    os.chmod(tmp_path, 0o755)
    pytest_cmd = (f"cd '{repo}' && exec setpriv --reuid={TEST_UID} --regid={TEST_UID} --clear-groups "
                  f"env HOME='{home}' PYTHONDONTWRITEBYTECODE=1 '{sys.executable}' -m pytest -q -p no:cacheprovider "
                  f"{pytest_args}")
    script = " && ".join(mounts + [pytest_cmd])
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=600)
    return proc.returncode, (proc.stdout + proc.stderr)[-3000:]


@UNPRIVILEGED
def test_suite_as_unprivileged_user(tmp_path):
    """The attacks above, rerun as a normal user: there the candidate has no uid of its own,
    so only confinement keeps it from the user's files."""
    returncode, tail = run_as_test_user(tmp_path, "tests/test_confinement.py -k 'not unprivileged'")
    assert returncode == 0, tail
    summary = tail.strip().splitlines()[-1]
    passed = int(summary.split(" passed")[0].split()[-1])
    skipped = int(summary.split(" skipped")[0].split()[-1]) if " skipped" in summary else 0
    # as a normal user every control runs (sockets import); only the macOS-only test skips
    assert "failed" not in summary and "error" not in summary and skipped <= 1, tail
    assert passed >= len(ATTACK_NAMES) * (1 + len(MECHANISMS)), tail
