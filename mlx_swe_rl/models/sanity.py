"""The sanity gate of an imported or converted model: its per-token loss on code the project owns.

A decoder that gets a weight format wrong does not crash: the model loads, runs and writes word
salad (MLX 0.32's GGUF reader did exactly that for Q4_K). Every model the cache imports or
converts is scored once on a fixed text, the oracles of some bundled puzzles, as the mean
negative log-likelihood of each token given the ones before it (nats per token). Real models of
any size here give 0.3-1.5 on it; a uniform guess over a 49k-152k vocabulary gives 10.8-11.9, and
a broken import lands near or above that. `GARBAGE_LOSS` sits far from both.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

SANITY_FILE = "sanity.json"
GARBAGE_LOSS = 5.0  # nats per token: no working model of any size here comes near it

# The oracles of the bundled medium puzzles, in id order, up to `has_balanced_parens`: fixed, so a
# figure measured today means the same tomorrow (the puzzles themselves may change).
TEXT = """\
from itertools import zip_longest

def combine_daily_totals(store_a, store_b):
    combined = []
    for a, b in zip_longest(store_a, store_b, fillvalue=0):
        combined.append(a + b)
    return combined

def dedupe_tags_ignoring_case(tags):
    seen = set()
    result = []
    for tag in tags:
        key = tag.strip().lower()
        if key not in seen:
            seen.add(key)
            result.append(tag.strip())
    return result

def drop_blank_fields(record):
    for key in list(record):
        if record[key] is None or record[key] == "":
            del record[key]
    return record

def format_name_initials(full_name):
    parts = full_name.split()
    return "".join(part[0].upper() + "." for part in parts)

def has_balanced_parens(text):
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth > 0:
                depth -= 1
            else:
                return False
    return depth == 0
"""


def sanity_loss(model: Any, tokenizer: Any, text: str = TEXT) -> float:
    """Mean next-token negative log-likelihood of `text` under `model`, in nats per token."""
    import mlx.core as mx
    import mlx.nn as nn

    ids = tokenizer.encode(text)
    tokens = mx.array([ids])
    logits = model(tokens[:, :-1]).astype(mx.float32)
    loss = nn.losses.cross_entropy(logits, tokens[:, 1:], reduction="mean")
    return float(loss.item())


class SanityError(ValueError):
    """A model whose loss on the sanity text means its weights are garbage."""


def check_model_dir(path: Path) -> dict[str, Any]:
    """Score the model in `path` on the sanity text, record the figure in its `sanity.json`,
    and return the record; raise SanityError (one line naming the figure) when it is garbage."""
    from mlx_lm import load

    model, tokenizer = load(str(path))
    loss = sanity_loss(model, tokenizer)
    record = {"loss_nats_per_token": round(loss, 4), "tokens": len(tokenizer.encode(TEXT)), "limit": GARBAGE_LOSS}
    if not math.isfinite(loss) or loss > GARBAGE_LOSS:
        raise SanityError(
            f"{path}: per-token loss {loss:.2f} nats on the sanity text (working models give 0.3-1.5, a "
            f"uniform guess {math.log(max(len(tokenizer.vocab), 2)):.1f}; the limit is {GARBAGE_LOSS}): "
            "its weights were decoded or converted wrongly")
    (Path(path) / SANITY_FILE).write_text(json.dumps(record) + "\n")
    return record


def recorded(path: Path) -> dict[str, Any] | None:
    """The sanity record of a model directory, if it was gated."""
    try:
        return json.loads((Path(path) / SANITY_FILE).read_text())
    except (OSError, ValueError):
        return None
