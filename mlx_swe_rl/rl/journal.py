"""The journal of a long sampling job, a calibration or an evaluation: what it has finished so
far, so a killed one resumes.

Calibrating a large pool with a large model on a CPU takes longer than a session (550 puzzles
with the 1.5B: hours a round), and evaluating hundreds of puzzles with it most of one; the
report is written only at the end. So each puzzle's report row is appended to a journal beside
the report as soon as the puzzle is finished, and a job that finds its journal samples only the
puzzles it lacks. The journal goes once the report is written.

One JSON object per line: a header (what was being done: the settings, the puzzles in order
and who asked, e.g. the model), then a `session` line each time a job opens it, then a
`row` line per finished puzzle with the seconds since its session began. A journal whose header
differs from today's job is refused, never mixed in (one that finished no puzzle is replaced:
there is nothing in it to keep).

Resuming is not replaying: the puzzles left are sampled by a new engine from the same seed, so
their answers can differ from the ones an uninterrupted job would have drawn (the method,
rounds and settings are the same). The report says how many sessions it took.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..runfiles import append_jsonl

SUFFIX = ".journal.jsonl"


class JournalError(ValueError):
    """A journal that belongs to another job or cannot be read; the message is one line."""


def journal_path(report: Path) -> Path:
    """The journal of the job that writes `report` (calibration.json: calibration.journal.jsonl)."""
    return report.with_name(report.stem + SUFFIX)


@dataclass
class Journal:
    """An open journal: the rows of the puzzles finished before (by id) and the earlier
    sessions' totals; `add` appends a finished puzzle's row."""

    path: Path
    what: str = "calibration"  # the job, as messages name it (calibration, evaluation)
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    earlier: list[dict[str, Any]] = field(default_factory=list)  # per earlier session: seconds, puzzles, tokens
    started: float = field(default_factory=time.perf_counter)  # this session's start

    @classmethod
    def open(cls, path: Path, header: dict[str, Any], what: str = "calibration") -> Journal:
        """Open the journal at `path` for the job (`what`: calibration, evaluation) that `header`
        describes (JSON-ready), creating it, or reading back what an interrupted job of the same
        header finished. Raises JournalError for another header, unless that job finished nothing."""
        journal = cls(path, what)
        if path.is_file():
            journal._read(header)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            append_jsonl(path, [{"header": header}])
        append_jsonl(path, [{"session": len(journal.earlier) + 1}])
        return journal

    def _read(self, header: dict[str, Any]) -> None:
        text = self.path.read_text()
        lines = text.splitlines()
        records = []
        for n, line in enumerate(lines):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if n == len(lines) - 1:
                    break  # the last line, cut off by the kill: that puzzle is sampled again
                raise JournalError(f"{self.path}: line {n + 1} is not JSON; delete the file to start the {self.what} "
                                   "from the beginning") from None
        if not records or "header" not in records[0]:
            raise JournalError(f"{self.path}: not a journal; delete it to start the {self.what} from the beginning")
        if records[0]["header"] != header and not any("row" in r for r in records[1:]):
            self.path.write_text(json.dumps({"header": header}) + "\n")  # it finished nothing: nothing to keep
            return
        if records[0]["header"] != header:
            theirs = records[0]["header"]
            differ = sorted(k for k in {*theirs, *header} if theirs.get(k) != header.get(k))
            raise JournalError(f"{self.path}: an unfinished {self.what} of other {', '.join(differ)}; delete it to "
                               f"start the {self.what} from the beginning")
        if text and not text.endswith("\n"):  # cut off mid-line: rewrite it whole before appending after it
            self.path.write_text("".join(json.dumps(r) + "\n" for r in records))
        for record in records[1:]:
            if "session" in record:
                self.earlier.append({"seconds": 0.0, "puzzles": 0, "generated_tokens": 0, "completions": 0})
            elif "row" in record and self.earlier:
                row, totals = record["row"], self.earlier[-1]
                self.rows[row["id"]] = row
                totals["seconds"] = record["elapsed"]  # up to its last finished puzzle: later work was lost
                totals["puzzles"] += 1
                totals["generated_tokens"] += sum(c["num_tokens"] for c in row["completions"])
                totals["completions"] += len(row["completions"])

    def add(self, row: dict[str, Any]) -> None:
        """Record a finished puzzle's report row."""
        append_jsonl(self.path, [{"row": row, "elapsed": round(time.perf_counter() - self.started, 3)}])
        self.rows[row["id"]] = row

    def close(self) -> None:
        """The job's report is written: the journal has served."""
        self.path.unlink(missing_ok=True)


def progress(path: Path) -> tuple[int, int] | None:
    """(puzzles finished, puzzles in all) of the unfinished job journalled at `path`,
    or None when there is none (cheap enough for a dry run: no MLX)."""
    if not path.is_file():
        return None
    done, total = 0, 0
    with open(path) as f:
        for n, line in enumerate(f):
            if n == 0:
                try:
                    total = len(json.loads(line)["header"]["puzzles"])
                except (json.JSONDecodeError, KeyError, TypeError):
                    return None
            elif line.startswith('{"row"'):
                done += 1
    return done, total
