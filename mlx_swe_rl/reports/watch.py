"""`mlx-swe-rl watch RUN_DIR`: a local web page that follows a run from its files alone.

The server reads what the trainer writes (history.jsonl, rollouts.jsonl, eval-*.json,
config.yaml, passrates.json; on a data-parallel run rank 0 writes the same files) and serves one page plus two
JSON endpoints; the page polls them and redraws, so a finished run and one still going look
the same. Nothing here imports MLX or loads a model.

Safety: the server binds to 127.0.0.1 only and answers only requests whose Host header names
the loopback address (a web page elsewhere cannot reach it through DNS rebinding). Model text
is untrusted: the page inserts it as text nodes only, and a Content-Security-Policy forbids
inline scripts, so text that looks like HTML stays text.
"""

from __future__ import annotations

import difflib
import json
import math
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from ..rl.passrates import PASSRATES_FILE, PassRates
from ..runfiles import upgrade_history_line

HOST = "127.0.0.1"
PAGE_DIR = Path(__file__).with_name("watch_page")
ASSETS = {"/": ("index.html", "text/html; charset=utf-8"),
          "/watch.js": ("watch.js", "text/javascript; charset=utf-8"),
          "/watch.css": ("watch.css", "text/css; charset=utf-8")}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class WatchError(Exception):
    """A run directory or port that cannot be watched; the message is one line for the user."""


# --- reading files that are still being written ------------------------------------------------

class JsonlTail:
    """The records of a JSON-lines file that another process appends to.

    Each `read` parses only the complete lines added since the last one; a line still being
    written (no newline yet) waits for the next read, and a line that does not parse is
    skipped. A file that was replaced, shortened or rewritten (`--resume` drops the lines after
    its checkpoint) is read again from the start.
    """

    def __init__(self, path: Path):
        self.path = path
        self.records: list[dict[str, Any]] = []
        self._offset = 0
        self._last = b""  # the last complete line read, to notice a rewrite
        self._ident: tuple[int, int] | None = None

    def read(self) -> list[dict[str, Any]]:
        try:
            stat = self.path.stat()
            with open(self.path, "rb") as f:
                if (stat.st_dev, stat.st_ino) != self._ident or not self._unchanged(f, stat.st_size):
                    self.records, self._offset, self._last = [], 0, b""
                    self._ident = (stat.st_dev, stat.st_ino)
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            self.records, self._offset, self._last, self._ident = [], 0, b"", None
            return self.records
        end = chunk.rfind(b"\n")
        if end < 0:
            return self.records
        lines = chunk[:end].split(b"\n")
        for line in lines:
            record = _parse_line(line)
            if record is not None:
                self.records.append(record)
        self._offset += end + 1
        self._last = lines[-1] + b"\n"
        return self.records

    def _unchanged(self, f: Any, size: int) -> bool:
        if size < self._offset:
            return False
        if not self._last:
            return True
        f.seek(self._offset - len(self._last))
        return f.read(len(self._last)) == self._last


def _parse_line(line: bytes) -> dict[str, Any] | None:
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


@dataclass
class CachedFile:
    """A whole-file reader that parses again only when the file's size or mtime changes, and
    keeps the last good content while a file is missing its end (being written)."""

    path: Path
    parse: Any  # bytes -> value; raises ValueError on content it cannot use
    value: Any = None
    _stamp: tuple[int, int] | None = None

    def read(self) -> Any:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self.value, self._stamp = None, None
            return None
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            try:
                self.value = self.parse(self.path.read_bytes())
                self._stamp = stamp
            except (OSError, ValueError, yaml.YAMLError):
                pass  # try again on the next poll
        return self.value


def _eval_summary(data: bytes) -> dict[str, Any]:
    """What the page shows of an evaluation report: settings, totals with their intervals and
    the paired change from before training; the completions stay on disk."""
    report = json.loads(data)
    if not isinstance(report, dict) or not isinstance(report.get("totals"), list):
        raise ValueError("not an evaluation report")
    rows = report.get("puzzles") or []
    return {"settings": report.get("settings") or {}, "totals": report["totals"],
            "change_vs_before": report.get("change_vs_before"), "date": (report.get("meta") or {}).get("date"),
            "puzzles": {r["id"]: r.get("pass@1") for r in rows if isinstance(r, dict) and "id" in r}}


