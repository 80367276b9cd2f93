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


def test_its_commented_sections_are_valid_when_uncommented(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    for algorithm, section in (("gcfl", "[clustering]"), ("fedhgn", "[fedhgn]"),
                               ("fedstar", "[privacy]")):
        lines = text.splitlines()
        start = lines.index(f"# {section}")
        block = []
        for line in lines[start:]:
            if not line.startswith("# ") or (block and line.startswith("# [")):
                break
            block.append(line[2:].split("#")[0].rstrip() if not line.startswith("#  ") else "")
        plan = tmp_path / f"{algorithm}.toml"
        plan.write_text(text.replace('algorithm = "fedstar"', f'algorithm = "{algorithm}"', 1)
                        + "\n" + "\n".join(block) + "\n")
        assert load_plan(plan).public.algorithm == algorithm
