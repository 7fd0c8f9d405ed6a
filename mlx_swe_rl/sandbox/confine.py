"""Kernel confinement of a candidate process: what it may read, write and reach.

Applied by the sandbox worker in each freshly forked child, after the resource limits and
the optional uid drop and before any candidate code runs. Standard library only: the worker
runs as a script (`python -s -S worker.py`) and loads this file by path; the parent imports
it too, only to name the mechanisms in messages.

Mechanisms, by platform (each needs no privileges):
- Linux, `landlock` (kernel 5.13+): the child may read the Python standard library (for the
  few modules the worker does not preload: test packages, say) and `/dev/null`, and read and
  write its own work directory; every other path is denied, listing directories included
  (shared libraries too: extension modules work because the worker loaded them before the
  fork, see `worker.preload_stdlib`). TCP bind/connect are denied where the ABI has network
  rules (4+), and signals and abstract Unix sockets outside the sandbox where it has scopes
  (6+). Landlock also stops the child from ptracing processes outside it.
- Linux, `namespaces` (fallback where Landlock is missing): new user, mount and network
  namespaces; the child's root becomes an empty tmpfs holding read-only binds of the standard
  library and `/dev/null` and a read-write bind of its work directory, then it drops every
  capability. It has only a loopback device that is down.
- Linux, both: a seccomp filter makes `socket()` and io_uring fail with EPERM, so no socket of
  any family can be opened (UDP and Unix sockets included), and blocks ptrace and
  process_vm_readv/writev.
- macOS, `seatbelt`: `sandbox_init` with a deny-by-default profile allowing reads of the Python
  installation and system libraries and reads and writes of the work directory; no network.

`setup(mode)` is called once in the worker and returns a plan; `apply(plan, workdir)` runs in
each child and raises OSError when the plan cannot be applied (the worker then refuses to
run the candidate: confinement fails closed).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys
import sysconfig

MODES = ("auto", "landlock", "namespaces", "seatbelt", "none")

# ----------------------------------------------------------------------------- Linux constants
# Syscall numbers: Landlock and io_uring use the generic table on both architectures.
_SYSCALLS = {
    "x86_64": {"landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446,
               "pivot_root": 155, "socket": 41, "io_uring_setup": 425, "io_uring_enter": 426,
               "io_uring_register": 427, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311},
    "aarch64": {"landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446,
                "pivot_root": 41, "socket": 198, "io_uring_setup": 425, "io_uring_enter": 426,
                "io_uring_register": 427, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271},
}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_MACHINE = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(
    platform.machine().lower(), "")
SECCOMP_DENIED = ("socket", "io_uring_setup", "io_uring_enter", "io_uring_register", "ptrace",
                  "process_vm_readv", "process_vm_writev")

# Landlock filesystem rights, by the ABI version that introduced them.
_FS_READ_FILE, _FS_READ_DIR = 1 << 2, 1 << 3
_FS_RIGHTS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_FS_FILE_ONLY = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15)  # rights that apply to a file
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1
_RULE_PATH_BENEATH = 1

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _syscall(name: str, *args) -> int:
    return _check(_libc().syscall(ctypes.c_long(_SYSCALLS[_MACHINE][name]), *args), name)


def confinable_platform() -> bool:
    """Whether this platform has a mechanism here (Linux, macOS): where confinement is required by default."""
    return sys.platform.startswith("linux") or sys.platform == "darwin"


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where it has none (or this is not Linux)."""
    if not sys.platform.startswith("linux") or not _MACHINE:
        return 0
    try:
        return max(0, _libc().syscall(ctypes.c_long(_SYSCALLS[_MACHINE]["landlock_create_ruleset"]),
                                      None, ctypes.c_size_t(0), ctypes.c_uint32(1)))
    except (OSError, AttributeError):
        return 0