def _pass_rates(data: bytes) -> dict[str, Any]:
    """The pass-rate estimates as the page shows them: the step they are at, one row per puzzle."""
    rates = PassRates.from_json(json.loads(data))  # PassRateError is a ValueError: tried again later
    return {"step": rates.step, "decay": rates.decay, "puzzles": rates.rows()}


def _config(data: bytes) -> dict[str, Any]:
    text = data.decode("utf-8", "replace")
    parsed = yaml.safe_load(text)
    return {"text": text, "values": parsed if isinstance(parsed, dict) else {}}


def eval_order(name: str) -> tuple[int, str]:
    """before, the periodic step-N evaluations in step order, after, then anything else."""
    if name == "before":
        return 0, name
    if name.startswith("step-"):
        return 1, name
    return (2, name) if name == "after" else (3, name)


# --- the buggy code behind each puzzle id ------------------------------------------------------

def _locate(value: str, run_dir: Path) -> Path | None:
    """A path from the run's config: as given (relative to where training ran, usually the
    current directory), else relative to one of the run directory's parents."""
    path = Path(value).expanduser()
    if path.is_absolute() or path.exists():
        return path if path.exists() else None
    for parent in run_dir.resolve().parents:
        if (parent / path).exists():
            return parent / path
    return None


def puzzle_sources(cfg: dict[str, Any], run_dir: Path) -> list[Path | None]:
    """The puzzle directories a run's config draws from (None = the bundled set): the training
    set's and those of `train.eval_set` files. Missing ones are left out."""
    from ..puzzles.trainset import TrainSetError, source_directory

    p = cfg.get("puzzles") or {}
    named: list[tuple[str, bool]] = []
    if p.get("train_set"):
        named.append((p["train_set"], True))
    elif p.get("dir"):
        named.append((p["dir"], False))
    sources: list[Path | None] = [] if named else [None]
    for value in (cfg.get("train") or {}).get("eval_set") or []:
        named.append((value, True))
    for value, is_set in named:
        path = _locate(str(value), run_dir)
        if path is None:
            continue
        try:
            sources.append(source_directory(path) if is_set else path)
        except TrainSetError:
            continue
    return list(dict.fromkeys(sources))


