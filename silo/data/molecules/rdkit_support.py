"""RDKit as an optional extra: import it with a one-line error when it is missing, and capture
its log so that its complaints become refusal reasons instead of lines on stderr."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from trellis.silo.data.tu import DataFormatError

INSTALL_HINT = "pip install 'trellis-fgl[data]'"
_TIMESTAMP = re.compile(r"^\[\d\d:\d\d:\d\d\]\s*")
_FOR_INPUT = re.compile(r"\s+for input: '.*'$")
_MAX_REASON = 200


class NeedsRDKit(DataFormatError):
    """Reading molecules needs RDKit, and this Python environment does not have it."""


def rdkit_chem(what: str) -> ModuleType:
    """``rdkit.Chem``, or NeedsRDKit naming `what` needed it and how to install it."""
    try:
        from rdkit import Chem
    except ImportError:
        raise NeedsRDKit(f"{what}: reading molecules needs RDKit, which is not installed "
                         f"here: {INSTALL_HINT}") from None
    return Chem


class _Collect(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def rdkit_messages() -> Iterator[list[str]]:
    """Collect what RDKit logs inside the block (nothing reaches stderr); the list is cleared
    by the caller between molecules."""
    from rdkit import rdBase

    lines: list[str] = []
    logger = logging.getLogger("rdkit")
    handlers, level, propagate = logger.handlers[:], logger.level, logger.propagate
    logger.handlers = [_Collect(lines)]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    rdBase.LogToPythonLogger()
    try:
        yield lines
    finally:
        rdBase.LogToCppStreams()
        logger.handlers, logger.propagate = handlers, propagate
        logger.setLevel(level)


def rdkit_reason(lines: list[str], fallback: str) -> str:
    """RDKit's complaint as one short line: its messages without timestamps, echoes of the input
    or caret lines ("unclosed ring", "Explicit valence for atom # 0 C, 5, is greater than
    permitted"), or `fallback` when it said nothing."""
    kept: list[str] = []
    skip = 0
    for raw in lines:
        for line in raw.splitlines():
            text = _TIMESTAMP.sub("", line).strip()
            if skip:
                skip -= 1          # the input echoed and the caret under it
                continue
            text = text.removeprefix("SMILES Parse Error:").removeprefix("ERROR:").strip()
            if text.startswith("check for mistakes around position"):
                kept.append(text.rstrip(":"))
                skip = 2
                continue
            if not text or text.startswith("moving to the beginning of the next molecule"):
                continue
            if text.startswith("Failed parsing SMILES") and kept:
                continue
            kept.append(" ".join(_FOR_INPUT.sub("", text).split()))
    reason = "; ".join(dict.fromkeys(kept)) or fallback
    return reason if len(reason) <= _MAX_REASON else reason[:_MAX_REASON - 1] + "…"
