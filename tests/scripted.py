"""A model that writes scripted tokens: tests know exactly what each completion holds."""

from __future__ import annotations

import mlx.core as mx


class Scripted:
    """The tiny model forced to write scripted tokens: the token at absolute position i of a
    sequence is `table[i]` (EOS where the table has none). Prompts of different lengths own
    disjoint position ranges, so one table scripts several prompts. Wraps, never mutates."""

    def __init__(self, model, table: dict[int, int], eos: int):
        self._model, self._table, self._eos = model, table, eos

    def __call__(self, inputs, cache=None, **kwargs):
        logits = self._model(inputs, cache=cache, **kwargs)
        offset = cache[0].offset if cache is not None else None
        if not isinstance(offset, mx.array):  # a prompt prefill: its logits are never read
            return logits
        # After the call a row's offset counts its tokens, i.e. the position being predicted.
        targets = mx.array([self._table.get(p, self._eos) for p in offset.tolist()])
        hot = mx.arange(logits.shape[-1])[None, None, :] == targets[:, None, None]
        return mx.where(hot, 30.0, -30.0).astype(logits.dtype)

    def __getattr__(self, name):
        return getattr(self._model, name)


def script_table(tokenizer, prompts: list[list[int]], texts: list[str]) -> dict[int, int]:
    table = {}
    for prompt, text in zip(prompts, texts):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text  # byte-level BPE: the script decodes back exactly
        for j, token in enumerate(ids):
            assert len(prompt) + j not in table, "prompt position ranges overlap"
            table[len(prompt) + j] = token
    return table
