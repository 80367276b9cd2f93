"""What runs inside a Ray engine's silo actor, as plain classes
(coordinator/simulation/ray_engine.py makes them actors; nothing here imports Ray).

``SiloHost`` holds one silo: its data (read where the actor runs), its session and its driver,
the classes `silo join` runs, talking to the round machine's actor (machine.MachineHost)
through a ``RemoteLink``. The machine's host never calls a silo, and it answers a silo's call at
once (never waiting for another silo), so a silo blocked on the machine cannot deadlock the run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trellis.coordinator.simulation.machine import Refused
from trellis.coordinator.simulation.silos import SiloData, silo_session, train_silo_alone
from trellis.crypto.pki import Identity
from trellis.protos.messages import (
    Envelope,
    Instruction,
    KeyAdvertisement,
    KeyBundle,
    MetricsReport,
    RevealedShares,
    SealedShares,
    SignedSurvivors,
    UnmaskInstruction,
)
from trellis.protos.plan import PublicPlan
from trellis.silo.data.hetero import HeteroGraph
from trellis.silo.federation.driver import SiloDriver
from trellis.silo.federation.link import RoundMovedOn
from trellis.silo.federation.session import SiloStage
from trellis.silo.training.trainers import load_silo_data


@dataclass(frozen=True)
class DataSummary:
    """What the engine needs to know of a silo's data before its trainer is built."""

    hetero: bool
    relations: tuple[str, ...]


class SiloHost:
    """One simulated silo: its data, session and driver (a Ray engine's silo actor)."""

    def __init__(self, identity: Identity, threads: int, device: str = "cpu") -> None:
        import torch

        # The actor's share of the machine: torch would otherwise start a thread per core, and
        # several silo actors on one machine would fight over them.
        torch.set_num_threads(threads)
        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"silo {identity.name}: its actor has a GPU share but torch "
                               "sees no CUDA device here")
        self.identity = identity
        self.device = device
        self.data: SiloData | None = None
        self.driver: SiloDriver | None = None
        self.said: deque[str] = deque(maxlen=1)    # the last thing the silo would print

    def load(self, data: SiloData | str | Path) -> DataSummary:
        """Take the silo's data: a folder is read here, where the actor runs."""
        self.data = data if isinstance(data, SiloData) else load_silo_data(Path(data))
        if isinstance(self.data, HeteroGraph):
            return DataSummary(True, tuple(self.data.relations))
        return DataSummary(False, ())

    def start(self, public_plan_json: str, relations: Sequence[str] | None,
              call: Callable[..., Any], initial: str | None = None) -> None:
        """Accept the plan (which builds the trainer, from the initial model file at `initial`
        if given) and set up the driver, whose link sends each call through
        ``call(method, *args)`` to the machine."""
        session = silo_session(self.identity, self._data(), relations, self.device,
                               None if initial is None else Path(initial))
        session.accept_plan(public_plan_json)
        self.driver = SiloDriver(session, RemoteLink(call), log=self.said.append)

    def handle(self, instruction: Instruction) -> tuple[bool, str]:
        """The driver acts on one instruction: (whether this silo is finished, its last line)."""
        if self.driver is None:
            raise RuntimeError(f"silo {self.identity.name} was not started")
        self.driver.handle(instruction)
        finished = self.driver.session.stage is SiloStage.FINISHED
        return finished, self.said[-1] if self.said else ""

    def train_alone(self, public: PublicPlan) -> dict[str, Any]:
        """hgn-local / hgn-central: this silo's own model, nothing exchanged."""
        return train_silo_alone(public, self.identity.name, self._data(), self.device)

    def _data(self) -> SiloData:
        if self.data is None:
            raise RuntimeError(f"silo {self.identity.name} has no data loaded")
        return self.data


