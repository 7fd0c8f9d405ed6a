"""What candidate code may import in the sandbox (sandbox/worker.py, docs/sandbox-stdlib.md):
the standard library works as in a plain interpreter, confined; the modules for the network,
other processes and foreign code are refused with a message that says so.

Each check runs inside the real sandbox and compares a value with one written here (or, for
the committed list of importable modules, with what a plain interpreter imports). As root the
candidates run as a uid of their own, which may not read the interpreter's library directory
(a pyenv under /root): this is where a module the worker does not preload would fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from script_module import load_script

from mlx_swe_rl.sandbox import confine
from mlx_swe_rl.sandbox.pool import Limits, Sandbox
from mlx_swe_rl.sandbox.verdict import decode
from mlx_swe_rl.sandbox.worker import REFUSED

LINUX = sys.platform.startswith("linux")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
LIMITS = Limits(timeout=10.0, memory_mb=1024)
probe = load_script("stdlib_probe")


def _mechanisms() -> list[str]:
    """Every confinement this machine has (the namespace jail sees only what is bound into it)."""
    if sys.platform == "darwin":
        return ["seatbelt"]
    if not LINUX:
        return ["none"]
    found = ["landlock"] if confine.landlock_abi() else []
    userns = shutil.which("unshare") and subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "--net", "true"], capture_output=True).returncode == 0
    if IS_ROOT or userns:
        found.append("namespaces")
    return found or ["none"]


MODES = _mechanisms()


@pytest.fixture(scope="module", params=MODES)
def box(request):
    with Sandbox(workers=1, limits=LIMITS, confinement=request.param) as sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def plain_box():
    """Unconfined: the refusal does not depend on the kernel mechanism (scores must not either)."""
    with Sandbox(workers=1, limits=LIMITS, confinement="none") as sandbox:
        yield sandbox


def _values(box: Sandbox, checks: dict[str, tuple[str, str]]) -> dict[str, object]:
    """Run each check (setup statements, probe expression) as one test of one job: {name: value or error}."""
    names = list(checks)
    run = box.run("", [[["exec", checks[n][0]], ["probe", checks[n][1]]] for n in names])
    assert run.load_error is None and run.done, run
    out = {}
    for index, name in enumerate(names):
        test = run.tests[index]
        out[name] = ("error", test["error"]) if "error" in test else decode(test["values"][0])
    return out


# name: (setup, probe, expected value). The expected values were worked out by hand or in a
# plain interpreter; strptime, the cp1252 codec and uuid5's sha1 are lazy imports inside them.
WORKING = {
    "hashlib": ("import hashlib", "(hashlib.md5(b'x').hexdigest(), hashlib.sha256(b'abc').hexdigest()[:16], "
                "hashlib.blake2b(b'x', digest_size=4).hexdigest())",
                ("9dd4e461268c8034f5c8564e155c67a6", "ba7816bf8f01cfea", "b1ba07e5")),
    "datetime": ("import datetime", "((datetime.date(2024, 2, 28) + datetime.timedelta(days=2)).isoformat(), "
                 "datetime.datetime.strptime('2024-03-01 12:30', '%Y-%m-%d %H:%M').isoformat(), "
                 "datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc).timestamp())",
                 ("2024-03-01", "2024-03-01T12:30:00", 1577836800.0)),
    "zlib": ("import zlib", "(zlib.crc32(b'hello'), zlib.decompress(zlib.compress(b'abc' * 100)) == b'abc' * 100)",
             (907060870, True)),
    "struct": ("import struct", "(struct.pack('<iH', 1, 2), struct.unpack('>d', struct.pack('>d', 1.5)))",
               (b"\x01\x00\x00\x00\x02\x00", (1.5,))),
    "base64": ("import base64", "(base64.b64encode(b'hello').decode(), base64.b32decode('NBSWY3DP'))",
               ("aGVsbG8=", b"hello")),
    "unicodedata": ("import unicodedata", "(unicodedata.name('é'), len(unicodedata.normalize('NFD', 'é')))",
                    ("LATIN SMALL LETTER E WITH ACUTE", 2)),
    "pathlib": ("import pathlib\npathlib.Path('notes.txt').write_text('hi')",
                "(str(pathlib.PurePosixPath('/a/b/c.txt').with_suffix('.py')), pathlib.Path('notes.txt').read_text(), "
                "sorted(p.name for p in pathlib.Path('.').iterdir() if p.suffix == '.txt'))",
                ("/a/b/c.py", "hi", ["notes.txt", "output.txt"])),
    "time": ("import time", "(time.strftime('%Y-%m-%d', time.gmtime(86400)), time.monotonic() > 0, "
             "time.gmtime(0).tm_year)", ("1970-01-02", True, 1970)),
    "csv": ("import csv, io\nbuf = io.StringIO()\ncsv.writer(buf).writerow(['x', 'y,z'])",
            "(list(csv.reader(io.StringIO('a,\"b,c\"\\n1,2\\n'))), buf.getvalue())",
            ([["a", "b,c"], ["1", "2"]], 'x,"y,z"\r\n')),
    "difflib": ("import difflib", "(difflib.SequenceMatcher(None, 'abcd', 'abxd').ratio(), "
                "list(difflib.unified_diff(['a\\n'], ['b\\n'], lineterm=''))[2:])",
                (0.75, ["@@ -1 +1 @@", "-a\n", "+b\n"])),
    "urllib.parse": ("import urllib.parse", "(urllib.parse.urlparse('https://x.org/p?q=1').netloc, "
                     "urllib.parse.parse_qs('a=1&a=2'), urllib.parse.quote('a b/é'))",
                     ("x.org", {"a": ["1", "2"]}, "a%20b/%C3%A9")),
    "calendar": ("import calendar", "(calendar.monthrange(2024, 2), calendar.isleap(2000), calendar.day_name[0])",
                 ((3, 29), True, "Monday")),
    "uuid": ("import uuid", "(str(uuid.uuid5(uuid.NAMESPACE_DNS, 'python.org')), uuid.uuid4().version, "
             "str(uuid.UUID(int=1)))",
             ("886313e1-3b8a-5372-9b90-0c9aee199e5d", 4, "00000000-0000-0000-0000-000000000001")),
    "io": ("import io\nb = io.BytesIO(b'abc')", "(b.read(2), io.StringIO('x\\ny').readlines(), '€'.encode('cp1252'))",
           (b"ab", ["x\n", "y"], b"\x80")),
    "xml.etree.ElementTree": ("import xml.etree.ElementTree as ET",
                              "(ET.fromstring(\"<a><b x='1'/></a>\").find('b').get('x'), ET.tostring(ET.Element('c')))",
                              ("1", b"<c />")),
    # modules that import a refused one in passing still work offline
    "email.message": ("from email.message import EmailMessage\nm = EmailMessage()\nm['Subject'] = 'hi'\n"
                      "m.set_content('body')", "(str(m['Subject']), m.get_content().strip())", ("hi", "body")),
    "unittest.mock": ("from unittest import mock\nf = mock.Mock(return_value=3)", "(f(1), f.call_count)", (3, 1)),
    "xml.sax.saxutils": ("from xml.sax.saxutils import escape", "escape('<a & b>')", "&lt;a &amp; b&gt;"),
    "sqlite3": ("import sqlite3\ndb = sqlite3.connect(':memory:')",
                "db.execute('select 1 + 1, sqlite_version() > \"3\"').fetchone()", (2, 1)),
    "lzma, bz2": ("import bz2, lzma", "(lzma.decompress(lzma.compress(b'x' * 50)), bz2.decompress(bz2.compress(b'y')))",
                  (b"x" * 50, b"y")),
    # the usual optional-import idiom sees the refusal as an ImportError
    "optional ssl": ("try:\n    import ssl\nexcept ImportError:\n    ssl = None", "ssl is None", True),
}


def test_modules_import_and_work(box):
    got = _values(box, {name: (setup, expr) for name, (setup, expr, _) in WORKING.items()})
    expected = {name: want for name, (_, _, want) in WORKING.items()}
    assert got == expected


def _refusal(name: str) -> str:
    """The error a candidate sees for importing `name`, a module of REFUSED or below one."""
    entry = name
    while entry and entry not in REFUSED:
        entry = entry.rpartition(".")[0]
    return f"ImportError: sandbox: module {name!r} is refused here ({REFUSED.get(entry, 'not refused')})"


# statement: the module whose refusal it must report
REFUSED_IMPORTS = {
    "import socket": "socket",
    "import _socket": "_socket",
    "import ssl": "ssl",
    "import subprocess": "subprocess",
    "import multiprocessing": "multiprocessing",
    "import ctypes": "ctypes",
    "import asyncio": "asyncio",
    "import http.client": "http.client",
    "import urllib.request": "urllib.request",
    "from urllib import request": "urllib.request",
    "from concurrent.futures import ProcessPoolExecutor": "concurrent.futures.process",
    "import os\nos.popen('true')": "subprocess",  # a lazy import inside an allowed module
}


def _refusals(box: Sandbox) -> dict[str, object]:
    return _values(box, {stmt: (stmt, "True") for stmt in REFUSED_IMPORTS})


EXPECTED_REFUSALS = {stmt: ("error", _refusal(name)) for stmt, name in REFUSED_IMPORTS.items()}


def test_refused_with_a_clear_message(box):
    assert _refusals(box) == EXPECTED_REFUSALS


def test_refused_unconfined_too(plain_box):
    assert _refusals(plain_box) == EXPECTED_REFUSALS


def test_committed_lists_still_hold(box):
    """Every module docs/sandbox-stdlib.json lists as importable for this kind of run still
    imports (where this interpreter has it at all), every refused one is still refused."""
    run = probe.load_record().get("runs", {}).get(probe.run_key())
    if run is None or run["python"].split(".")[:2] != sys.version.split(".")[:2]:
        pytest.skip(f"no record for a {probe.run_key()} run of Python {sys.version.split()[0]}")
    importable = [n for n in run["importable"] if n in sys.stdlib_module_names]
    refused = [n for n in run["refused"] if n in sys.stdlib_module_names]
    failed = probe.probe_together(box, importable + refused)
    available = probe.plain_importable(importable)
    assert {n: failed[n] for n in importable if n in failed and n in available} == {}
    assert {n: failed.get(n) for n in refused if probe.kind_of(failed.get(n)) != "refused"} == {}
    assert len(available) >= 0.9 * len(importable)  # the check did check something
