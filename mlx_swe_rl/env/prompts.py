"""The prompt a model sees for a puzzle, and extraction of code from its answer."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

from ..puzzles.format import Puzzle, defines, parse_python

SYSTEM_PROMPT = "You are an expert Python programmer. You fix bugs in Python code."

# `prompt.system`: the system message's name. "none" sends no system message, so the chat
# template puts in its own default (Qwen's "You are Qwen, created by Alibaba Cloud...").
SYSTEM_MESSAGES: dict[str, str | None] = {"expert": SYSTEM_PROMPT, "none": None}

# `prompt.template`: the user message of the function format, by name. The seed's wording (its
# author's commit) asks for the bare function; the model may still fence it, and both are read.
TEMPLATES: dict[str, str] = {
    "block": """Fix the bug in this Python code.

Task: {description}

```python
{code}
```

Reply with the complete corrected code in a single ```python code block.""",
    "seed": """Fix the buggy Python function below.

PROBLEM: {description}

BUGGY CODE:
```python
{code}
```

Return ONLY the corrected Python function. No explanation, no tests, no markdown — just the function code.""",
    "find": """The Python function below has a bug: it does not do what its description says.

Description: {description}

```python
{code}
```

Find the bug and fix it. Return only the corrected function, in a ```python code block.""",
    # Not a repair question: the capability gate's writing tasks (`puzzles stubs`), whose code is
    # a signature whose body is `...`. Worded as the seed's, so only the task differs.
    "write": """Write the Python function below: replace each `...` with a body that does what the problem says.

PROBLEM: {description}

SIGNATURE:
```python
{code}
```

Return ONLY the complete Python function. No explanation, no tests, no markdown — just the function code.""",
}
USER_TEMPLATE = TEMPLATES["block"]


@dataclass(frozen=True)
class PromptStyle:
    """How a puzzle is put to the model (`prompt.template`, `prompt.system` in a config)."""

    # The default: the seed's wording with the template's own system message. Chosen on the
    # bundled medium/hard training split with both Qwen2.5-Coder models, confirmed on the held-out
    # split (docs/results/prompts.json); SmolLM2 does better with block/expert, which its configs pin.
    template: str = "seed"
    system: str = "none"

    def __post_init__(self) -> None:
        if self.template not in TEMPLATES:
            raise ValueError(f"prompt.template: '{self.template}' is not one of {', '.join(TEMPLATES)}")
        if self.system not in SYSTEM_MESSAGES:
            raise ValueError(f"prompt.system: '{self.system}' is not one of {', '.join(SYSTEM_MESSAGES)}")

    def chat(self, user: str) -> list[dict[str, str]]:
        """The messages for one user turn: this style's system message (if any), then `user`."""
        system = SYSTEM_MESSAGES[self.system]
        head = [{"role": "system", "content": system}] if system is not None else []
        return head + [{"role": "user", "content": user}]


FENCE_LINE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+.-]*)")
PYTHON_TAGS = {"python", "py", "python3", ""}


def build_messages(puzzle: Puzzle, style: PromptStyle = PromptStyle()) -> list[dict[str, str]]:
    """Chat messages asking the model to fix `puzzle` (tests are not shown: they are the verifier)."""
    return style.chat(TEMPLATES[style.template].format(description=puzzle.description, code=puzzle.buggy.rstrip()))


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
    """True once `text` holds a closed python (or untagged) block that defines `entry_point`,
    or, in an answer with no fence at all, bare code that defines it followed by a line of
    prose: the answer of the function format is complete, and nothing after it is read."""
    if any(closed and tag in PYTHON_TAGS and defines(body, entry_point) for tag, body, closed in _blocks(text)):
        return True
    lines = _lines(text)
    if any(FENCE_LINE.match(line) for line in lines):
        return False
    # the last line may still be growing, so only a complete line can end the code; and only a
    # line of prose ends it: code that does not parse yet (`for x in xs:` awaiting its body) is
    # still being written. The prose is looked for first: this runs at every newline the sampler
    # decodes, and cutting the code back to what parses costs a parse per line.
    complete = lines[:-1]
    found = _code_then_prose(complete)
    return found is not None and found[1] < len(complete) and _parsing_end(complete, *found, entry_point) is not None


CODE_START = re.compile(r"^(def |async def |class |import |from |@)")


def _lines(text: str) -> list[str]:
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _prose(line: str) -> bool:
    """A line at column 0 that cannot begin a statement (even one that a following indented
    block would complete): the model has gone back to writing words."""
    if not line.strip() or line[0] in " \t#@":
        return False
    return not _parses(line + "\n    pass") and not _parses(line)


def _code_then_prose(lines: list[str]) -> tuple[int, int] | None:
    """(start, prose) of the unfenced code in `lines`: the first line that starts a definition or
    import, and the first line of prose after it (len(lines): none); None when no line starts code."""
    start = next((i for i, line in enumerate(lines) if CODE_START.match(line)), None)
    if start is None:
        return None
    return start, next((i for i in range(start + 1, len(lines)) if _prose(lines[i])), len(lines))


def _parsing_end(lines: list[str], start: int, end: int, entry_point: str | None) -> int | None:
    """The largest stop <= `end` for which lines[start:stop] parses and defines `entry_point`."""
    for stop in range(end, start, -1):
        code = "\n".join(lines[start:stop])
        if _parses(code) and (entry_point is None or defines(code, entry_point)):
            return stop
    return None


def _bare_span(lines: list[str], entry_point: str | None) -> tuple[int, int] | None:
    """[start, end) of the unfenced code in `lines`: from the first line that starts a
    definition or import, up to the first line of prose after it (or the end), shortened
    until it parses and defines `entry_point`; None when there is no such code."""
    found = _code_then_prose(lines)
    stop = None if found is None else _parsing_end(lines, *found, entry_point)
    return None if stop is None else (found[0], stop)


def bare_code(response: str, entry_point: str | None = None) -> str | None:
    """The code of an answer written without fences: prose before and after it is left out
    ("Here is the fix:", an explanation), and a function cut off by the token limit is cut
    back to what parses. None when no such code defines `entry_point`."""
    lines = _lines(response)
    span = _bare_span(lines, entry_point)
    return "\n".join(lines[span[0]:span[1]]).strip("\n") if span else None


@dataclass(frozen=True)
class AnswerEnd:
    """The sampler's stop rule (`stopping.StopRule`) for the function answer format: a
    completion ends with the fence line that closes its first python block defining
    `entry_point`. An earlier block that does not define it (a quoted fragment, a shell
    command) does not end it. `extract_code` then takes that block: it is the last one."""

    entry_point: str
    # every fence line is made of these; a newline completes the prose line after bare code
    triggers: str = "`~\n"

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
    fences, the bare code in the response (`bare_code`), if it defines `entry_point`."""
    candidates = [body.strip("\n") for body in python_blocks(response)]
    if candidates:
        if entry_point is not None:
            defining = [c for c in candidates if defines(c, entry_point)]
            if defining:
                return defining[-1]
        return candidates[-1]
    if any(FENCE_LINE.match(line) for line in _lines(response)):
        return None
    text = response.strip()
    if text and _parses(text) and (entry_point is None or defines(text, entry_point)):
        return text
    return bare_code(response, entry_point)
