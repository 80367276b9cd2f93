"""Reviewer reports as plain data, rendered to Markdown and to self-contained HTML.

Both sides write a report for compliance reviewers (`silo audit report`, `coordinator audit
report`) from the same few blocks: facts, tables, verdicts, paragraphs and verbatim text. The
renderer lives here, in protos, because the silo and the coordinator may not import each other
and protos is the lower layer both already share for non-wire helpers (plan, atomic files,
metrics); it is pure text (standard library only, no ML, no crypto), so the torch-free
coordinator installs it too. crypto/ would also be below both, but it is kept to cryptography.

The HTML is one file a reviewer opens without Trellis: inline CSS, no scripts, no external
resources; every string that came from a log is escaped. A cell wraps only at its spaces, never
inside a number, digest or path, so what a reviewer copies from it is exact. The Markdown
reads as plain text.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Block", "Document", "Facts", "Paragraph", "Section", "Table", "Verbatim",
           "Verdict", "FORMATS", "format_for", "render", "to_html", "to_markdown"]

FORMATS = ("md", "html")
_SUFFIXES = {".md": "md", ".markdown": "md", ".html": "html", ".htm": "html"}


@dataclass(frozen=True)
class Paragraph:
    """A line or two of prose."""

    text: str


@dataclass(frozen=True)
class Facts:
    """Named values, one per line (what, value)."""

    pairs: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Table:
    """Rows of cells under column headings; `empty` is said when there are no rows."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    empty: str = "none"


@dataclass(frozen=True)
class Verdict:
    """A pass/fail outcome a reviewer must not miss, with the reasons under it."""

    ok: bool
    headline: str
    details: tuple[str, ...] = ()


@dataclass(frozen=True)
class Verbatim:
    """Text shown exactly as it is (a plan's JSON, say), in a fixed-width block."""

    text: str


Block = Paragraph | Facts | Table | Verdict | Verbatim


@dataclass(frozen=True)
class Section:
    """A titled part of a report."""

    title: str
    blocks: tuple[Block, ...]


@dataclass(frozen=True)
class Document:
    """A whole report: title, what it is about, its sections and a footer line."""

    title: str
    sections: tuple[Section, ...]
    footer: str = ""
    intro: tuple[Block, ...] = field(default=())


def format_for(out: Path, chosen: str | None) -> str:
    """The format to write: `chosen` (md or html) or else the suffix of `out`."""
    if chosen is not None:
        if chosen not in FORMATS:
            raise ValueError(f"--format {chosen!r}: valid choices: {', '.join(FORMATS)}")
        return chosen
    found = _SUFFIXES.get(out.suffix.lower())
    if found is None:
        raise ValueError(f"--out {out}: cannot tell the format from {out.suffix or 'no suffix'}"
                         "; name the file .md or .html, or pass --format md|html")
    return found


def render(document: Document, fmt: str) -> str:
    """The document as Markdown (`md`) or as one self-contained HTML page (`html`)."""
    if fmt == "md":
        return to_markdown(document)
    if fmt == "html":
        return to_html(document)
    raise ValueError(f"unknown report format {fmt!r}; valid choices: {', '.join(FORMATS)}")


# -- Markdown -------------------------------------------------------------------------------------
def to_markdown(document: Document) -> str:
    """Render as Markdown that reads well as plain text too."""
    lines = [f"# {_md_line(document.title)}", ""]
    for block in document.intro:
        lines += _md_block(block)
    for section in document.sections:
        lines += [f"## {_md_line(section.title)}", ""]
        for block in section.blocks:
            lines += _md_block(block)
    if document.footer:
        lines += ["---", "", _md_line(document.footer), ""]
    return "\n".join(lines)


def _md_block(block: Block) -> list[str]:
    if isinstance(block, Paragraph):
        return [_md_line(block.text), ""]
    if isinstance(block, Facts):
        return [f"- {_md_line(name)}: {_md_line(value)}" for name, value in block.pairs] + [""]
    if isinstance(block, Verdict):
        mark = "OK" if block.ok else "FAILED"
        return ([f"**{mark}: {_md_line(block.headline)}**", ""]
                + [f"- {_md_line(detail)}" for detail in block.details]
                + ([""] if block.details else []))
    if isinstance(block, Verbatim):
        fence = "~~~~" if "```" in block.text else "```"
        return [fence, *block.text.splitlines(), fence, ""]
    if not block.rows:
        return [f"_{_md_line(block.empty)}_", ""]
    out = ["| " + " | ".join(_md_cell(c) for c in block.columns) + " |",
           "|" + "|".join(" --- " for _ in block.columns) + "|"]
    out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows]
    return out + [""]


