"""deploy/plan.example.toml is what operators copy: it must load, name every algorithm, and its
commented sections must be valid when uncommented."""

from __future__ import annotations

import re
from pathlib import Path

from trellis.protos.algorithms import ALGORITHMS, GCFL_PRESETS, MIN_SPLIT_ROUND, MIN_SPLIT_SIZE
from trellis.protos.plan import load_plan

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "plan.example.toml"


def test_the_example_plan_loads() -> None:
    assert load_plan(EXAMPLE).public.algorithm == "fedstar"


def test_the_example_plan_names_every_algorithm_and_preset() -> None:
    text = EXAMPLE.read_text()
    named = set(re.findall(r"#\s+([a-z+-]+)\s{2,}", text)) | set(
        re.findall(r"(hgn-[a-z]+)", text))
    assert set(ALGORITHMS) <= named, set(ALGORITHMS) - named
    assert all(preset in text for preset in GCFL_PRESETS)
    assert f"first split in round {MIN_SPLIT_ROUND}" in text
    assert f"at least {MIN_SPLIT_SIZE} silos" in text


SECTIONS = (("gcfl", "[clustering]"), ("fedhgn", "[fedhgn]"), ("fedstar", "[privacy]"))


def _section(text: str, section: str) -> list[tuple[str, str]]:
    """The commented section's lines, uncommented, each with its comment."""
    lines = text.splitlines()
    start = lines.index(f"# {section}")
    block: list[tuple[str, str]] = []
    for line in lines[start:]:
        if not line.startswith("# ") or (block and line.startswith("# [")):
            break
        if line.startswith("#  "):
            block.append(("", line))
        else:
            setting, _, comment = line[2:].partition("#")
            block.append((setting.rstrip(), comment))
    return block


def _with(text: str, algorithm: str, settings: list[str], path: Path) -> Path:
    path.write_text(text.replace('algorithm = "fedstar"', f'algorithm = "{algorithm}"', 1)
                    + "\n" + "\n".join(settings) + "\n")
    return path


def test_its_commented_sections_are_valid_when_uncommented(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    for algorithm, section in SECTIONS:
        block = [setting for setting, _ in _section(text, section)]
        plan = _with(text, algorithm, block, tmp_path / f"{algorithm}.toml")
        assert load_plan(plan).public.algorithm == algorithm


def test_every_field_it_does_not_mark_required_may_be_left_out(tmp_path: Path) -> None:
    """The example says omitted fields take the defaults shown: so each one not marked
    "required" (with its comment's continuation lines) can go, and the plan still loads."""
    text = EXAMPLE.read_text()
    for algorithm, section in SECTIONS:
        block = _section(text, section)
        for i, (setting, comment) in enumerate(block):
            if "=" not in setting or "required" in comment:
                continue
            rest = [s for j, (s, _) in enumerate(block) if j != i]
            plan = _with(text, algorithm, rest, tmp_path / "plan.toml")
            assert load_plan(plan).public.algorithm == algorithm, setting
