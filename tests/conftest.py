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
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.federation import Workspace, free_port, make_workspace
from tests.support.worker_groups import GROUPS_FILE, group_scheduler, worker_groups, write_groups

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


# Where the workers of this pytest-xdist run write their groups (set on the controller).
_GROUPS_PATH = pytest.StashKey[Path]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a pytest-xdist worker, write which tests must share a worker (those that share a
    module-scoped fixture: tests/support/worker_groups.py) where the controller reads them."""
    path = getattr(config, "workerinput", {}).get(GROUPS_FILE)
    if path is not None:
        write_groups(Path(path), worker_groups(items))


def pytest_configure(config: pytest.Config) -> None:
    """On the controller of a pytest-xdist run, name the file the workers write groups to."""
    if not hasattr(config, "workerinput"):
        config.stash[_GROUPS_PATH] = Path(tempfile.gettempdir()) / (
            f"trellis-worker-groups-{os.getpid()}.json")


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the groups file at the end of the run."""
    path = config.stash.get(_GROUPS_PATH, None)
    if path is not None:
        path.unlink(missing_ok=True)


@pytest.hookimpl(optionalhook=True)        # pytest-xdist's hooks: absent without it
def pytest_configure_node(node: Any) -> None:
    """Tell each worker where to write the groups."""
    node.workerinput[GROUPS_FILE] = str(node.config.stash[_GROUPS_PATH])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist loadgroup with the groups the workers wrote (pytest-xdist's own loses them)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return group_scheduler(config, log, config.stash[_GROUPS_PATH])


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
