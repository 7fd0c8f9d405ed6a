"""The prompt a model sees for a puzzle, and extraction of code from its answer."""

from __future__ import annotations

import ast
import re

from .puzzles import Puzzle, defines

SYSTEM_PROMPT = "You are an expert Python programmer. You fix bugs in Python code."

USER_TEMPLATE = """Fix the bug in this Python code.

Task: {description}

```python
{code}
```

Reply with the complete corrected code in a single ```python code block."""

# An opening fence (``` with an optional language tag) up to the closing fence or the end
# of the text, so a completion cut off by the token limit still yields its code.
FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)", re.S | re.M)
PYTHON_TAGS = {"python", "py", "python3", ""}


def build_messages(puzzle: Puzzle) -> list[dict[str, str]]:
    """Chat messages asking the model to fix `puzzle` (tests are not shown: they are the verifier)."""
    user = USER_TEMPLATE.format(description=puzzle.description, code=puzzle.buggy.rstrip())
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
        return True
    except (SyntaxError, ValueError):
        return False


def extract_code(response: str, entry_point: str | None = None) -> str | None:
    """The code in a model response, or None when it holds none (a format failure).

    Rule: among fenced blocks tagged python (or untagged), take the *last* one that defines
    `entry_point`; failing that, the last such block. Models often quote the buggy code
    first and give the fix after it, so the last defining block is the answer. With no
    fences, the whole response counts if it parses as Python and defines `entry_point`."""
    blocks = [(tag.lower(), body) for tag, body in FENCE.findall(response)]
    candidates = [body.strip("\n") for tag, body in blocks if tag in PYTHON_TAGS and body.strip()]
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
