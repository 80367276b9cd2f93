"""A survivor's share reveal that arrives after unmasking closed is late, not refused.

Unmasking closes once every secret has a threshold of shares, so in a healthy federation the
slowest survivor's request for what to reveal, or its reveal, often comes after the round moved
on. Before, the coordinator refused them as out of phase (refusals_total{reason="out_of_phase"}
about once a round) and the silo logged that the round "went on without" it. Here a real
coordinator serves three real silo agents over mTLS on loopback; one silo is held, without any
timing, until its round is over: in round 1 between asking what to reveal and revealing, in
round 2 before asking.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.support.federation import write_plan
from trellis.coordinator.serving.metrics import CoordinatorMetrics
from trellis.coordinator.serving.service import serve_until_done, start_server
from trellis.coordinator.simulation.sequential import load_simulation_data
from trellis.crypto.pki import load_identity
from trellis.protos.plan import load_plan
from trellis.silo.federation.agent import SiloAgent
from trellis.silo.federation.link import CoordinatorLink
from trellis.silo.federation.session import SiloSession
from trellis.silo.training.trainers import make_silo_trainer

ROUNDS = 2
# Silos train in threads of one process here: one at a time, as in test_one_driver.py.
_TORCH = threading.Lock()


class HeldLink:
    """A silo's link that holds the unmask stage's calls until the coordinator has completed
    the round without them: round 1's reveal, and round 2's request for what to reveal."""

    def __init__(self, link: CoordinatorLink, round_over: Callable[[int], threading.Event]
                 ) -> None:
        self._link = link
        self._round_over = round_over

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._link, name)
        if name not in ("fetch_unmask", "reveal"):
            return method

        def held(*args: Any) -> Any:
            env = getattr(args[0], "envelope", args[0])
            if (name, env.round) in (("reveal", 1), ("fetch_unmask", 2)):
                # A bound for a broken run, not a timing: the others complete the round.
                assert self._round_over(env.round).wait(120), f"round {env.round} never ended"
            return method(*args)

        return held


def _trainer(data: Any, silo: str) -> Callable[[Any], Any]:
    def make(plan: Any) -> Any:
        with _TORCH:
            trainer = make_silo_trainer(data, plan, silo)
        train = trainer.train

        def train_alone() -> Any:
            with _TORCH:
                return train()

        trainer.train = train_alone
        return trainer

    return make


@pytest.fixture(scope="module")
def ws(workspace_factory):
    return workspace_factory("late-reveal", graphs=30)


def test_late_reveals_are_answered_and_recorded_not_refused(ws, tmp_path) -> None:
    plan = load_plan(write_plan(ws, "late-reveal", algorithm="fedavg", rounds=ROUNDS))
    metrics = CoordinatorMetrics()
    torch.set_num_threads(1)
    running = start_server(plan, progress=False, metrics=metrics)
    core = running.core
    over = {r: threading.Event() for r in range(1, ROUNDS + 1)}

    def note_rounds() -> None:          # called under the core's lock on every change
        for record in core.machine.history:
            over[record.round].set()

    core.on_change(note_rounds)
    data = load_simulation_data(plan)
    held = ws.silos[0]
    said: dict[str, list[str]] = {s: [] for s in ws.silos}
    agents = []
    for silo in ws.silos:
        identity = load_identity(ws.identity(silo))
        agent = SiloAgent(f"127.0.0.1:{running.port}", identity,
                          SiloSession(identity, _trainer(data[silo], silo)), tmp_path / silo,
                          log=said[silo].append)
        if silo == held:
            agent.driver.link = HeldLink(agent.link, over.__getitem__)
        agents.append(agent)
    ended: dict[str, BaseException | None] = {}

    def run(agent: SiloAgent) -> None:
        try:
            agent.run()
            ended[agent.identity.name] = None
        except BaseException as exc:    # shown by the assertion below
            ended[agent.identity.name] = exc

    threads = [threading.Thread(target=run, args=(a,), daemon=True) for a in agents]
    for thread in threads:
        thread.start()
    results = serve_until_done(running)
    for thread in threads:
        thread.join(timeout=60)
    assert results["status"] == "completed" and ended == {s: None for s in ws.silos}, said

    # The held silo's input counted in both rounds, and nothing it said sounds like trouble.
    assert [r["participants"] for r in results["rounds"]] == [list(ws.silos)] * ROUNDS
    for line in said[held]:
        assert "went on without" not in line and "closed before" not in line, said[held]
    # Its reveals are in its own audit log and, as late ones, in the coordinator's.
    silo_log = [json.loads(line) for line in (tmp_path / held / "audit.jsonl").open()]
    assert [r["round"] for r in silo_log if r["event"] == "revealed_shares"] == [1, 2]
    audit = plan.server.state_dir / "audit.jsonl"
    records = [json.loads(line) for line in audit.open()]
    late = [(r["silo"], r["round"]) for r in records if r["event"] == "late_reveal"]
    assert late == [(held, 1), (held, 2)]
    assert not [r for r in records if r["event"] == "refused"]
    # Counted as what they are: late messages, and no refusal of any kind.
    sample = metrics.registry.get_sample_value
    assert sample("trellis_coordinator_late_messages_total", {"message": "reveal_shares"}) == 2
    refusals = [s for family in metrics.registry.collect()
                if family.name == "trellis_coordinator_refusals" for s in family.samples
                if s.name.endswith("_total")]
    assert sum(s.value for s in refusals) == 0, refusals