def load_puzzle_index(cfg: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """Puzzle id -> Puzzle for every puzzle of the directories the run drew from; whatever
    cannot be loaded is left out (its rollouts then show their code without a diff)."""
    from ..puzzles.format import PuzzleError, load_puzzles

    index: dict[str, Any] = {}
    for source in puzzle_sources(cfg, run_dir):
        try:
            for puzzle in load_puzzles(source):
                index.setdefault(puzzle.id, puzzle)
        except (PuzzleError, OSError):
            continue
    return index


def code_diff(buggy: str, code: str) -> list[str]:
    """Unified diff lines from the puzzle's buggy code to the model's code."""
    return list(difflib.unified_diff(buggy.rstrip("\n").splitlines(), code.rstrip("\n").splitlines(),
                                     "buggy", "model", lineterm="", n=3))


# --- the run, as the page sees it --------------------------------------------------------------

@dataclass
class RunWatcher:
    """Everything the page shows, read from the run directory on demand (thread-safe)."""

    run_dir: Path
    history: JsonlTail = field(init=False)
    rollouts: JsonlTail = field(init=False)
    config: CachedFile = field(init=False)
    pass_rates: CachedFile = field(init=False)
    evals: dict[str, CachedFile] = field(default_factory=dict)
    _puzzles: dict[str, Any] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _index_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.history = JsonlTail(self.run_dir / "history.jsonl")
        self.rollouts = JsonlTail(self.run_dir / "rollouts.jsonl")
        self.config = CachedFile(self.run_dir / "config.yaml", _config)
        self.pass_rates = CachedFile(self.run_dir / PASSRATES_FILE, _pass_rates)

    def _read_evals(self) -> dict[str, dict[str, Any]]:
        for path in self.run_dir.glob("eval-*.json"):
            name = path.stem[len("eval-"):]
            if name not in self.evals:
                self.evals[name] = CachedFile(path, _eval_summary)
        found = {name: cached.read() for name, cached in self.evals.items()}
        return {name: found[name] for name in sorted(found, key=eval_order) if found[name] is not None}

    def data(self) -> dict[str, Any]:
        """The page's main payload: config, every step record, alarms, evaluations, the steps
        that have rollouts, and when the run's files last changed."""
        with self._lock:
            history = list(self.history.read())
            rollouts = self.rollouts.read()
            config = self.config.read() or {"text": "", "values": {}}
            evals = self._read_evals()
            pass_rates = self.pass_rates.read()  # None for runs made before pass rates existed
        values = config["values"]
        sampling, train = values.get("sampling") or {}, values.get("train") or {}
        alarms = [{"step": h.get("step"), "name": str(a.get("name", "?")), "message": str(a.get("message", ""))}
                  for h in history for a in (h.get("alarms") or []) if isinstance(a, dict)]
        steps: dict[int, list[int]] = {}
        for r in rollouts:
            if isinstance(r.get("step"), int):
                count = steps.setdefault(r["step"], [0, 0, 0])
                count[0] += bool(r.get("solved"))
                count[1] += 1
                count[2] += bool(r.get("error"))
        history = [upgrade_history_line(h) for h in history]  # `errored` in records made before it existed
        return _finite({
            "run_dir": str(self.run_dir), "run_name": values.get("run_name") or self.run_dir.name,
            "model": (values.get("model") or {}).get("spec"),
            "max_tokens": sampling.get("max_tokens"), "eval_max_tokens": train.get("eval_max_tokens"),
            "total_steps": train.get("steps"), "final_eval": train.get("final_eval"),
            "config": values, "config_text": config["text"], "history": history, "alarms": alarms,
            "pass_rates": pass_rates,
            "evals": [{"name": name, **{k: v for k, v in e.items() if k != "puzzles"}} for name, e in evals.items()],
            "puzzle_changes": _puzzle_changes(evals),
            "rollout_steps": [{"step": s, "solved": c[0], "completions": c[1], "errored": c[2]}
                              for s, c in sorted(steps.items())],
            "updated": self._last_change(), "now": time.time(),
        })

    def step_rollouts(self, step: int | None) -> dict[str, Any]:
        """The completions of one step (default: the latest), grouped by puzzle, each with its
        code as a diff against the puzzle's buggy code and its test outcomes."""
        with self._lock:
            rollouts = self.rollouts.read()
            if step is None:
                step = max((r["step"] for r in rollouts if isinstance(r.get("step"), int)), default=None)
            chosen = [r for r in rollouts if r.get("step") == step]
        puzzles = self._puzzle_index() if chosen else {}
        groups: dict[str, dict[str, Any]] = {}
        for r in chosen:
            pid = str(r.get("puzzle_id", "?"))
            puzzle = puzzles.get(pid)
            group = groups.get(pid)
            if group is None:
                group = groups[pid] = {"id": pid, "tier": getattr(puzzle, "tier", None),
                                       "description": getattr(puzzle, "description", None),
                                       "buggy": getattr(puzzle, "buggy", None), "rollouts": []}
            group["rollouts"].append(_rollout_view(r, puzzle))
        for group in groups.values():
            members = group["rollouts"]
            group["solved"] = sum(bool(m["solved"]) for m in members)
            group["mean_reward"] = sum(m["reward"] or 0.0 for m in members) / len(members)
        return _finite({"step": step, "puzzles": list(groups.values())})

    def _puzzle_index(self) -> dict[str, Any]:
        # Loaded once, outside the data lock: a forged set is a thousand YAML files, and the
        # page's polls should not wait for them.
        with self._index_lock:
            if self._puzzles is None:
                with self._lock:
                    values = (self.config.read() or {}).get("values") or {}
                self._puzzles = load_puzzle_index(values, self.run_dir)
        return self._puzzles

    def _last_change(self) -> float | None:
        stamps = []
        for path in [self.run_dir / "history.jsonl", self.run_dir / "rollouts.jsonl",
                     self.run_dir / PASSRATES_FILE, *self.run_dir.glob("eval-*.json")]:
            try:
                stamps.append(path.stat().st_mtime)
            except FileNotFoundError:
                continue
        return max(stamps, default=None)


def _rollout_view(r: dict[str, Any], puzzle: Any) -> dict[str, Any]:
    """One completion as the page shows it. Lines written before rollouts.jsonl recorded the
    extracted code get it extracted here, with the same rule as the scorer; lines written before
    it took the evaluation reports' keys (`text`, `num_tokens`) name them `completion`, `tokens`."""
    text = r.get("text", r.get("completion"))
    completion = text if isinstance(text, str) else ""
    if "code" in r:
        code = r["code"] if isinstance(r["code"], str) else None
    elif puzzle is not None:
        from ..env.prompts import extract_code

        code = extract_code(completion, puzzle.entry_point)
    else:
        code = None
    buggy = getattr(puzzle, "buggy", None)
    tests = r.get("tests")
    return {"reward": r.get("reward"), "solved": bool(r.get("solved")), "completion": completion,
            "tokens": r.get("num_tokens", r.get("tokens")), "truncated": r.get("truncated"), "code": code,
            "diff": code_diff(buggy, code) if code is not None and buggy is not None else None,
            "tests": [{"status": str(t.get("status", "?")), "detail": str(t.get("detail", ""))}
                      for t in tests if isinstance(t, dict)] if isinstance(tests, list) else None,
            "error": str(r["error"]) if r.get("error") else None,  # its puzzle could not be scored
            "turns": [{"completion": str(t.get("text", t.get("completion", ""))), "public_ok": t.get("public_ok"),
                       "solved": bool(t.get("solved")), "feedback": t.get("feedback")}
                      for t in r["turns"] if isinstance(t, dict)] if isinstance(r.get("turns"), list) else None}


def _puzzle_changes(evals: dict[str, dict[str, Any]]) -> dict[str, list[str]] | None:
    """Puzzles whose pass@1 rose or fell from the first evaluation to the last."""
    if len(evals) < 2:
        return None
    first, last = (evals[name]["puzzles"] for name in (next(iter(evals)), list(evals)[-1]))
    common = [pid for pid in last if pid in first and None not in (first[pid], last[pid])]
    return {"from": next(iter(evals)), "to": list(evals)[-1],
            "improved": sorted(pid for pid in common if last[pid] > first[pid]),
            "worsened": sorted(pid for pid in common if last[pid] < first[pid])}


def _finite(value: Any) -> Any:
    """JSON for a browser: NaN and infinities (a bootstrap over no puzzles) become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# --- the server --------------------------------------------------------------------------------

class WatchServer(ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 that serves one run's page."""

    daemon_threads = True  # a browser's open connection never keeps Ctrl-C waiting

    def __init__(self, watcher: RunWatcher, port: int):
        self.watcher = watcher
        super().__init__((HOST, port), WatchHandler)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.server_address[1]}/"


