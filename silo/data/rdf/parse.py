"""Read one RDF file with rdflib, turning every way it can fail into one `DataFormatError` line.

The syntax comes from the extension (``.nt``, ``.ttl``, ``.n3``, each optionally ``.gz``);
rdflib is imported here, lazily, so a silo without the ``data`` extra can still import Trellis.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trellis.silo.data.tu import DataFormatError

if TYPE_CHECKING:
    import rdflib

INSTALL_HINT = "pip install 'trellis-fgl[data]'"
SYNTAXES = {".nt": "nt", ".ntriples": "nt", ".ttl": "turtle", ".turtle": "turtle", ".n3": "n3"}
SYNTAX_NAMES = {"nt": "N-Triples", "turtle": "Turtle", "n3": "N3"}


def syntax_of(source: Path) -> str:
    """rdflib's format name for a file, from its extension (``.gz`` looked through)."""
    suffixes = [s.lower() for s in source.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    if suffixes and suffixes[-1] in SYNTAXES:
        return SYNTAXES[suffixes[-1]]
    raise DataFormatError(f"{source.name}: not an RDF file name: expected .nt, .ttl or .n3 "
                          "(optionally .gz)")


def load_triples(source: Path) -> rdflib.Graph:
    """Parse `source` into an rdflib graph, or raise one line naming the file and line."""
    try:
        import rdflib
    except ImportError:
        raise DataFormatError(f"{source.name}: reading RDF needs rdflib: {INSTALL_HINT}"
                              ) from None
    from rdflib.exceptions import ParserError
    from rdflib.plugins.parsers.notation3 import BadSyntax

    syntax = syntax_of(source)
    if not source.is_file():
        raise DataFormatError(f"{source}: no such file")
    graph = rdflib.Graph()
    try:
        with _open(source) as stream:
            graph.parse(file=stream, format=syntax)
    except BadSyntax as exc:
        raise DataFormatError(f"{source.name}: line {exc.lines + 1}: not valid "
                              f"{SYNTAX_NAMES[syntax]}: {exc._why}") from None
    except ParserError as exc:
        raise DataFormatError(_ntriples_error(source, exc)) from None
    except (OSError, EOFError, UnicodeDecodeError, ValueError) as exc:
        raise DataFormatError(f"{source.name}: not a readable {SYNTAX_NAMES[syntax]} file "
                              f"({_one_line(exc)})") from None
    return graph


def _open(source: Path) -> Any:
    return gzip.open(source, "rb") if source.suffix.lower() == ".gz" else source.open("rb")


def _ntriples_error(source: Path, exc: Exception) -> str:
    """rdflib's N-Triples parser does not say which line failed: parse line by line to find it
    (only after a failure, so a good file is read once)."""
    from rdflib import Graph
    from rdflib.exceptions import ParserError
    from rdflib.plugins.parsers.ntriples import NTGraphSink, W3CNTriplesParser

    try:
        with _open(source) as stream:
            for number, raw in enumerate(stream, start=1):
                parser = W3CNTriplesParser(NTGraphSink(Graph()))
                try:
                    parser.parsestring(raw.decode("utf-8", "replace"))
                except ParserError as line_exc:
                    return (f"{source.name}: line {number}: not valid N-Triples: "
                            f"{_ntriples_reason(line_exc, parser.line or '')}")
    except (OSError, EOFError):
        pass
    return f"{source.name}: not valid N-Triples: {_one_line(exc)}"


def _ntriples_reason(exc: Exception, rest: str) -> str:
    """The parser's reason, with its regular expressions replaced by where it stopped."""
    cause = _one_line(exc.__context__) if exc.__context__ is not None else _one_line(exc)
    if not cause.startswith("Failed to eat"):
        return cause
    rest = rest.strip()
    return f"unexpected text at {rest[:60]!r}" if rest else "the line does not end with ' .'"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:200] if text else type(exc).__name__
