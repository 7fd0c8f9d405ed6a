"""The contract between the answer formats and the sampler: when a completion is finished.

The formats (`env.formats`) define the rules and the sampler (`models.sampling`) applies them,
so the contract sits below both and each names it without importing the other.
"""

from __future__ import annotations

from typing import Protocol


class StopRule(Protocol):
    """When a completion is finished before EOS, judged on its decoded text.

    `done(text)` is asked only after a token whose own text holds one of the `triggers`
    characters (the token that completes a match always holds the match's last character), so
    the text is decoded a few times per completion, not at every step. The rules themselves
    belong to the answer formats (`env.formats`: the function format's closing fence,
    SWE-RL's `</solution>`, plain stop strings)."""

    triggers: str

    def done(self, text: str) -> bool: ...