class WatchHandler(BaseHTTPRequestHandler):
    server: WatchServer

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        if not self._from_loopback_name():
            self._send(HTTPStatus.FORBIDDEN, b"forbidden: open the page as http://127.0.0.1:PORT/\n",
                       "text/plain; charset=utf-8")
            return
        url = urlsplit(self.path)
        if url.path in ASSETS:
            name, kind = ASSETS[url.path]
            self._send(HTTPStatus.OK, (PAGE_DIR / name).read_bytes(), kind)
        elif url.path == "/api/data":
            self._json(self.server.watcher.data())
        elif url.path == "/api/rollouts":
            raw = (parse_qs(url.query).get("step") or [""])[0]
            if raw and not raw.lstrip("-").isdigit():
                self._send(HTTPStatus.BAD_REQUEST, b"step: expected an integer\n", "text/plain; charset=utf-8")
                return
            self._json(self.server.watcher.step_rollouts(int(raw) if raw else None))
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")

    def _from_loopback_name(self) -> bool:
        host = (self.headers.get("Host") or "").strip().lower()
        port = self.server.server_address[1]
        return host in {f"{HOST}:{port}", f"localhost:{port}", HOST, "localhost"}

    def _json(self, payload: Any) -> None:
        self._send(HTTPStatus.OK, json.dumps(payload, allow_nan=False).encode(), "application/json")

    def _send(self, status: HTTPStatus, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for key, value in SECURITY_HEADERS.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # one line per poll every few seconds would bury the terminal


def open_server(run_dir: Path, port: int) -> WatchServer:
    """A server for `run_dir` listening on 127.0.0.1:`port` (0 = any free port), not yet
    serving; WatchError for a directory that holds no run or a port in use."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise WatchError(f"{run_dir}: no such directory")
    if not any((run_dir / name).is_file() for name in ("config.yaml", "history.jsonl")):
        raise WatchError(f"{run_dir}: not a run directory (no config.yaml or history.jsonl)")
    try:
        return WatchServer(RunWatcher(run_dir), port)
    except OSError as exc:
        raise WatchError(f"--port: cannot listen on {HOST}:{port} ({exc.strerror or exc}); "
                         f"choose another port, or --port 0 for a free one") from None
