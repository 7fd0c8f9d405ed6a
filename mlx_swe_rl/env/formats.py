"""Answer formats: how the model is asked for a fix, how the fixed code is read from its answer,
and where the sampler may end the answer (`prompt.format` in a config).

- `function`: the complete corrected function in a python code block (the seed's format).
- `search_replace`: SWE-RL's format, think then SEARCH/REPLACE edits (env/search_replace.py).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable

from ..puzzles.format import Puzzle
from ..stopping import StopRule
from . import prompts, search_replace


@dataclass(frozen=True)
class StopStrings:
    """A stop rule (`stopping.StopRule`): the answer ends once its text contains one of
    `strings` (kept in the completion)."""

    strings: tuple[str, ...]

    @property
    def triggers(self) -> str:
        # the token that completes a match holds its last character
        return "".join(sorted({s[-1] for s in self.strings if s}))

    def done(self, text: str) -> bool:
        return any(s and s in text for s in self.strings)


@dataclass(frozen=True)
class AnswerFormat:
    """One answer format: `messages(puzzle, style)` is the chat prompt, `extract(response, puzzle)` the
    candidate code or None with the reason (a format failure), `stop_rule(puzzle)` where an
    answer is complete."""

    name: str
    messages: Callable[[Puzzle, prompts.PromptStyle], list[dict[str, str]]]
    extract: Callable[[str, Puzzle], tuple[str | None, str | None]]
    stop_rule: Callable[[Puzzle], StopRule | None]


def _bound_at_top(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
        else:
            names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    return names


def with_context(code: str, puzzle: Puzzle) -> str:
    """The answer with its module's context put back: a harvested puzzle whose code carries
    helpers of its module (`source.helpers`: never where the bug is) may be answered with the
    function alone, as the `seed` template asks. The imports and helpers of the buggy code
    that the answer does not define itself go before it, as they stand in the buggy code."""
    if not (puzzle.source or {}).get("helpers"):
        return code
    try:
        answer, buggy = ast.parse(code), ast.parse(puzzle.buggy)
    except (SyntaxError, ValueError):
        return code
    helpers = {name.strip() for name in str(puzzle.source["helpers"]).split(",")}
    own = _bound_at_top(answer)
    missing = []
    for node in buggy.body:
        names = _bound_at_top(ast.Module([node], []))
        context = isinstance(node, (ast.Import, ast.ImportFrom)) or names <= helpers
        if context and names and not names & own:
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            missing.append("\n".join(puzzle.buggy.splitlines()[start - 1:node.end_lineno]))
    return "\n\n\n".join(missing + [code]) if missing else code


def _function_code(response: str, puzzle: Puzzle) -> tuple[str | None, str | None]:
    code = prompts.extract_code(response, puzzle.entry_point)
    return (with_context(code, puzzle), None) if code is not None else (None, "no code block")


FORMATS: dict[str, AnswerFormat] = {
    "function": AnswerFormat("function", prompts.build_messages, _function_code,
                             lambda puzzle: prompts.AnswerEnd(puzzle.entry_point)),
    "search_replace": AnswerFormat("search_replace", search_replace.build_messages,
                                   lambda response, puzzle: search_replace.extract_edited_code(response, puzzle.buggy),
                                   lambda puzzle: StopStrings((search_replace.SOLUTION_CLOSE,))),
}


def answer_format(name: str) -> AnswerFormat:
    """The format called `name`, or ValueError listing the valid ones."""
    if name not in FORMATS:
        raise ValueError(f"prompt.format: '{name}' is not one of {', '.join(FORMATS)}")
    return FORMATS[name]
