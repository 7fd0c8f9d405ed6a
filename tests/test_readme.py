"""The README and the manual in docs/ are the user's front door: keep them true to the code.

The README is short and points into docs/; the configuration reference lives in
docs/configuration.md, the commands table in the README. Every relative link of both must
resolve, anchors included, so that moving a section cannot silently break the way to it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from mlx_swe_rl.rl.config import describe

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def config_row(key: str, default: str, doc: str) -> str:
    """One row of the configuration table, as describe() gives it."""
    return f"| `{key}` | `{default}` | {doc} |"


def test_configuration_page_lists_every_key_with_its_default_and_meaning():
    page = CONFIGURATION.read_text()
    expected = [config_row(*row) for row in describe()]
    wrong = [row for row in expected if row not in page.splitlines()]
    table = "\n".join(["| key | default | meaning |", "|---|---|---|", *expected])
    assert not wrong, f"docs/configuration.md differs from the code in {len(wrong)} rows; the table is:\n{table}"


def test_config_keys_quoted_in_tables_have_the_code_default():
    """Any table row `| \\`key\\` | \\`default\\` | ...` naming a config key (the README's ten keys)
    states that key's default."""
    defaults = {key: default for key, default, _ in describe()}
    row = re.compile(r"^\| `([a-z_.]+)` \| `([^`]*)` \|")
    wrong = []
    for page in PAGES:
        for line in page.read_text().splitlines():
            match = row.match(line)
            if match and match[1] in defaults and yaml.safe_load(match[2]) != yaml.safe_load(defaults[match[1]]):
                wrong.append(f"{page.name}: {match[1]} = {match[2]} (code: {defaults[match[1]]})")
    assert not wrong, wrong


def test_every_command_is_in_the_readme_table():
    from mlx_swe_rl.cli.app import main

    text = README.read_text()
    missing = [name for name, command in main.commands.items()
               if not command.hidden and f"| `mlx-swe-rl {name}" not in text]
    missing += [f"puzzles {name}" for name in main.commands["puzzles"].commands
                if f"| `mlx-swe-rl puzzles {name}" not in text]
    assert not missing, f"README command table lacks: {missing}"


def test_readme_is_short_and_starts_with_what_a_newcomer_needs():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail to docs/"
    first = "\n".join(lines[:80])
    for needle in ("git clone", "mlx-swe-rl info", "python -m pytest -q", "## Quick start",
                   "## The full run"):
        assert needle in first, f"{needle!r} is not in the README's first 80 lines"


def test_readme_test_command_is_what_ci_runs():
    assert "python -m pytest -q" in README.read_text()
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith("python -m pytest -q")


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page: lower case, punctuation dropped, spaces to -."""
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    text = re.sub(r"`[^`\n]*`", "", text)
    return [a or b for a, b in LINK.findall(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked offline
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no such heading")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_link_check_can_fail(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [gone](missing.md) [no heading](page.md#nothing)\n")
    assert links(page) == ["#title", "missing.md", "page.md#nothing"]
    assert anchors(page) == {"title"}
