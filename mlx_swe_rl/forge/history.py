"""Git plumbing for the miner: commits with their changed files, and blobs.

Plain `git` subprocesses, no library: one `git log` streams every commit with its raw diff
(blob ids and status per file) and numstat (changed lines per file); one long-running
`git cat-file --batch` serves the blobs. Rename detection is off, so a renamed file shows as
a deletion and an addition (the miner drops both alike, and git is spared the work).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

RECORD, FIELD = "\x1e", "\x1f"
# sha, parents, author, committer, committer date (ISO 8601), committer time (Unix), message
LOG_FORMAT = FIELD.join(["%H", "%P", "%an <%ae>", "%cn <%ce>", "%cI", "%ct", "%B"])
# Settings a user's git config could change that the parser relies on.
GIT_CONFIG = ("-c", "core.quotePath=false", "-c", "log.showSignature=false", "-c", "log.showRoot=true",
              "-c", "color.ui=false")


class GitError(RuntimeError):
    """A git command failed; the message is git's first line of complaint."""


@dataclass(frozen=True)
class FileChange:
    path: str
    status: str  # A (added), M (modified), D (deleted), T (type changed); renames come as D + A
    old_blob: str  # 40 zeros when there is no old side
    new_blob: str
    added: int | None = None  # lines, from numstat; None for a binary file
    deleted: int | None = None


@dataclass(frozen=True)
class Commit:
    sha: str
    parents: tuple[str, ...]
    author: str  # "name <email>"
    committer: str
    date: str  # committer date, ISO 8601 with the committer's offset
    timestamp: int  # committer time, seconds since the epoch
    message: str
    files: tuple[FileChange, ...]  # empty for merges (git log shows them no diff)


def git_bytes(repo: Path, *args: str) -> bytes:
    """Run one git command in `repo` and return its standard output as bytes (`git archive`)."""
    proc = subprocess.run(["git", *GIT_CONFIG, "-C", str(repo), *args], capture_output=True)
    if proc.returncode != 0:
        message = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise GitError(message[0] if message else f"git {args[0]} failed with status {proc.returncode}")
    return proc.stdout


def git(repo: Path, *args: str) -> str:
    """Run one git command in `repo` and return its standard output."""
    return git_bytes(repo, *args).decode("utf-8", "replace")


def is_repository(path: Path) -> bool:
    """True when `path` is a git repository (its work tree or the repository itself)."""
    try:
        return Path(path).is_dir() and git(path, "rev-parse", "--git-dir").strip() != ""
    except (GitError, OSError):
        return False


def is_remote(spec: str) -> bool:
    """`spec` names a repository to clone (a URL, or git's `user@host:path`), not a local path."""
    return "://" in spec or (spec.startswith("git@") and ":" in spec)


def remote_name(url: str) -> str:
    """The folder a clone of `url` gets: its last path component, less `.git`."""
    name = url.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    return name[:-4] if name.endswith(".git") else name


