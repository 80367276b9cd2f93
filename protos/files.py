"""Durable files: every file either side keeps is written whole or not at all."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def write_json_atomic(path: Path, document: Any) -> None:
    """Write JSON via a temporary file, fsync and rename, so a crash never leaves half a file."""
    text = json.dumps(document, indent=2, sort_keys=True, allow_nan=True)
    write_atomic(path, lambda handle: handle.write(text.encode()))


def write_atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write a file through a temporary sibling (mode 0600), fsync it, then rename it into
    place: a crash leaves the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
