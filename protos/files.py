"""Durable files: every file either side keeps is written whole or not at all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# One mechanism for every durable file, in the lowest layer that writes any (the audit log and
# the CA are in crypto): a temporary sibling, fsync, rename, fsync of the folder.
from trellis.crypto.durable import write_atomic

__all__ = ["write_atomic", "write_json_atomic"]


def write_json_atomic(path: Path, document: Any) -> None:
    """Write JSON via a temporary file, fsync and rename, so a crash never leaves half a file."""
    text = json.dumps(document, indent=2, sort_keys=True, allow_nan=True)
    write_atomic(path, lambda handle: handle.write(text.encode()))