def _md_line(text: str) -> str:
    # One report line per value: a newline from a log must not start a heading or a list item.
    return " ".join(str(text).split())


def _md_cell(text: str) -> str:
    return _md_line(text).replace("|", "\\|") or " "


# -- HTML -----------------------------------------------------------------------------------------
_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto;
       max-width: 72rem; padding: 0 1rem; color: #1b1f24; line-height: 1.45; }
h1 { font-size: 1.6rem; border-bottom: 2px solid #1b1f24; padding-bottom: .3rem; }
h2 { font-size: 1.2rem; margin-top: 2rem; border-bottom: 1px solid #c8ccd1; }
table { border-collapse: collapse; margin: .5rem 0 1rem; font-size: .85rem; width: 100%; }
th, td { border: 1px solid #c8ccd1; padding: .25rem .45rem; text-align: left;
         vertical-align: top; }
th { background: #eef1f4; }
span.t { white-space: nowrap; }
.scroll { overflow-x: auto; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .15rem 1rem; }
dt { font-weight: 600; } dd { margin: 0; min-width: 0; overflow-x: auto; }
.verdict { border-left: 6px solid; padding: .5rem 1rem; margin: .5rem 0 1rem; }
.verdict.ok { border-color: #1a7f37; background: #e9f6ec; }
.verdict.failed { border-color: #cf222e; background: #fcebec; }
.verdict strong { font-size: 1.05rem; }
pre { background: #f6f8fa; border: 1px solid #c8ccd1; padding: .6rem; overflow-x: auto;
      font-size: .8rem; white-space: pre; }
.empty { color: #57606a; font-style: italic; }
footer { margin-top: 2rem; color: #57606a; font-size: .8rem; }
@media print { body { margin: 0; max-width: none; } }
""".strip()


def to_html(document: Document) -> str:
    """Render as one HTML page: inline CSS, no scripts, nothing fetched; all text escaped."""
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             f"<title>{_e(document.title)}</title>", f"<style>\n{_CSS}\n</style>", "</head>",
             "<body>", f"<h1>{_e(document.title)}</h1>"]
    parts += [_html_block(block) for block in document.intro]
    for section in document.sections:
        parts.append(f"<section>\n<h2>{_e(section.title)}</h2>")
        parts += [_html_block(block) for block in section.blocks]
        parts.append("</section>")
    if document.footer:
        parts.append(f"<footer>{_e(document.footer)}</footer>")
    parts += ["</body>", "</html>", ""]
    return "\n".join(parts)


def _html_block(block: Block) -> str:
    if isinstance(block, Paragraph):
        return f"<p>{_e(block.text)}</p>"
    if isinstance(block, Facts):
        rows = "".join(f"<dt>{_e(name)}</dt><dd>{_cell(value)}</dd>"
                       for name, value in block.pairs)
        return f"<dl>{rows}</dl>"
    if isinstance(block, Verdict):
        kind, mark = ("ok", "OK") if block.ok else ("failed", "FAILED")
        details = "".join(f"<li>{_e(d)}</li>" for d in block.details)
        return (f'<div class="verdict {kind}"><strong>{mark}: {_e(block.headline)}</strong>'
                + (f"<ul>{details}</ul>" if details else "") + "</div>")
    if isinstance(block, Verbatim):
        return f"<pre>{_e(block.text)}</pre>"
    if not block.rows:
        return f'<p class="empty">{_e(block.empty)}</p>'
    head = "".join(f"<th>{_e(c)}</th>" for c in block.columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in row) + "</tr>"
                   for row in block.rows)
    return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>'
            "</table></div>")


def _cell(text: str) -> str:
    # A value is copied from a report (a byte count, a digest, a path): the browser must never
    # break it mid-token, or the copy is wrong. Breaking only at spaces is the rule; a token
    # that holds more than letters (digits, hyphens, slashes: all places a browser may break)
    # is kept whole, and a table too wide for the page scrolls instead.
    return " ".join(_e(word) if word.isalpha() else f'<span class="t">{_e(word)}</span>'
                    for word in str(text).split())


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)
