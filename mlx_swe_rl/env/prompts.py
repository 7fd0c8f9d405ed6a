"""The prompt a model sees for a puzzle, and extraction of code from its answer."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

from ..puzzles.format import Puzzle, defines, parse_python

SYSTEM_PROMPT = "You are an expert Python programmer. You fix bugs in Python code."

USER_TEMPLATE = """Fix the bug in this Python code.

Task: {description}

```python
{code}
```

Reply with the complete corrected code in a single ```python code block."""

FENCE_LINE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+.-]*)")
PYTHON_TAGS = {"python", "py", "python3", ""}


def build_messages(puzzle: Puzzle) -> list[dict[str, str]]:
    """Chat messages asking the model to fix `puzzle` (tests are not shown: they are the verifier)."""
    user = USER_TEMPLATE.format(description=puzzle.description, code=puzzle.buggy.rstrip())
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, dedented body) of each fenced block. Any fence line closes an open
    block (models sometimes close with ```python or a longer fence), and a block cut off
    by the token limit runs to the end of the text, so its code is still found."""
    return [(tag, body) for tag, body, _ in _blocks(text)]


def _blocks(text: str) -> list[tuple[str, str, bool]]:
    """(tag, dedented body, closed) of each fenced block; only the last one can be unclosed."""
    blocks: list[tuple[str, str, bool]] = []
    tag, body = None, []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        fence = FENCE_LINE.match(line)
        if tag is None:
            if fence:
                tag, body = fence.group(2).lower(), []
        elif fence:
            blocks.append((tag, textwrap.dedent("\n".join(body)), True))
            tag = None
        else:
            body.append(line)
    if tag is not None:
        blocks.append((tag, textwrap.dedent("\n".join(body)), False))
    return blocks


def answer_closed(text: str, entry_point: str) -> bool:
    """True once `text` holds a closed python (or untagged) block that defines `entry_point`:
    the answer of the function format is complete, and nothing after it is read."""
    return any(closed and tag in PYTHON_TAGS and defines(body, entry_point) for tag, body, closed in _blocks(text))


@dataclass(frozen=True)
class AnswerEnd:
    """The sampler's stop rule (`stopping.StopRule`) for the function answer format: a
    completion ends with the fence line that closes its first python block defining
    `entry_point`. An earlier block that does not define it (a quoted fragment, a shell
    command) does not end it. `extract_code` then takes that block: it is the last one."""

    entry_point: str
    triggers: str = "`~"  # every fence line is made of these

    def done(self, text: str) -> bool:
        return answer_closed(text, self.entry_point)


def _parses(code: str) -> bool:
    try:
        parse_python(code)
        return True
    except (SyntaxError, ValueError):
        return False


def python_blocks(response: str) -> list[str]:
    """The non-empty fenced blocks tagged python (or untagged) of a response, in order."""
    return [body for tag, body in fenced_blocks(response) if tag in PYTHON_TAGS and body.strip()]


def extract_code(response: str, entry_point: str | None = None) -> str | None:
    """The code in a model response, or None when it holds none (a format failure).

    Rule: among fenced blocks tagged python (or untagged), take the *last* one that defines
    `entry_point`; failing that, the last such block. Models often quote the buggy code
    first and give the fix after it, so the last defining block is the answer. With no
    fences, the whole response counts if it parses as Python and defines `entry_point`."""
    candidates = [body.strip("\n") for body in python_blocks(response)]
    if candidates:
        if entry_point is not None:
            defining = [c for c in candidates if defines(c, entry_point)]
            if defining:
                return defining[-1]
        return candidates[-1]
    text = response.strip()
    if text and "```" not in text and _parses(text) and (entry_point is None or defines(text, entry_point)):
        return text
    return None
