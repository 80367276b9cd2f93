"""End to end: a plan that starts from a public initial model ([model] init_sha256), with real
processes over loopback mTLS.

A plan naming a hash other than the silos' file is refused by every silo before anything is
sent: each names both hashes (or says it was given no file), records the refusal in its audit
log and exits 2. A plan naming the file's hash, with the embedding frozen, runs: every silo
starts from the file, and after the federation the frozen group still holds the file's values
bit for bit while the shared group that trains agrees across silos.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from tests.support.federation import (
    Workspace,
    port_of,
    start_coordinator,
    start_silo,
    wait_all,
    write_plan,
)
from trellis.crypto.audit import verify_audit_log
from trellis.protos.plan import ModelConfig
from trellis.silo.models.graph_classifiers import graph_model
from trellis.silo.training.initial_model import write_initial_model

pytestmark = pytest.mark.slow


def _initial_model(path: Path) -> tuple[str, dict[str, torch.Tensor]]:
    """A FedStar structure encoder of the default [model] settings, from a seed of its own."""
    torch.manual_seed(2024)
    model = graph_model("dual_channel_gin").build(3, 2, ModelConfig())
    shared = {n: p.detach().clone() for n, p in model.named_parameters()
              if n.split(".")[0] in ("embedding_s", "graph_convs_s_gcn")}
    return write_initial_model(path, shared, {"algorithm": "fedstar",
                                              "pretrained_on": ["test"]}), shared


def _events(path: Path) -> list[str]:
    return [json.loads(line)["event"] for line in path.read_text().splitlines()]


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def ws(workspace_factory) -> Workspace:
    return workspace_factory("initial-model", graphs=40)


def test_every_silo_refuses_a_plan_whose_init_hash_differs(ws: Workspace) -> None:
    folder = ws.root / "refused"
    folder.mkdir()
    have, _ = _initial_model(folder / "init.pt")
    other = "0123456789abcdef" * 4
    plan = write_plan(ws, "refused", rounds=1, extra=f'[model]\ninit_sha256 = "{other}"\n')
    coordinator = start_coordinator(plan, folder / "coordinator.log")
    given = ws.silos[:2]          # the third silo is given no file at all
    silos = [start_silo(ws, s, port_of(plan), folder / s, folder / f"{s}.log",
                        extra=["--init-model", str(folder / "init.pt")] if s in given else [])
             for s in ws.silos]
    try:
        codes = wait_all(silos, timeout=240)
    finally:
        _stop(coordinator)
    logs = {s: (folder / f"{s}.log").read_text() for s in ws.silos}
    assert codes == [2, 2, 2], logs
    for silo in ws.silos:
        last = logs[silo].strip().splitlines()[-1]
        assert last.startswith("error: the plan of federation refused "), logs[silo]
        assert other in last and last.endswith("nothing was sent"), last
        if silo in given:
            assert f"this silo's file has {have}" in last
        else:
            assert "this silo was given none: pass the file with --init-model" in last
        assert "Traceback" not in logs[silo]
        audit = folder / silo / "audit.jsonl"
        assert verify_audit_log(audit).ok
        events = _events(audit)
        assert "refused_to_continue" in events and "joined" not in events
        assert not [e for e in events if e.startswith("sent_")], events


def test_silos_start_from_the_file_and_the_frozen_group_keeps_its_values(ws: Workspace) -> None:
    folder = ws.root / "started"
    folder.mkdir()
    have, shared = _initial_model(folder / "init.pt")
    plan = write_plan(ws, "started", rounds=2, extra=f'[model]\ninit_sha256 = "{have}"\n'
                                                     'frozen = ["embedding_s"]\n')
    coordinator = start_coordinator(plan, folder / "coordinator.log")
    silos = [start_silo(ws, s, port_of(plan), folder / s, folder / f"{s}.log",
                        extra=["--init-model", str(folder / "init.pt")]) for s in ws.silos]
    codes = wait_all([*silos, coordinator], timeout=300)
    logs = {p.name: p.read_text() for p in folder.glob("*.log")}
    assert codes == [0, 0, 0, 0], logs
    finals = {}
    for silo in ws.silos:
        assert f"started from the initial model {have}" in logs[f"{silo}.log"]
        saved = torch.load(folder / silo / "final_model.pt", weights_only=True)
        finals[silo] = saved["model"]
        for name, value in shared.items():
            if name.startswith("embedding_s."):
                assert torch.equal(finals[silo][name], value), (silo, name)
    first, *others = ws.silos
    for name, value in shared.items():
        if name.startswith("graph_convs_s_gcn."):
            assert not torch.equal(finals[first][name], value)        # it trained ...
            assert all(torch.allclose(finals[first][name], finals[s][name], atol=1e-6)
                       for s in others)                               # ... and was aggregated
