"""Text from an operator's files (plan, policy): UTF-8, or one line saying where it is not."""

from __future__ import annotations


class NotText(ValueError):
    """A file meant to be text holds bytes that are not UTF-8."""


def decode_user_text(data: bytes) -> str:
    """`data` as UTF-8 text, or NotText naming the first bad byte and its line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotText(where_not_utf8(exc)) from None


def where_not_utf8(exc: UnicodeDecodeError) -> str:
    """One line for a decoding failure: the byte, its line and column (when the bytes are at
    hand), never the text around it."""
    byte = exc.object[exc.start:exc.start + 1]
    before = bytes(exc.object[:exc.start])
    line = before.count(b"\n") + 1
    column = exc.start - (before.rfind(b"\n") + 1) + 1
    return (f"not UTF-8 text: byte 0x{byte.hex()} at line {line}, column {column} (save the "
            "file as UTF-8)")
