"""Where harvested code comes from: a source tree, an installed distribution, or the standard
library, each with the licence its code is under.

A source is named on the command line as one of:

- `stdlib`: this interpreter's standard library (the PSF licence, PSF-2.0); its tests, demos
  and GUI code are left out;
- a directory: every `*.py` under it, its licence read from a LICENSE/COPYING file in it or
  in one of its two parents (`licence.licence_id`);
- the name of an installed distribution (`networkx`): its `.py` files as its RECORD lists
  them, its licence from its metadata: `License-Expression`, else the `License :: OSI
  Approved :: ...` classifiers, else a short `License` field, else its licence file.

Only permissive licences are harvested (`PERMISSIVE`): code under them may be reused in a
training pool with its notice kept, which the seed's `source` records. Vendored code
(`_vendor/`, `extern/`, `third_party/`...) is never read: it is someone else's, under its own
licence (pip vendors certifi, under MPL-2.0), not the distribution's.
"""

from __future__ import annotations

import importlib.metadata
import platform
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from .licence import is_licence_file, licence_id

STDLIB = "stdlib"
STDLIB_LICENCE = "PSF-2.0"
PERMISSIVE = frozenset(("MIT", "MIT-0", "MIT-CMU", "BSD-2-Clause", "BSD-3-Clause", "BSD", "0BSD", "Apache-2.0",
                        "PSF-2.0", "ISC", "Unlicense", "CC0-1.0", "BSL-1.0", "Zlib", "HPND"))
# Standard-library folders that are not library code: tests, demos, GUI and build tools.
STDLIB_SKIPPED = frozenset(("site-packages", "dist-packages", "test", "tests", "idlelib", "tkinter", "turtledemo",
                            "lib2to3", "ensurepip", "venv", "__phello__", "distutils", "config-3"))
# Classifier words (`License :: OSI Approved :: MIT License`) -> SPDX identifiers.
CLASSIFIERS = {"MIT License": "MIT", "BSD License": "BSD", "Apache Software License": "Apache-2.0",
               "Python Software Foundation License": "PSF-2.0", "ISC License (ISCL)": "ISC",
               "The Unlicense (Unlicense)": "Unlicense", "MIT No Attribution License (MIT-0)": "MIT-0",
               "Historical Permission Notice and Disclaimer (HPND)": "HPND", "zlib/libpng License": "Zlib",
               "Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0"}
# Short free-text `License:` fields (older metadata) -> SPDX identifiers; matched whole, lowercased.
FIELD_NAMES = {"mit": "MIT", "mit license": "MIT", "bsd": "BSD", "new bsd": "BSD-3-Clause", "bsd license": "BSD",
               "3-clause bsd": "BSD-3-Clause", "bsd-3-clause": "BSD-3-Clause", "bsd-2-clause": "BSD-2-Clause",
               "apache 2.0": "Apache-2.0", "apache-2.0": "Apache-2.0", "apache license 2.0": "Apache-2.0",
               "apache software license": "Apache-2.0", "isc": "ISC", "psf": "PSF-2.0", "psfl": "PSF-2.0"}


class SourceError(ValueError):
    """A source the command line names that cannot be read (not a directory, not installed)."""


@dataclass(frozen=True)
class Source:
    name: str  # the seeds' topic folder and id prefix: lowercase letters, digits and '_'
    spec: str  # as given on the command line
    root: Path  # paths in the funnel and the seeds' provenance are relative to it
    files: tuple[Path, ...]
    licence: str  # an SPDX identifier or expression, or "unknown"
    version: str = ""  # the distribution's version, the interpreter's for the standard library

    @property
    def permissive(self) -> bool:
        return is_permissive(self.licence)


