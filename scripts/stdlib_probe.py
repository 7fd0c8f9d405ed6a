"""Which standard-library modules candidate code may import in the sandbox (docs/sandbox-stdlib.md).

Tries every name of `sys.stdlib_module_names` inside the real sandbox (`Sandbox`, one job per
module, confined as training confines candidates) and sorts the names into three lists:

- importable: `import NAME` works;
- refused: the sandbox's own ImportError ("sandbox: module 'socket' is refused here (no
  network)"), for a module in `worker.REFUSED` or one that imports such a module;
- other: it failed for another reason (another platform's module, a shared library the
  confined child may not read, a module the worker does not preload where the child may not
  read the standard library).

The answer depends on who runs it: as root, candidates run as a uid of their own, which may
not read the interpreter's library directory (a pyenv under /root); as an unprivileged user
they run as that user. Each kind of run is kept under its own key ("root", "unprivileged") of
docs/sandbox-stdlib.json, and the generated part of docs/sandbox-stdlib.md is rewritten from
both.

    python scripts/stdlib_probe.py [--json PATH] [--md PATH]
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

from mlx_swe_rl.sandbox.pool import Execution, Limits, Sandbox
from mlx_swe_rl.sandbox.verdict import decode

ROOT = Path(__file__).resolve().parents[1]
JSON_PATH = ROOT / "docs" / "sandbox-stdlib.json"
MD_PATH = ROOT / "docs" / "sandbox-stdlib.md"
BEGIN, END = "<!-- stdlib_probe.py: begin -->", "<!-- stdlib_probe.py: end -->"
REFUSAL = "is refused here"  # in every ImportError the sandbox's refusal raises
LIMITS = Limits(timeout=10.0, memory_mb=1024)
KINDS = ("importable", "refused", "other")
TITLES = {"root": "Run as root", "unprivileged": "Run as an unprivileged user"}


# ----------------------------------------------------------------------------- probing
def run_key() -> str:
    """The kind of run this process makes: "root" (candidates as a uid of their own) or "unprivileged"."""
    return "root" if hasattr(os, "geteuid") and os.geteuid() == 0 else "unprivileged"


def kind_of(error: str | None) -> str:
    """importable (no error), refused (the sandbox's own message) or other."""
    if error is None:
        return "importable"
    return "refused" if REFUSAL in error else "other"


def _failure(run: Execution) -> str | None:
    """Why a one-module job failed, None when its import worked."""
    test = run.tests.get(0)
    if test is not None and "error" not in test and test.get("values") == [True]:
        return None
    if test is not None and test.get("error"):
        return test["error"]
    return run.load_error or f"no result ({run.stop or run.exit})"


def probe_each(box: Sandbox, names: list[str]) -> dict[str, str | None]:
    """{name: None if `import name` works in a fresh sandbox child, else the error}."""
    jobs = [("", [[["exec", f"import importlib\nimportlib.import_module({name!r})"], ["probe", "True"]]], LIMITS)
            for name in names]
    return {name: _failure(run) for name, run in zip(names, box.run_many(jobs))}


IMPORT_ALL = '''
import importlib
def import_all(names):
    failed = {}
    for name in names:
        try:
            importlib.import_module(name)
        except BaseException as exc:
            failed[name] = f"{type(exc).__name__}: {exc}"[:300]
    return failed
'''


def probe_together(box: Sandbox, names: list[str]) -> dict[str, str]:
    """{name: error} for the names that do not import, all tried in one sandbox child (fast)."""
    run = box.run(IMPORT_ALL, [[["probe", f"import_all({names!r})"]]], LIMITS)
    test = run.tests.get(0)
    if test is None or "error" in test:
        raise RuntimeError(f"the import job failed: {test or run.load_error or run.stop or run.exit}")
    failed = decode(test["values"][0])
    if not isinstance(failed, dict):
        raise RuntimeError(f"the import job returned {failed!r}")
    return failed


def plain_importable(names: list[str]) -> set[str]:
    """The names that import in a plain `python -I -S`, unconfined (what this interpreter has:
    a build without lzma, say, lacks it inside the sandbox too)."""
    names = [n for n in names if n != "antigravity"]  # it opens a web browser
    code = ("import importlib, json, sys\nok = []\nfor n in json.loads(sys.argv[1]):\n"
            "    try:\n        importlib.import_module(n)\n        ok.append(n)\n"
            "    except BaseException:\n        pass\nopen(sys.argv[2], 'w').write(json.dumps(ok))\n")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ok.json"
        subprocess.run([sys.executable, "-I", "-S", "-c", code, json.dumps(names), str(out)],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=120, cwd=tmp)
        return set(json.loads(out.read_text())) if out.exists() else set()


def probe(workers: int | None = None) -> dict:
    """Probe every name of sys.stdlib_module_names; the record of this run."""
    names = sorted(sys.stdlib_module_names)
    start = time.monotonic()
    with Sandbox(workers=workers, limits=LIMITS) as box:
        confinement = box.confinement
        outcome = probe_each(box, names)
    lists = {kind: {} for kind in KINDS}
    for name, error in outcome.items():
        lists[kind_of(error)][name] = error
    return {
        "python": platform.python_version(),
        "platform": f"{sys.platform} {platform.machine()}",
        "confinement": confinement,
        "candidates_run_as": "a uid of their own (the worker runs as root)" if run_key() == "root"
        else "the user running the sandbox",
        "date": time.strftime("%Y-%m-%d"),
        "seconds": round(time.monotonic() - start, 1),
        "counts": {kind: len(lists[kind]) for kind in KINDS},
        "importable": sorted(lists["importable"]),
        "refused": lists["refused"],
        "other": lists["other"],
    }


# ----------------------------------------------------------------------------- the files
def load_record(path: Path = JSON_PATH) -> dict:
    """The committed record ({"runs": {key: run}}), empty where there is none."""
    return json.loads(path.read_text()) if path.exists() else {"runs": {}}


def _names(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names) if names else "(none)"


def _table(items: dict[str, str]) -> list[str]:
    rows = ["| module | error |", "|---|---|"]
    rows += [f"| `{name}` | {error.replace('|', '/')} |" for name, error in sorted(items.items())]
    return rows


def markdown(record: dict) -> str:
    """The generated part of docs/sandbox-stdlib.md: counts and lists of every run."""
    lines = [BEGIN, "", "Generated by `python scripts/stdlib_probe.py`; do not edit by hand.", ""]
    for key in sorted(record["runs"]):
        run = record["runs"][key]
        counts = run["counts"]
        lines += [f"### {TITLES.get(key, key)}", "",
                  f"Python {run['python']} on {run['platform']}, {run['date']}, confinement "
                  f"\"{run['confinement']}\", candidates run as {run['candidates_run_as']}: "
                  f"**{counts['importable']} importable, {counts['refused']} refused, {counts['other']} other** "
                  f"of {sum(counts.values())} names in `sys.stdlib_module_names` ({run['seconds']} s).", "",
                  f"Importable ({counts['importable']}): {_names(run['importable'])}.", "",
                  f"Refused ({counts['refused']}):", "", *_table(run["refused"]), "",
                  f"Other ({counts['other']}):", "", *_table(run["other"]), ""]
    return "\n".join(lines + [END]) + "\n"


def write_markdown(record: dict, path: Path = MD_PATH) -> None:
    """Replace the generated part of `path` (between the markers), keeping the prose around it."""
    text = path.read_text() if path.exists() else f"# Standard library in the sandbox\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        text = text.rstrip("\n") + f"\n\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1].lstrip("\n")
    path.write_text(head + markdown(record) + ("\n" + tail if tail else ""))


@click.command()
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=JSON_PATH, show_default=True)
@click.option("--md", "md_path", type=click.Path(path_type=Path), default=MD_PATH, show_default=True)
@click.option("--workers", type=int, default=None, help="sandbox workers (default: one per core)")
def main(json_path: Path, md_path: Path, workers: int | None) -> None:
    """Probe the standard library in the sandbox; update the record and the page."""
    run = probe(workers)
    record = load_record(json_path)
    record["runs"][run_key()] = run
    json_path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    write_markdown(record, md_path)
    counts = run["counts"]
    click.echo(f"{run_key()}: {counts['importable']} importable, {counts['refused']} refused, "
               f"{counts['other']} other ({run['confinement']}; {run['seconds']} s) -> {json_path}, {md_path}")


if __name__ == "__main__":
    main()
