"""One process plays every party of one secure aggregation, with silos dropping at chosen stages.

For property tests and the benchmark: it calls exactly the client and server objects a real
federation uses, in protocol order, and measures each party's compute time and upload bytes.
A real federation moves the same payloads over gRPC instead (silo/federation/agent.py,
coordinator/).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from trellis.crypto.keyagreement import RoundContext
from trellis.crypto.pki import Identity
from trellis.crypto.secagg import SecAggConfig, TooFewSurvivors
from trellis.crypto.secagg_client import SecAggClient
from trellis.crypto.secagg_server import SecAggServer

# A silo listed under a stage stops right before sending that stage's message.
STAGES = ("advertise", "share", "input", "consistency", "unmask")


@dataclass
class LocalOutcome:
    """Result of one in-process aggregation."""

    total: np.ndarray | None
    survivors: tuple[str, ...]
    aborted: str = ""
    silo_seconds: dict[str, float] = field(default_factory=dict)
    silo_bytes: dict[str, int] = field(default_factory=dict)
    coordinator_seconds: float = 0.0


def run_local_aggregation(encoded: Mapping[str, np.ndarray], identities: Mapping[str, Identity],
                          config: SecAggConfig, context: RoundContext,
                          drop_before: Mapping[str, str] | None = None) -> LocalOutcome:
    """Aggregate encoded vectors of equal length; `drop_before[silo]` names the stage it skips."""
    drops = dict(drop_before or {})
    if set(drops.values()) - set(STAGES):
        raise ValueError(f"drop stages must be among {STAGES}")
    names = sorted(encoded)
    first = encoded[names[0]]
    server = SecAggServer(context, config, names, first.size, first.dtype.type)
    outcome = LocalOutcome(None, (), silo_seconds=dict.fromkeys(names, 0.0),
                           silo_bytes=dict.fromkeys(names, 0))
    clients: dict[str, SecAggClient] = {}

    def silo(name: str, fn, *args):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        result = fn(*args)
        outcome.silo_seconds[name] += time.perf_counter() - started
        return result

    def coordinator(fn, *args):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        result = fn(*args)
        outcome.coordinator_seconds += time.perf_counter() - started
        return result

    def active(stage: str, members: tuple[str, ...]) -> list[str]:
        alive = []
        for name in members:
            if drops.get(name) == stage:
                server.drop(name)
                drops[name] = "gone"
            elif drops.get(name) != "gone":
                alive.append(name)
        return alive

    try:
        for name in active("advertise", tuple(names)):
            identity = identities[name]
            clients[name] = silo(name, SecAggClient, name, context, config, identity.key_pem,
                                 identity.ca_pem)
            advert = silo(name, clients[name].advert)
            outcome.silo_bytes[name] += len(advert.cipher_key) + len(advert.mask_key) + len(
                advert.signature)
            coordinator(server.add_advert, name, advert, identity.cert_pem)
        coordinator(server.close_stage)
        bundle = coordinator(server.relayed_adverts)
        for name in active("share", server.roster):
            sealed = silo(name, clients[name].share_keys, bundle)
            outcome.silo_bytes[name] += sum(len(s.box) + len(s.receiver) for s in sealed)
            coordinator(server.add_shares, name, sealed)
        coordinator(server.close_stage)
        for name in active("input", server.sharers):
            received = coordinator(server.shares_for, name)
            masked = silo(name, clients[name].mask_input, encoded[name], received)
            outcome.silo_bytes[name] += masked.nbytes
            coordinator(server.add_masked_input, name, masked)
        coordinator(server.close_stage)
        for name in active("consistency", server.survivors):
            signature = silo(name, clients[name].sign_survivors, server.survivors)
            outcome.silo_bytes[name] += len(signature)
            coordinator(server.add_signature, name, signature)
        coordinator(server.close_stage)
        for name in active("unmask", server.signers):
            request = coordinator(server.unmask_request, name)
            revealed = silo(name, clients[name].reveal, request)
            outcome.silo_bytes[name] += sum(len(r.share) + len(r.owner) + 1 for r in revealed)
            coordinator(server.add_reveal, name, revealed)
        coordinator(server.close_stage)
        outcome.total = coordinator(server.unmask)
        outcome.survivors = server.survivors
    except TooFewSurvivors as exc:
        outcome.aborted = str(exc)
    return outcome
