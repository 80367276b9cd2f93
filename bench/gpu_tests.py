"""bench/gpu.py's CUDA tests: pytest on every test that needs a GPU, each one's outcome.

The tests are found by the project's convention (the ``cuda`` mark of tests/support/cuda.py, or
a ``skipif`` on ``torch.cuda.is_available()`` whose reason names CUDA): the test files that
mention CUDA are collected and the plugin bench/cuda_only.py keeps only those tests. Without a
GPU every one of them skips, with its reason; on a GPU they run, four at a time where there are
cores for it.
"""

from __future__ import annotations

import os
import signal
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
        if not case.get("name"):
            continue                 # what pytest adds for an interrupted session
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
    log = work / "pytest.log"
    with open(log, "w") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env=child_env(extra={"PYTHONPATH": paths}))
        code, stopped = _wait_or_interrupt(process, limit)
    output = log.read_text(errors="replace")
    if not junit.is_file():
        raise PartFailed(f"pytest exit {code}{', stopped at the deadline' * stopped}, no "
                         f"report: {tail(output)}")
    result = {"files": [str(f.relative_to(ROOT)) for f in files], "exit_code": code,
              "stopped_at_deadline": stopped, **read_junit(junit)}
    if stopped:
        raise PartFailed(f"pytest stopped at the part's deadline ({limit:.0f} s) after "
                         f"{len(result['tests'])} tests", result)
    if not result["tests"]:
        raise PartFailed("no test is marked cuda or skipped with a reason naming CUDA", result)
    if code != 0 or result["failed"] or result["errors"]:
        raise PartFailed(f"pytest exit {code}: {result['failed']} failed, "
                         f"{result['errors']} errors: {tail(output)}", result)
    return result


def _wait_or_interrupt(process: subprocess.Popen[bytes], limit: float,
                       grace_s: float = 15.0) -> tuple[int, bool]:
    """Its exit code, and whether it had to be stopped: at ``limit`` less the grace it gets
    Ctrl-C (pytest then ends the session and still writes its report), then is killed."""
    try:
        return process.wait(timeout=max(1.0, limit - grace_s)), False
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
    try:
        return process.wait(timeout=grace_s), True
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait(), True