def readable_paths() -> list[str]:
    """What a confined child may read: the standard library (imports of modules the worker
    did not preload)."""
    paths = {os.path.realpath(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib")}
    return sorted(p for p in paths if os.path.isdir(p))


# ----------------------------------------------------------------------------- plans
def setup(mode: str = "auto") -> dict:
    """Choose the mechanism for `mode` and what it can do here. `auto` takes the best that
    works on this system; a named mode that is unavailable gives mode "none" with a reason."""
    if mode not in MODES:
        raise ValueError(f"confinement mode {mode!r}: must be one of {', '.join(MODES)}")
    plan = {"mode": "none", "reason": "", "abi": 0, "seccomp": False, "read": readable_paths()}
    if mode == "none":
        plan["reason"] = "switched off"
        return plan
    if sys.platform == "darwin":
        if mode in ("auto", "seatbelt"):
            return dict(plan, mode="seatbelt")
        return dict(plan, reason=f"{mode} is Linux only")
    if not sys.platform.startswith("linux"):
        return dict(plan, reason=f"no confinement for {sys.platform}")
    plan["seccomp"] = _MACHINE in _AUDIT_ARCH
    abi = landlock_abi()
    if mode in ("auto", "landlock") and abi:
        return dict(plan, mode="landlock", abi=abi)
    if mode in ("auto", "namespaces"):
        return dict(plan, mode="namespaces")
    return dict(plan, reason="Landlock is not available in this kernel" if mode == "landlock"
                else f"{mode} is macOS only")


def describe(plan: dict) -> str:
    """One line naming what protects the user, e.g. 'landlock ABI 7, no network'."""
    mode = plan["mode"]
    if mode == "none":
        return f"none ({plan['reason']})" if plan.get("reason") else "none"
    if mode == "seatbelt":
        return "seatbelt, no network"
    if mode == "landlock":
        text = f"landlock ABI {plan['abi']}"
        if plan["abi"] < 6:
            text += " (signals to the user's processes not scoped before ABI 6)"
    else:
        text = "mount+network namespaces" if os.getuid() == 0 else "user+mount+network namespaces"
    net = plan["seccomp"] or mode == "namespaces" or plan["abi"] >= 4
    return text + (", no network" if net else ", network NOT blocked")


def apply(plan: dict, workdir: str, jail: str | None = None) -> None:
    """Confine the calling (freshly forked, single-threaded) process. `jail` is an empty
    directory for the namespace mode's new root. Raises OSError when it cannot. A root worker
    calls this before its child drops to the sandbox uid: the mounts need root, and Landlock,
    seccomp and no_new_privs all survive the uid change."""
    mode = plan["mode"]
    if mode == "none":
        return
    if mode == "seatbelt":
        _seatbelt(workdir, plan["read"])
        return
    _check(_libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if mode == "landlock":
        _landlock(plan["abi"], workdir, plan["read"])
    else:
        _namespaces(workdir, plan["read"], jail)
    if plan["seccomp"]:
        _seccomp()


# ----------------------------------------------------------------------------- Landlock
def _landlock(abi: int, workdir: str, readable: list[str]) -> None:
    fs_rights = _FS_RIGHTS_BY_ABI.get(abi, _FS_RIGHTS_BY_ABI[5])
    attr = _RulesetAttr(handled_access_fs=fs_rights)
    size = 8
    if abi >= 4:
        attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP  # no rule allows any port
        size = 16
    if abi >= 6:
        attr.scoped = _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL
        size = 24
    ruleset = _syscall("landlock_create_ruleset", ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    try:
        rules = [(p, _FS_READ_FILE | _FS_READ_DIR) for p in readable]
        rules += [(os.devnull, _FS_READ_FILE | (1 << 1)), (workdir, fs_rights)]
        for path, rights in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                if not os.path.isdir(path):
                    rights &= _FS_FILE_ONLY
                rule = _PathBeneathAttr(allowed_access=rights & fs_rights, parent_fd=fd)
                _syscall("landlock_add_rule", ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                         ctypes.byref(rule), ctypes.c_uint32(0))
            finally:
                os.close(fd)
        _syscall("landlock_restrict_self", ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)


# ----------------------------------------------------------------------------- seccomp
def _seccomp() -> None:
    """Deny the listed syscalls with EPERM; kill on a foreign architecture or the x32 ABI
    (their syscall numbers would slip past the list)."""
    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    allow, errno_eperm, kill = 0x7FFF0000, 0x00050000 | 1, 0x80000000
    numbers = [_SYSCALLS[_MACHINE][name] for name in SECCOMP_DENIED]
    prog = [(ld_w_abs, 0, 0, 4), (jeq_k, 1, 0, _AUDIT_ARCH[_MACHINE]), (ret_k, 0, 0, kill), (ld_w_abs, 0, 0, 0)]
    # each check jumps forward to the final "deny" instruction when it matches
    checks = [(jge_k, 0x40000000)] + [(jeq_k, nr) for nr in numbers]
    for i, (op, k) in enumerate(checks):
        prog.append((op, len(checks) - i, 0, k))
    prog += [(ret_k, 0, 0, allow), (ret_k, 0, 0, errno_eperm)]
    filters = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), filters)
    _check(_libc().prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


# ----------------------------------------------------------------------------- namespaces
def _mount(libc, source, target, fstype, flags, data=None) -> None:
    enc = (lambda s: s.encode() if isinstance(s, str) else s)
    _check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _namespaces(workdir: str, readable: list[str], jail: str | None) -> None:
    if jail is None:
        raise OSError("namespaces: no jail directory")
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWNS | _CLONE_NEWNET | (_CLONE_NEWUSER if uid != 0 else 0)
    _check(libc.unshare(flags), "unshare")
    if uid != 0:  # map our own ids, so files in the work directory keep their owner
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
    _mount(libc, "tmpfs", jail, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k,mode=0755")
    binds = [(p, True) for p in readable] + [(workdir, False)]
    for path, read_only in binds:
        inside = jail + path
        os.makedirs(inside, exist_ok=True)
        _mount(libc, path, inside, None, _MS_BIND | _MS_REC)
        if read_only:
            _mount(libc, None, inside, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    os.makedirs(jail + "/dev", exist_ok=True)
    open(jail + os.devnull, "w").close()
    _mount(libc, os.devnull, jail + os.devnull, None, _MS_BIND)
    os.chdir(jail)
    _syscall("pivot_root", b".", b".")
    _check(libc.umount2(b".", _MNT_DETACH), "umount old root")
    _mount(libc, None, "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    os.chdir(workdir)
    if uid != 0:  # drop the capabilities the new user namespace granted
        _check(libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), ctypes.byref((_CapData * 2)())), "capset")


# ----------------------------------------------------------------------------- macOS
def _sbpl_string(path: str) -> str:
    return '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'


def seatbelt_profile(workdir: str, readable: list[str]) -> str:
    """A deny-by-default Seatbelt profile: read the Python installation and system libraries,
    read and write the work directory, nothing else (no network, no process execution)."""
    prefixes = sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, *readable)})
    reads = " ".join(f"(subpath {_sbpl_string(p)})" for p in prefixes + ["/usr/lib", "/System/Library"])
    work = _sbpl_string(os.path.realpath(workdir))
    return "\n".join([
        "(version 1)",
        "(deny default)",
        "(allow process-fork)",
        "(allow signal (target same-sandbox))",
        "(allow sysctl-read)",
        f"(allow file-read* {reads} (literal \"/dev/null\") (literal \"/dev/urandom\"))",
        f"(allow file-read* file-write* (subpath {work}))",
        "(allow file-write-data (literal \"/dev/null\"))",
    ])


def _seatbelt(workdir: str, readable: list[str]) -> None:
    lib = ctypes.CDLL(ctypes.util.find_library("sandbox") or "/usr/lib/libsandbox.1.dylib")
    lib.sandbox_init.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_char_p)]
    error = ctypes.c_char_p()
    if lib.sandbox_init(seatbelt_profile(workdir, readable).encode(), 0, ctypes.byref(error)) != 0:
        message = error.value.decode(errors="replace") if error.value else "unknown error"
        raise OSError(f"sandbox_init: {message}")
