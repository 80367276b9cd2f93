"""The report renderer: Markdown that stays one line per value, HTML that escapes everything."""

from __future__ import annotations

from pathlib import Path

import pytest

from trellis.protos.document import (
    Document,
    Facts,
    Paragraph,
    Section,
    Table,
    Verbatim,
    Verdict,
    format_for,
    render,
    to_html,
    to_markdown,
)

HOSTILE = '<script>alert("x")</script> & <img src="https://evil.example/x.png">'


def document(text: str) -> Document:
    return Document(f"Report {text}", (Section(f"Part {text}", (
        Paragraph(text), Facts((("name", text),)), Verdict(False, text, (text,)),
        Table(("column", "other"), ((text, "a|b\nc"),)), Verbatim(text),
        Table(("empty",), (), empty=f"nothing {text}"))),), footer=text,
        intro=(Paragraph(text),))


def test_html_escapes_every_string_from_a_log() -> None:
    page = to_html(document(HOSTILE))
    assert "<script" not in page and "<img" not in page
    # Title (twice), intro, heading, paragraph, fact, verdict and its reason, cell, verbatim,
    # empty table, footer; in the fact and the cell each token is escaped on its own.
    assert page.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;") == 12
    assert page.count('<span class="t">&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;</span>'
                      ) == 2
    assert "<style>" in page and 'class="verdict failed"' in page


def test_markdown_keeps_one_line_per_value_and_escapes_table_pipes() -> None:
    text = to_markdown(document("line one\n## not a heading"))
    assert text.count("\n## not a heading") == 1          # only inside the verbatim block
    assert "| line one ## not a heading | a\\|b c |" in text
    assert "**FAILED: line one ## not a heading**" in text
    assert "_nothing line one ## not a heading_" in text
    # Verbatim text is kept as it is, inside a fence.
    assert "```\nline one\n## not a heading\n```" in text


def test_verdicts_say_ok_or_failed_in_words() -> None:
    ok = Document("t", (Section("s", (Verdict(True, "fine"),)),))
    assert "**OK: fine**" in to_markdown(ok)
    assert '<div class="verdict ok"><strong>OK: fine</strong></div>' in to_html(ok)


def test_the_format_comes_from_the_option_or_else_the_suffix() -> None:
    assert format_for(Path("r.HTML"), None) == "html"
    assert format_for(Path("r.md"), None) == "md"
    assert format_for(Path("r.txt"), "md") == "md"
    assert render(Document("t", ()), "md").startswith("# t")
    with pytest.raises(ValueError, match=r"--out r\.txt: cannot tell the format from \.txt; "
                                         r"name the file \.md or \.html, or pass --format"):
        format_for(Path("r.txt"), None)
    with pytest.raises(ValueError, match=r"--format 'pdf': valid choices: md, html"):
        format_for(Path("r.md"), "pdf")


def test_html_cells_wrap_only_at_spaces_and_never_split_a_token() -> None:
    digest = "0f" * 32
    page = to_html(Document("t", (Section("s", (
        Facts((("sha256", digest),)),
        Table(("what", "bytes"), ((f"masked input sha256 {digest}", "1,048,576"),
                                  ("hospital-a/round-2", "12 345"))),
        Verbatim(f'{{"sha256": "{digest}"}}'))),)))
    style = page[page.index("<style>"):page.index("</style>")]
    # No rule lets the browser break inside a word: a copied count or digest stays whole.
    assert "anywhere" not in style and "break-all" not in style
    # Every token that holds more than letters is kept on one line; plain words and the
    # spaces between tokens are where a cell may wrap.
    assert "span.t { white-space: nowrap; }" in style
    assert (f'<td>masked input <span class="t">sha256</span> <span class="t">{digest}</span></td>'
            '<td><span class="t">1,048,576</span></td>') in page
    assert ('<td><span class="t">hospital-a/round-2</span></td>'
            '<td><span class="t">12</span> <span class="t">345</span></td>') in page
    assert f'<dd><span class="t">{digest}</span></dd>' in page
    # A table wider than the page scrolls rather than squeezing its cells; verbatim text
    # keeps its lines and scrolls too.
    assert '<div class="scroll"><table>' in page and ".scroll { overflow-x: auto; }" in style
    assert "white-space: pre;" in style and "pre-wrap" not in style
