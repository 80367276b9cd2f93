"""Graph labels as a site writes them in a table cell: an integer, or true/false for a binary
column; anything else is that row's refusal."""

from __future__ import annotations

_BOOLEANS = {"true": 1, "false": 0}


def parse_label(text: str) -> int | None:
    """The label in `text` ("3", "-1", "0", "true", "False"), or None if it is none of those."""
    text = text.strip()
    if text.lower() in _BOOLEANS:
        return _BOOLEANS[text.lower()]
    digits = text[1:] if text[:1] in "+-" else text
    if not digits.isascii() or not digits.isdigit():
        return None
    return int(text)
