"""Plain-text tables of numbers (gzipped or not, comma- or whitespace-separated), read fast
with numpy and, when a line is bad, named by its 1-based line number."""

from __future__ import annotations

import gzip
import io
import re
import zlib
from pathlib import Path

import numpy as np

from trellis.silo.data.tu import DataFormatError

# A line with nothing but blanks, anywhere but after the last newline.
_BLANK_LINE = re.compile(r"(?:^|\n)[ \t\r]*\n")


def read_text(path: Path) -> str:
    """The whole file as text (gunzipped when its name ends in .gz); one line when unreadable."""
    try:
        data = path.read_bytes()
        if path.name.endswith(".gz"):
            data = gzip.decompress(data)
    except FileNotFoundError:
        raise DataFormatError(f"{path}: no such file") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise DataFormatError(f"{path}: cannot be read: {exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise DataFormatError(f"{path.name}: line {line}: not UTF-8 text") from None


def separator_of(text: str) -> str | None:
    """',' when the first content line has a comma, else None (numpy: any whitespace)."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return "," if "," in stripped else None
    return None


def content_lines(text: str, *, comments: bool) -> list[tuple[int, str]]:
    """(1-based line number, line) of each line neither blank nor (if allowed) a comment."""
    kept = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped and not (comments and stripped.startswith("#")):
            kept.append((number, stripped))
    return kept


def read_number_table(path: Path, dtype: type, *, comments: bool = False,
                      blank_lines: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A [rows, columns] table of ``dtype`` and each row's 1-based line number.

    Without ``comments`` a '#' is an error; without ``blank_lines`` so is an empty line (a file
    whose lines stand for nodes or graphs in order cannot skip one).
    """
    text = read_text(path)
    sep = separator_of(text)
    blank = _BLANK_LINE.search(text.rstrip()) is not None   # trailing blank lines are fine
    if blank and not blank_lines:
        _raise_first_bad_line(path, text, dtype, sep, comments=comments, blank_lines=False)
    irregular = blank or (comments and "#" in text)
    if irregular:
        lines = content_lines(text, comments=comments)
        numbers = np.array([n for n, _ in lines], dtype=np.int64)
        body = "\n".join(line for _, line in lines)
    else:
        body = text
        numbers = np.empty(0, dtype=np.int64)   # filled below: row i is line i + 1
    if not body.strip():
        raise DataFormatError(f"{path.name}: the file is empty")
    try:
        table: np.ndarray = np.loadtxt(io.StringIO(body), dtype=dtype, delimiter=sep,
                                       ndmin=2, comments=None)
    except ValueError:
        _raise_first_bad_line(path, text, dtype, sep, comments=comments, blank_lines=blank_lines)
        raise   # unreachable: the scan above finds the line numpy stopped at
    if not irregular:
        numbers = np.arange(1, len(table) + 1, dtype=np.int64)
    return table, numbers


def _raise_first_bad_line(path: Path, text: str, dtype: type, sep: str | None, *,
                          comments: bool, blank_lines: bool) -> None:
    kind = "integer" if np.issubdtype(dtype, np.integer) else "number"
    width = -1
    for number, line in enumerate(text.rstrip().splitlines(), start=1):
        stripped = line.strip()
        if comments and stripped.startswith("#"):
            continue
        if not stripped:
            if blank_lines:
                continue
            raise DataFormatError(f"{path.name}: line {number}: empty line (every line must "
                                  "hold a value: lines stand for rows in order)")
        fields = [f.strip() for f in stripped.split(sep)]
        if width < 0:
            width = len(fields)
        if len(fields) != width:
            raise DataFormatError(f"{path.name}: line {number}: {_count(len(fields))} where "
                                  f"the first line has {width}: {_shown(stripped)}")
        for value in fields:
            try:
                dtype(value)
            except ValueError:
                article = "an" if kind == "integer" else "a"
                raise DataFormatError(f"{path.name}: line {number}: {value!r} is not "
                                      f"{article} {kind}") from None
    raise DataFormatError(f"{path.name}: not a table of {kind}s")


def _count(values: int) -> str:
    return "1 value" if values == 1 else f"{values} values"


def _shown(line: str) -> str:
    return repr(line if len(line) <= 60 else line[:57] + "...")


def integer_label(text: str) -> int | None:
    """A label written as an integer ('3', '+3', '3.0'), or None when it is not one."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() else None
