"""The documentation site keeps every page reachable and the README stays a front page.

`make docs` (mkdocs build --strict) catches broken links and references; these checks catch what
a build alone would let through: a page nobody can navigate to, a sub-package without an API
reference page, a README that grows back into the manual.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import yaml

from tests.paths import ROOT

DOCS = ROOT / "docs"
README_MAX_LINES = 220


def _nav_pages(entry: Any) -> Iterator[str]:
    """Every page path in a piece of mkdocs.yml's `nav`, however deeply nested."""
    if isinstance(entry, str):
        yield entry
    elif isinstance(entry, list):
        for item in entry:
            yield from _nav_pages(item)
    elif isinstance(entry, dict):
        for value in entry.values():
            yield from _nav_pages(value)


def _nav() -> set[str]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    return set(_nav_pages(config["nav"]))


def test_every_docs_page_is_in_the_navigation() -> None:
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    missing = sorted(pages - _nav())
    assert not missing, f"docs pages in no navigation entry of mkdocs.yml: {missing}"


def test_the_navigation_names_only_existing_pages() -> None:
    absent = sorted(page for page in _nav() if not (DOCS / page).is_file())
    assert not absent, f"mkdocs.yml's nav names pages that do not exist: {absent}"


def test_the_readme_stays_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move the detail into "
        "a page of docs/")


def test_the_readme_links_to_files_that_exist() -> None:
    # The README is read on GitHub and PyPI, outside the site's strict build.
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    local = [t for t in targets if "://" not in t]
    assert local, "the README should link into docs/"
    missing = sorted(t for t in local if not (ROOT / t).exists())
    assert not missing, f"README.md links to missing files: {missing}"


def test_every_sub_package_has_an_api_reference_page() -> None:
    documented = set()
    for page in (DOCS / "reference").glob("*.md"):
        documented |= set(re.findall(r"^::: (\S+)$", page.read_text(), flags=re.MULTILINE))
    # The command lines are documented by their --help, not as an API.
    expected = {f"trellis.{side}.{folder.name}"
                for side in ("silo", "coordinator")
                for folder in (ROOT / side).iterdir()
                if (folder / "__init__.py").is_file() and folder.name != "cli"}
    expected |= {"trellis.crypto", "trellis.protos"}
    assert documented == expected
    reference_pages = {f"reference/{p.name}" for p in (DOCS / "reference").glob("*.md")}
    assert reference_pages <= _nav()