class RemoteLink:
    """A silo's link to a machine in another process: each call goes as (method, arguments)
    through ``call`` to MachineHost.call, and a Refused answer becomes RoundMovedOn, as the
    in-process link raises it."""

    def __init__(self, call: Callable[..., Any]) -> None:
        self._call = call

    def _ask(self, method: str, *args: Any) -> Any:
        answer = self._call(method, *args)
        if isinstance(answer, Refused):
            raise RoundMovedOn(answer.reason)
        return answer

    def fetch_state(self, env: Envelope) -> np.ndarray | None:
        """CoordinatorLink.fetch_state."""
        return self._ask("fetch_state", env)

    def fetch_pool(self, env: Envelope) -> list[bytes]:
        """CoordinatorLink.fetch_pool."""
        return self._ask("fetch_pool", env)

    def advertise(self, advert: KeyAdvertisement) -> None:
        """CoordinatorLink.advertise."""
        self._ask("advertise", advert)

    def fetch_keys(self, env: Envelope) -> KeyBundle:
        """CoordinatorLink.fetch_keys."""
        return self._ask("fetch_keys", env)

    def upload_shares(self, sealed: SealedShares) -> None:
        """CoordinatorLink.upload_shares."""
        self._ask("upload_shares", sealed)

    def fetch_shares(self, env: Envelope) -> SealedShares:
        """CoordinatorLink.fetch_shares."""
        return self._ask("fetch_shares", env)

    def upload_envelope(self, env: Envelope, envelope: bytes) -> None:
        """CoordinatorLink.upload_envelope."""
        self._ask("upload_envelope", env, envelope)

    def upload_masked(self, env: Envelope, masked: np.ndarray,
                      statistics: Mapping[str, float]) -> None:
        """CoordinatorLink.upload_masked."""
        self._ask("upload_masked", env, masked, dict(statistics))

    def sign_survivors(self, signed: SignedSurvivors) -> None:
        """CoordinatorLink.sign_survivors."""
        self._ask("sign_survivors", signed)

    def fetch_unmask(self, env: Envelope) -> UnmaskInstruction:
        """CoordinatorLink.fetch_unmask."""
        return self._ask("fetch_unmask", env)

    def reveal(self, revealed: RevealedShares) -> None:
        """CoordinatorLink.reveal."""
        self._ask("reveal", revealed)

    def report(self, report: MetricsReport) -> bool:
        """CoordinatorLink.report (the in-process link answers False for a duplicate)."""
        return bool(self._ask("report", report))

    def setup_advert(self, env: Envelope, advert: bytes) -> None:
        """CoordinatorLink.setup_advert."""
        self._ask("setup_advert", env, advert)

    def setup_bundle(self, env: Envelope) -> dict[str, tuple[bytes, bytes]]:
        """CoordinatorLink.setup_bundle."""
        return self._ask("setup_bundle", env)

    def upload_group_seal(self, env: Envelope, boxes: Mapping[str, bytes],
                          public_context: bytes) -> None:
        """CoordinatorLink.upload_group_seal."""
        self._ask("upload_group_seal", env, dict(boxes), public_context)

    def fetch_group_box(self, env: Envelope) -> tuple[bytes, bytes, bytes]:
        """CoordinatorLink.fetch_group_box."""
        return self._ask("fetch_group_box", env)

    def confirm_group_open(self, env: Envelope) -> None:
        """CoordinatorLink.confirm_group_open."""
        self._ask("confirm_group_open", env)

    def upload_encrypted_update(self, env: Envelope, ciphertexts: Sequence[bytes]) -> None:
        """CoordinatorLink.upload_encrypted_update."""
        self._ask("upload_encrypted_update", env, list(ciphertexts))

    def fetch_blinded(self, env: Envelope) -> dict[tuple[str, str], bytes]:
        """CoordinatorLink.fetch_blinded."""
        return self._ask("fetch_blinded", env)

    def upload_similarities(self, env: Envelope,
                            values: Mapping[tuple[str, str], float]) -> None:
        """CoordinatorLink.upload_similarities."""
        self._ask("upload_similarities", env, dict(values))