def clone(url: str, dest: Path, commit: str | None = None) -> Path:
    """A clone of `url` in `dest` with its whole history (the history is what is mined), made
    once and reused, checked out at `commit` when given (fetched again if the clone lacks it)."""
    dest = Path(dest)
    if not is_repository(dest):
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise GitError(f"{dest}: exists and is not a git repository (choose another --clone-dir)")
        dest.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["git", "clone", "--quiet", url, str(dest)], capture_output=True)
        if proc.returncode != 0:
            message = proc.stderr.decode("utf-8", "replace").strip().splitlines()
            raise GitError(f"git clone {url}: " + (message[-1] if message else f"status {proc.returncode}"))
    if commit is not None:
        try:
            git(dest, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
        except GitError:
            git(dest, "fetch", "--quiet", "origin")
        git(dest, "checkout", "--quiet", "--detach", commit)
    return dest


def head(repo: Path) -> str | None:
    """The sha HEAD points to, or None in a repository without commits."""
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", "HEAD^{commit}").strip() or None
    except GitError:
        return None


def repository_name(repo: Path) -> str:
    """The name of the repository's folder (for a bare `name.git`, `name`)."""
    try:
        top = git(repo, "rev-parse", "--show-toplevel").strip()
    except GitError:  # a bare repository has no work tree
        top = ""
    path = Path(top) if top else Path(repo).resolve()
    return path.name[:-4] if path.name.endswith(".git") and path.name != ".git" else path.name


def _log_args(max_commits: int | None, since: str | None) -> list[str]:
    args = []
    if max_commits is not None:
        args.append(f"--max-count={max_commits}")
    if since is not None:
        args.append(f"--since={since}")
    return args


def count_commits(repo: Path, max_commits: int | None = None, since: str | None = None) -> int:
    """How many commits `commits` will yield (for a progress bar)."""
    return int(git(repo, "rev-list", "--count", *_log_args(max_commits, since), "HEAD").strip() or 0)


def commits(repo: Path, max_commits: int | None = None, since: str | None = None) -> Iterator[Commit]:
    """The commits reachable from HEAD, newest first, each with its changed files, streamed
    from one `git log`."""
    cmd = ["git", *GIT_CONFIG, "-C", str(repo), "log", "--no-renames", "--raw", "--numstat", "--no-abbrev",
           "--no-color", "--no-ext-diff", f"--format={RECORD}{LOG_FORMAT}{FIELD}", *_log_args(max_commits, since),
           "HEAD", "--"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        pending = b""
        for chunk in iter(lambda: proc.stdout.read(1 << 16), b""):
            pending += chunk
            *done, pending = pending.split(RECORD.encode())
            for record in done:
                if record:
                    yield parse_record(record.decode("utf-8", "replace"))
        if pending:
            yield parse_record(pending.decode("utf-8", "replace"))
        error = proc.stderr.read().decode("utf-8", "replace").strip() if proc.stderr else ""
        if proc.wait() != 0:
            raise GitError(error.splitlines()[0] if error else "git log failed")


def parse_record(record: str) -> Commit:
    """One commit of `git log --format=LOG_FORMAT --raw --numstat` output."""
    sha, parents, author, committer, date, timestamp, rest = record.split(FIELD, 6)
    message, _, diff = rest.rpartition(FIELD)
    raw: dict[str, tuple[str, str, str]] = {}
    counts: dict[str, tuple[int | None, int | None]] = {}
    for line in diff.splitlines():
        if line.startswith(":"):  # ":100644 100644 <old> <new> M\tpath"
            meta, _, path = line.partition("\t")
            fields = meta.split()
            raw[path] = (fields[4][:1], fields[2], fields[3])
        elif line.count("\t") >= 2:  # "added\tdeleted\tpath" ("-" for binary files)
            added, deleted, path = line.split("\t", 2)
            counts[path] = (int(added) if added.isdigit() else None, int(deleted) if deleted.isdigit() else None)
    files = tuple(FileChange(path, status, old, new, *counts.get(path, (None, None)))
                  for path, (status, old, new) in raw.items())
    return Commit(sha, tuple(parents.split()), author, committer, date, int(timestamp), message.strip("\n"), files)


class Blobs:
    """Object contents from one long-running `git cat-file --batch` (a sha or `rev:path`)."""

    def __init__(self, repo: Path):
        self.proc = subprocess.Popen(["git", *GIT_CONFIG, "-C", str(repo), "cat-file", "--batch"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def read(self, name: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(name.encode() + b"\n")
        self.proc.stdin.flush()
        header = self.proc.stdout.readline().split()
        if len(header) != 3 or header[1] == b"missing":
            return None
        data = self.proc.stdout.read(int(header[2]))
        self.proc.stdout.read(1)  # the newline after each object
        return data

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()

    def __enter__(self) -> "Blobs":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def top_level_files(repo: Path, rev: str = "HEAD") -> list[str]:
    """Names of the files (not folders) at the top of the tree of `rev`, sorted."""
    names = []
    for line in git(repo, "ls-tree", rev).splitlines():  # "<mode> <type> <sha>\t<name>"
        meta, _, name = line.partition("\t")
        if meta.split()[1:2] == ["blob"]:
            names.append(name)
    return sorted(names)
