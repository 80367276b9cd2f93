"""bench/secagg_scale.py's wait for its silo processes: the first failure ends the run at once.

Before, the harness waited for each silo process in turn; a silo that failed left the others
(and the coordinator) waiting out the plan's timeouts, up to an hour. The processes here are real
ones that stand in for the silo processes and the coordinator: they print what a
protocol_silos.py process prints, exit as told, or keep running as a peer still waiting would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.paths import ROOT

sys.path.insert(0, str(ROOT))

from bench.secagg_scale import silo_outcomes, watch_silos  # noqa: E402  (after the path)

WAITING = "import time; time.sleep(120)"       # a peer or a coordinator still waiting


@pytest.fixture()
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; none outlives it."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        process.kill()
        process.wait()


def _process(started: list[subprocess.Popen[str]], code: str, out: Path | None = None,
             err: Path | None = None) -> subprocess.Popen[str]:
    with open(out or Path("/dev/null"), "w") as stdout, open(err or Path("/dev/null"),
                                                              "w") as stderr:
        process = subprocess.Popen([sys.executable, "-c", code], stdout=stdout, stderr=stderr,
                                   text=True)
    started.append(process)
    return process


def _prints(outcome: dict[str, str], then: str = "") -> str:
    return f"print({json.dumps(json.dumps(outcome))}, flush=True)\n{then}"


def _outputs(tmp_path: Path, n: int) -> list[tuple[Path, Path]]:
    return [(tmp_path / f"silos-{i}.out", tmp_path / f"silos-{i}.err") for i in range(n)]


def test_a_failed_silo_ends_the_wait_while_its_peers_still_wait(tmp_path, started) -> None:
    outputs = _outputs(tmp_path, 2)
    failing = _process(started, _prints({"silo-1": "failed: ConnectionError: refused"},
                                        then=WAITING), *outputs[0])
    peer = _process(started, WAITING, *outputs[1])
    coordinator = _process(started, WAITING)
    with pytest.raises(RuntimeError, match=r"1 silos failed, the first: \{'silo-1': "
                                           r"'failed: ConnectionError: refused'\}"):
        watch_silos([failing, peer], outputs, coordinator, timeout_s=60)
    assert peer.poll() is None and coordinator.poll() is None    # ended by the caller


def test_a_silo_process_that_crashes_is_reported_with_its_stderr(tmp_path, started) -> None:
    outputs = _outputs(tmp_path, 2)
    crashed = _process(started, "import sys; sys.exit('no identity folder for silo-3')",
                       *outputs[0])
    peer = _process(started, WAITING, *outputs[1])
    with pytest.raises(RuntimeError, match="a silo process exited with 1: "
                                           "no identity folder for silo-3"):
        watch_silos([crashed, peer], outputs, _process(started, WAITING), timeout_s=60)


def test_a_coordinator_that_fails_ends_the_wait(tmp_path, started) -> None:
    outputs = _outputs(tmp_path, 1)
    silos = _process(started, WAITING, *outputs[0])
    coordinator = _process(started, "import sys; sys.exit(2)")
    with pytest.raises(RuntimeError, match="the coordinator exited with 2 while silos ran"):
        watch_silos([silos], outputs, coordinator, timeout_s=60)


def test_every_outcome_is_collected_when_all_end_well(tmp_path, started) -> None:
    outputs = _outputs(tmp_path, 2)
    first = _process(started, _prints({"silo-1": "finished"}) + _prints({"silo-2": "dropped"}),
                     *outputs[0])
    second = _process(started, _prints({"silo-3": "finished"}), *outputs[1])
    coordinator = _process(started, "pass")
    assert watch_silos([first, second], outputs, coordinator, timeout_s=60) == {
        "silo-1": "finished", "silo-2": "dropped", "silo-3": "finished"}


def test_a_line_still_being_written_is_not_read(tmp_path) -> None:
    out = tmp_path / "silos-0.out"
    out.write_text('{"silo-1": "finished"}\n{"silo-2": "fail')
    assert silo_outcomes(out) == {"silo-1": "finished"}
