"""bench/gpu.py's CUDA tests: pytest on every test that needs a GPU, each one's outcome.

The tests are found by the project's convention (the ``cuda`` mark of tests/support/cuda.py, or
a ``skipif`` on ``torch.cuda.is_available()`` whose reason names CUDA): the test files that
mention CUDA are collected and the plugin bench/cuda_only.py keeps only those tests. Without a
GPU every one of them skips, with its reason; on a GPU they run, four at a time where there are
cores for it.
"""

from __future__ import annotations

import os
import subprocess
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

from gpu_common import BENCH, ROOT, Deadline, PartFailed, child_env, python, tail


def cuda_test_files(tests: Path = ROOT / "tests") -> list[Path]:
    """The test files that mention CUDA (a superset of those with a CUDA test: collecting one
    without costs only its collection)."""
    return sorted(path for path in tests.rglob("test_*.py")
                  if "cuda" in path.read_text(encoding="utf-8", errors="replace"))


def read_junit(path: Path) -> dict[str, Any]:
    """Counts and each test's outcome from pytest's JUnit XML report."""
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error"}.get(child.tag, "skipped")
                messages[name] = (child.get("message") or child.text or "")[:500]
                break
        outcomes[name] = outcome
    counts = {key: sum(1 for o in outcomes.values() if o == outcome)
              for key, outcome in (("passed", "passed"), ("failed", "failed"),
                                   ("errors", "error"), ("skipped", "skipped"))}
    return {**counts, "tests": outcomes,
            "messages": {n: m for n, m in messages.items() if outcomes[n] != "passed"}}


def cuda_tests(device: str, cpus: int, work: Path, deadline: Deadline) -> dict[str, Any]:
    """Run the CUDA tests; their counts and outcomes (PartFailed if any fails)."""
    files = cuda_test_files()
    if not files:
        raise PartFailed("no test file under tests/ mentions cuda")
    work.mkdir(parents=True, exist_ok=True)
    junit = work / "cuda-tests.xml"
    junit.unlink(missing_ok=True)
    args = [python(), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "cuda_only",
            f"--junitxml={junit}", "-rs", *(str(f.relative_to(ROOT)) for f in files)]
    if device == "cuda" and cpus >= 8:
        args += ["-n", "4", "--dist", "loadgroup"]
    paths = os.pathsep.join(p for p in (str(BENCH), os.environ.get("PYTHONPATH", "")) if p)
    limit = deadline.check("the CUDA tests")
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=limit, cwd=ROOT,
                              env=child_env(extra={"PYTHONPATH": paths}))
    except subprocess.TimeoutExpired as exc:
        partial = read_junit(junit) if junit.is_file() else {}
        raise PartFailed(f"pytest timed out after {limit:.0f} s", partial) from exc
    if not junit.is_file():
        raise PartFailed(f"pytest exit {done.returncode}, no report: "
                         f"{tail(done.stdout + done.stderr)}")
    result = {"files": [str(f.relative_to(ROOT)) for f in files], "exit_code": done.returncode,
              **read_junit(junit)}
    if not result["tests"]:
        raise PartFailed("no test is marked cuda or skipped with a reason naming CUDA", result)
    if done.returncode != 0 or result["failed"] or result["errors"]:
        raise PartFailed(f"pytest exit {done.returncode}: {result['failed']} failed, "
                         f"{result['errors']} errors: {tail(done.stdout)}", result)
    return result
