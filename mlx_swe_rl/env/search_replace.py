"""SWE-RL's answer format: think, then edit the shown code with SEARCH/REPLACE blocks.

The model answers `<think>...</think><solution>...</solution>`; the solution holds one or more

    <<<<<<< SEARCH
    lines copied exactly from the code
    =======
    the lines that replace them
    >>>>>>> REPLACE

applied in order to the buggy code. SWE-RL's format rules make an answer a format failure (no
code, reward -1 under `progress` and `similarity`): the solution tags not exactly once, no edit block, a
SEARCH text not found in the code, a SEARCH equal to its REPLACE. The edited code is then
scored like any other candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..puzzles.format import Puzzle
from .prompts import PromptStyle

USER_TEMPLATE = """Fix the bug in this Python code.

Task: {description}

```python
{code}
```

First think about the bug inside <think> and </think>. Then give the fix inside <solution> and
</solution> as one or more edits of the code above, each in this form:

<<<<<<< SEARCH
the lines to change, copied exactly from the code
=======
the lines that replace them
>>>>>>> REPLACE"""

SOLUTION_OPEN, SOLUTION_CLOSE = "<solution>", "</solution>"
SEARCH, DIVIDER, REPLACE = "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"


def build_messages(puzzle: Puzzle, style: PromptStyle = PromptStyle()) -> list[dict[str, str]]:
    """Chat messages asking for SEARCH/REPLACE edits of the buggy code (the format has its own
    wording: of `style`, only the system message applies)."""
    return style.chat(USER_TEMPLATE.format(description=puzzle.description, code=puzzle.buggy.rstrip()))


@dataclass(frozen=True)
class Edit:
    search: str
    replace: str


class FormatError(ValueError):
    """An answer that breaks the format's rules; the message says which rule."""


def solution_text(response: str) -> str:
    """The text between the solution tags, which must each appear exactly once, in order."""
    opens, closes = response.count(SOLUTION_OPEN), response.count(SOLUTION_CLOSE)
    if opens != 1 or closes != 1:
        raise FormatError(f"expected one {SOLUTION_OPEN} and one {SOLUTION_CLOSE}, found {opens} and {closes}")
    start, end = response.index(SOLUTION_OPEN) + len(SOLUTION_OPEN), response.index(SOLUTION_CLOSE)
    if end < start:
        raise FormatError(f"{SOLUTION_CLOSE} comes before {SOLUTION_OPEN}")
    return response[start:end]


def parse_edits(solution: str) -> list[Edit]:
    """The SEARCH/REPLACE blocks of a solution, in order (text between blocks, such as code
    fences around them, is ignored); a block left open is a format error."""
    edits: list[Edit] = []
    part, search, replace = None, [], []
    for line in solution.replace("\r\n", "\n").split("\n"):
        marker = line.strip()
        if part is None:
            if marker == SEARCH:
                part, search, replace = "search", [], []
        elif part == "search" and marker == DIVIDER:
            part = "replace"
        elif part == "replace" and marker == REPLACE:
            edits.append(Edit("\n".join(search), "\n".join(replace)))
            part = None
        elif marker in (SEARCH, DIVIDER, REPLACE):
            raise FormatError(f"'{marker}' out of place in edit block {len(edits) + 1}")
        else:
            (search if part == "search" else replace).append(line)
    if part is not None:
        raise FormatError(f"edit block {len(edits) + 1} is not closed with '{REPLACE}'")
    if not edits:
        raise FormatError("no SEARCH/REPLACE edit block")
    return edits


def apply_edits(code: str, edits: list[Edit]) -> str:
    """`code` with each edit applied in turn to the first occurrence of its SEARCH text."""
    for n, edit in enumerate(edits, 1):
        if not edit.search.strip():
            raise FormatError(f"edit {n}: empty SEARCH text")
        if edit.search == edit.replace:
            raise FormatError(f"edit {n}: SEARCH equals REPLACE")
        if edit.search not in code:
            raise FormatError(f"edit {n}: SEARCH text not found in the code")
        code = code.replace(edit.search, edit.replace, 1)
    return code


def extract_edited_code(response: str, buggy: str) -> tuple[str | None, str | None]:
    """(the buggy code with the answer's edits applied, None), or (None, the broken rule)."""
    try:
        return apply_edits(buggy, parse_edits(solution_text(response))), None
    except FormatError as exc:
        return None, str(exc)
