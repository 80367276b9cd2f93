"""No product module over 600 lines, and none over 400 without a reason in its docstring.

A module grows one reasonable addition at a time; this test makes the growth a decision. Over
400 lines, the module's docstring must say why it belongs together, in a sentence starting
"Over 400 lines because"; over 600 lines, it must be split. Generated code is not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import ROOT

PRODUCT_FOLDERS = ("silo", "coordinator", "crypto", "protos")
# Written by protos/generate.py, not by hand (a check fails when they are stale).
GENERATED = ("federation_pb2.py", "federation_pb2_grpc.py", "federation_pb2.pyi")
SPLIT_ABOVE = 600
EXPLAIN_ABOVE = 400
REASON = "Over 400 lines because"


def product_modules() -> list[Path]:
    """Every hand-written Python module of the four product folders."""
    return sorted(path for folder in PRODUCT_FOLDERS for path in (ROOT / folder).rglob("*.py")
                  if path.name not in GENERATED)


def size_problems(path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with one module's size: too long to keep, or long without its reason."""
    text = path.read_text(encoding="utf-8")
    lines = len(text.splitlines())
    name = path.relative_to(root).as_posix()
    if lines > SPLIT_ABOVE:
        return [f"{name}: {lines} lines, over {SPLIT_ABOVE}: split it along a natural seam"]
    docstring = ast.get_docstring(ast.parse(text, filename=name)) or ""
    if lines > EXPLAIN_ABOVE and REASON not in " ".join(docstring.split()):
        return [f"{name}: {lines} lines, over {EXPLAIN_ABOVE}, and its docstring has no "
                f"sentence starting {REASON!r}: split it, or say why it belongs together"]
    return []


def test_the_walk_finds_the_product_modules_and_skips_generated_code() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in product_modules()}
    assert {"crypto/pki.py", "protos/codec.py", "silo/federation/session.py",
            "coordinator/serving/service.py"} <= names
    assert not any(name.endswith(GENERATED) for name in names)


def test_size_problems_names_a_long_module_without_its_reason(tmp_path: Path) -> None:
    folder = tmp_path / "pkg"
    folder.mkdir()
    body = "x = 1\n" * EXPLAIN_ABOVE
    silent = folder / "silent.py"
    silent.write_text('"""A module."""\n' + body)
    explained = folder / "explained.py"
    explained.write_text('"""A module.\n\nOver 400 lines\nbecause it must be."""\n' + body)
    huge = folder / "huge.py"
    huge.write_text('"""Over 400 lines because it must be."""\n' + "x = 1\n" * SPLIT_ABOVE)
    assert size_problems(silent, tmp_path) == [
        f"pkg/silent.py: {EXPLAIN_ABOVE + 1} lines, over {EXPLAIN_ABOVE}, and its "
        f"docstring has no sentence starting {REASON!r}: split it, or say why it belongs together"]
    assert size_problems(explained, tmp_path) == []
    assert size_problems(huge, tmp_path) == [
        f"pkg/huge.py: {SPLIT_ABOVE + 1} lines, over {SPLIT_ABOVE}: split it "
        "along a natural seam"]


def test_no_product_module_is_over_600_lines_or_over_400_without_a_reason() -> None:
    problems = [problem for path in product_modules() for problem in size_problems(path)]
    assert not problems, "\n".join(problems)
