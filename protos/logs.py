"""Log lines for operators and log shippers, the same on both sides of a federation.

Every line carries a wall-clock UTC timestamp in ISO 8601, a level and its source (the
coordinator, or the silo's name). ``text`` is for people (one line each); ``json`` is one JSON
object per line for log shippers (Loki, Elasticsearch, CloudWatch), with the structured fields
of the event beside the message. Built on the standard library's ``logging``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

FORMATS = ("text", "json")


def _iso(created: float) -> str:
    moment = datetime.fromtimestamp(created, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _TextFormatter(logging.Formatter):
    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source

    def format(self, record: logging.LogRecord) -> str:
        return (f"{_iso(record.created)} {record.levelname:<7} {self.source}: "
                f"{record.getMessage()}")


class _JsonFormatter(_TextFormatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {"ts": _iso(record.created), "level": record.levelname.lower(),
                               "source": self.source, "message": record.getMessage()}
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            doc.update({k: v for k, v in fields.items() if k not in doc})
        return json.dumps(doc, default=str, sort_keys=False)


def make_logger(source: str, fmt: str = "text", stream: TextIO | None = None) -> logging.Logger:
    """A logger writing one line per event to stream (stderr by default) in fmt."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: expected one of {', '.join(FORMATS)}")
    # One logger per source, reconfigured on each call (tests run several silos in a process).
    logger = logging.getLogger(f"trellis.log.{source}")
    logger.handlers.clear()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_JsonFormatter(source) if fmt == "json" else _TextFormatter(source))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def event(logger: logging.Logger, level: int, message: str, /, **fields: Any) -> None:
    """Log one event: message for people, fields for machines (json format only)."""
    logger.log(level, message, extra={"fields": fields})