def is_permissive(expression: str) -> bool:
    """Whether an SPDX expression allows reuse under a permissive licence: some alternative
    of an `OR` whose every `AND` part is in `PERMISSIVE` ("MIT OR GPL-2.0" is; "MIT AND GPL-2.0"
    is not)."""
    flat = expression.replace("(", " ").replace(")", " ")
    return any(all(part.strip() in PERMISSIVE for part in re.split(r"\s+AND\s+", alternative))
               for alternative in re.split(r"\s+OR\s+", flat) if alternative.strip())


def slug(text: str) -> str:
    """`text` as a seed-id part: lowercase, runs of other characters as one '_'."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "x"


def _tree_licence(root: Path) -> str:
    """The licence of the first LICENSE/COPYING file in `root` or its two parents."""
    for folder in (root, root.parent, root.parent.parent):
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            if path.is_file() and is_licence_file(path.name):
                found = licence_id(path.read_text(encoding="utf-8", errors="replace"))
                if found != "unknown":
                    return found
    return "unknown"


SKIPPED_FOLDERS = frozenset(("test", "tests", "testing", "_vendor", "vendor", "_vendored", "vendored", "extern",
                             "_extern", "third_party", "thirdparty"))


def _is_skipped(relative: Path) -> bool:
    """Code that is not the source's own library code: a tests/ folder, test_*.py, *_test.py,
    conftest.py, or a vendored copy of another project."""
    name = relative.name
    return (any(part in SKIPPED_FOLDERS for part in relative.parts[:-1])
            or name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py")


def stdlib_source() -> Source:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in sorted(root.rglob("*.py"))
             if not any(part in STDLIB_SKIPPED or part.startswith("config-") for part in p.relative_to(root).parts[:-1])
             and not _is_skipped(p.relative_to(root))]
    return Source(STDLIB, STDLIB, root, tuple(files), STDLIB_LICENCE, platform.python_version())


def tree_source(root: Path) -> Source:
    files = [p for p in sorted(root.rglob("*.py")) if not _is_skipped(p.relative_to(root))]
    return Source(slug(root.resolve().name), str(root), root, tuple(files), _tree_licence(root))


def metadata_licence(dist: importlib.metadata.Distribution) -> str:
    """A distribution's licence from its metadata (see the module's docstring), or "unknown"."""
    meta = dist.metadata
    if meta.get("License-Expression"):
        return meta["License-Expression"].strip()
    found = sorted({CLASSIFIERS.get(c.split("::")[-1].strip(), "")
                    for c in meta.get_all("Classifier") or [] if c.startswith("License ::")} - {""})
    if found:
        return " OR ".join(found)  # several classifiers: the project offers each
    text = (meta.get("License") or "").strip()
    if text.lower() in FIELD_NAMES:
        return FIELD_NAMES[text.lower()]
    if text:
        named = licence_id(text)  # a whole licence text pasted into the field
        if named != "unknown":
            return named
    for file in dist.files or []:
        if is_licence_file(Path(str(file)).name):
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                named = licence_id(path.read_text(encoding="utf-8", errors="replace"))
                if named != "unknown":
                    return named
    return "unknown"


def distribution_source(name: str) -> Source:
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise SourceError(f"{name}: not a directory, not an installed distribution, and not '{STDLIB}'") from None
    root = Path(str(dist.locate_file("")))
    relative = [Path(str(f)) for f in dist.files or [] if str(f).endswith(".py")]
    files = [root / r for r in sorted(relative)
             if not _is_skipped(r) and ".." not in r.parts and (root / r).is_file()]
    return Source(slug(dist.metadata["Name"] or name), name, root, tuple(files), metadata_licence(dist), dist.version)


def resolve_source(spec: str) -> Source:
    """The source a command-line SRC names (see the module's docstring)."""
    if spec == STDLIB:
        return stdlib_source()
    path = Path(spec)
    if path.is_dir():
        return tree_source(path)
    if path.exists():
        raise SourceError(f"{spec}: not a directory (name a source tree, an installed distribution or '{STDLIB}')")
    return distribution_source(spec)
