"""Multi-turn conversations as exact token ids (token in, token out).

A conversation that goes on after the model's answer (the test feedback of multi-turn repair)
is never decoded and re-encoded: the next turn's prompt is the previous prompt, the sampled
completion's own ids, and a bridge (the end of the assistant turn, the user header, the user
text, the assistant header). The bridge's framing is read once per tokenizer from its chat
template, as the difference between renderings of dummy conversations, and the user text is
tokenized on its own. `rendered_ids` renders a whole conversation with the template, so a test
(or a run) can check that the accumulated ids are exactly what the template gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_SYSTEM, _USER, _ANSWER, _FEEDBACK = "S-7f3a", "U-7f3a", "A-7f3a", "F-7f3a"  # markers no template contains


class ChatTemplateError(ValueError):
    """A chat template whose multi-turn framing cannot be read off (one line for the user)."""


def render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` as the template's rendering would hold them (special tokens parsed,
    no BOS added)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


@dataclass(frozen=True)
class ChatFrame:
    """The template text around a user turn that follows an assistant answer:

        ... answer `end_of_turn` `user_header` feedback `user_footer` (then the next answer)

    `end_of_turn` starts with the EOS text when the model's own end token closes its turn (then
    a completion that stopped on EOS already holds that part)."""

    end_of_turn: str
    user_header: str
    user_footer: str
    eos_text: str

    @classmethod
    def of(cls, tokenizer: Any) -> "ChatFrame":
        """Read the framing off `tokenizer`'s chat template, from dummy conversations."""
        first = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": _USER}]
        asked = render(tokenizer, first, True)
        answered = render(tokenizer, first + [{"role": "assistant", "content": _ANSWER}], False)
        again = render(tokenizer, first + [{"role": "assistant", "content": _ANSWER},
                                           {"role": "user", "content": _FEEDBACK}], True)
        # prompt + answer must be what the template renders, and a new turn must only append
        if not (answered.startswith(asked + _ANSWER) and again.startswith(answered)):
            raise ChatTemplateError("chat template: a conversation does not grow by appending turns (multi-turn "
                                    "needs a template that renders earlier turns unchanged)")
        header, found, footer = again[len(answered):].partition(_FEEDBACK)
        if not found:
            raise ChatTemplateError("chat template: cannot find the user turn after an answer")
        eos = tokenizer.decode(sorted(tokenizer.eos_token_ids)[:1]) if tokenizer.eos_token_ids else ""
        return cls(end_of_turn=answered[len(asked + _ANSWER):], user_header=header, user_footer=footer, eos_text=eos)

    def bridge(self, tokenizer: Any, user_text: str, ended_with_eos: bool) -> list[int]:
        """The ids that follow a completion before the next completion: the rest of the answer's
        turn (all of it when the completion did not end on EOS), the user turn holding
        `user_text`, and the assistant header."""
        end = self.end_of_turn
        if ended_with_eos:
            if not end.startswith(self.eos_text):
                raise ChatTemplateError("chat template: the end of an answer does not start with the EOS token")
            end = end[len(self.eos_text):]
        return (encode_text(tokenizer, end + self.user_header) + encode_text(tokenizer, user_text)
                + encode_text(tokenizer, self.user_footer))


def rendered_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The ids of a conversation rendered by the template and tokenized as a whole, with the
    assistant header after its last (user) message."""
    return encode_text(tokenizer, render(tokenizer, messages, True))
