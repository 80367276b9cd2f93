"""Fixtures shared by the unit, integration and end-to-end tests.

The layers: ``unit/`` tests one module with tiny hand-made inputs (by layer: crypto, protos,
coordinator, silo); ``integration/`` runs several parts together in one process or against a
real gRPC server; ``e2e/`` starts real coordinator and silo processes over mTLS. The tests under
``*/crypto``, ``*/protos`` and ``*/coordinator`` are the coordinator's slice: they run in an
environment without torch (``make test-coordinator``), and ``make test`` does not run them again
in the full one. So none of them may skip in the slice: a test that needs torch or the silo lives
outside those folders (the slice's run fails on a skip, naming the test).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.federation import Workspace, free_port, make_workspace
from tests.support.worker_groups import worker_groups

# A suite started in the background by a shell without job control (`make test &`, nohup)
# inherits SIGINT ignored, and so would every coordinator and silo it starts: Python then
# installs no Ctrl-C handler, and the tests that press Ctrl-C wait in vain. Handled here, the
# signal is back to its default in the processes the tests start.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def workspace_factory(tmp_path_factory: pytest.TempPathFactory
                      ) -> Callable[..., Workspace]:
    """Make a federation workspace (synthetic data, a real CA, signed silo identities)."""

    def make(name: str, graphs: int = 120, extra: int = 0) -> Workspace:
        return make_workspace(tmp_path_factory.mktemp(name), graphs=graphs, extra=extra)

    return make


@pytest.fixture()
def port() -> int:
    """A loopback port booked for this test (tests/support/federation.free_port)."""
    return free_port()


@pytest.hookimpl(tryfirst=True)     # before pytest-xdist reads the groups off the tests
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Keep the tests that share a module-scoped fixture on one pytest-xdist worker
    (tests/support/worker_groups.py): the fixture is then made once, not once per worker."""
    groups = worker_groups(items)
    for item in items:
        if item.nodeid in groups:
            item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))


# Whether this run is the coordinator's torch-free slice (make test-coordinator).
_COORDINATOR_ONLY = os.environ.get("TRELLIS_COORDINATOR_ONLY") == "1"


@pytest.fixture(scope="session")
def coordinator_only() -> bool:
    """Whether this run is the coordinator's torch-free slice (make test-coordinator)."""
    return _COORDINATOR_ONLY


_SLICE_SKIPS: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Note a test that skips in the coordinator's slice (an expected failure is no skip)."""
    _note_slice_skip(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """Note a module that skips as a whole in the coordinator's slice (``importorskip``)."""
    _note_slice_skip(report)


def _note_slice_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    if _COORDINATOR_ONLY and report.skipped and not hasattr(report, "wasxfail"):
        _SLICE_SKIPS.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the slice's run on a skip: `make test` runs the slice's tests only there."""
    if not _SLICE_SKIPS:
        return
    print("\nskipped in the coordinator's slice, so run nowhere by `make test` (move them "
          "out of the slice's folders):\n  " + "\n  ".join(_SLICE_SKIPS))
    if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_report_header() -> str:
    """Say which environment ran the suite."""
    slice_ = "coordinator slice, no torch" if _COORDINATOR_ONLY else "full suite"
    return f"trellis: {slice_}; shared data {'found' if _shared().exists() else 'absent'}"


def _shared() -> Path:
    from tests.paths import SHARED_DATA

    return SHARED_DATA
