"""A repository's licence, named by the text of its LICENSE (or COPYING) file.

Mined tasks carry their repository's licence in their provenance, because mined code stays
under it: a set mined from someone else's repository may not be shareable."""

from __future__ import annotations

import re

LICENCE_FILE = re.compile(r"^(licen[cs]e|copying|unlicense)(\.(txt|md|rst)|-[a-z0-9.]+)?$", re.IGNORECASE)
HEAD_CHARS = 600  # copyleft licences are named in their title; their bodies mention others

# (identifier, phrases that must all appear), first match wins, checked on the text with its
# whitespace collapsed and lowercased: first on its head, then on the whole text.
HEAD_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("AGPL-3.0", ("gnu affero general public license",)),
    ("LGPL-3.0", ("gnu lesser general public license", "version 3")),
    ("LGPL-2.1", ("gnu lesser general public license",)),
    ("LGPL-2.0", ("gnu library general public license",)),
    ("GPL-3.0", ("gnu general public license", "version 3")),
    ("GPL-2.0", ("gnu general public license", "version 2")),
    ("GPL-1.0", ("gnu general public license", "version 1")),
    ("Apache-2.0", ("apache license", "version 2.0")),
    ("MPL-2.0", ("mozilla public license", "2.0")),
    ("MPL-1.1", ("mozilla public license", "1.1")),
    ("EPL-2.0", ("eclipse public license", "2.0")),
    ("BSL-1.0", ("boost software license",)),
)
BODY_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("PSF-2.0", ("python software foundation license",)),
    ("Unlicense", ("this is free and unencumbered software released into the public domain",)),
    ("CC0-1.0", ("creative commons", "cc0")),
    ("ISC", ("permission to use, copy, modify, and/or distribute this software for any purpose",)),
    ("MIT", ("permission is hereby granted, free of charge",)),
    ("BSD-3-Clause", ("redistribution and use in source and binary forms", "neither the name")),
    ("BSD-3-Clause", ("redistribution and use in source and binary forms", "names of its contributors")),
    ("BSD-2-Clause", ("redistribution and use in source and binary forms",)),
)


def licence_id(text: str) -> str:
    """The SPDX identifier of a licence text, or "unknown"."""
    flat = " ".join(text.lower().split())
    for part, rules in ((flat[:HEAD_CHARS], HEAD_RULES), (flat, BODY_RULES)):
        for identifier, phrases in rules:
            if all(p in part for p in phrases):
                return identifier
    return "unknown"


def is_licence_file(name: str) -> bool:
    """LICENSE, LICENCE, COPYING, UNLICENSE, with .txt/.md/.rst or a -SUFFIX (LICENSE-MIT)."""
    return bool(LICENCE_FILE.match(name))
