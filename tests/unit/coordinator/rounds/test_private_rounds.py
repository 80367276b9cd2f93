"""Distributed noise through secure aggregation, on the coordinator's round machine with real
clients: the unmasked sum is exactly the survivors' noisy integer vectors, its noise has the
calibrated variance whoever drops at whichever stage, and the coordinator's step divides only by
public numbers (no weight or count travels)."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from trellis.coordinator.rounds.errors import InvalidPayload
from trellis.coordinator.rounds.machine import RoundMachine
from trellis.coordinator.rounds.strategies import make_strategy
from trellis.crypto.discrete_gaussian import sample_discrete_gaussian
from trellis.crypto.keyagreement import KeyAdvert
from trellis.crypto.pki import Identity, throwaway_identities
from trellis.crypto.randomness import SeededRandomSource
from trellis.crypto.secagg import RelayedAdvert
from trellis.crypto.secagg_client import SecAggClient
from trellis.protos.messages import (
    Envelope,
    KeyAdvertisement,
    Phase,
    SealedShares,
    SignedSurvivors,
)
from trellis.protos.plan import parse_plan

SILOS = ["a", "b", "c", "d", "e"]
LENGTH = 20_000        # coordinates: enough for the noise's sample variance to be tight
STAGES = ["advertise", "share", "input", "consistency", "unmask"]


@pytest.fixture(scope="module")
def ids(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Identity]:
    return throwaway_identities(SILOS, tmp_path_factory.mktemp("private-pki"))


def _plan():
    return parse_plan({
        "federation": {"id": "f", "algorithm": "fedavg", "rounds": 2, "silos": SILOS,
                       "min_silos": 3},
        "timeouts": {"join_s": 10, "round_s": 5, "stage_s": 4, "report_s": 3},
        "privacy": {"mechanism": "ddg", "noise_multiplier": 1.0, "clip": 1.0, "bits": 10,
                    "batch": 4, "design_graphs": 400, "colluders": 1, "server_lr": 0.5},
    }, base_dir=Path("."))


class PrivateDriver:
    """The silos' side with real clients; each uploads signal + its own noise share."""

    def __init__(self, ids: dict[str, Identity]) -> None:
        self.plan = _plan()
        privacy = self.plan.public.privacy
        self.m = RoundMachine(self.plan, make_strategy("fedavg", privacy=privacy), now=0.0)
        threshold = self.plan.public.aggregation.threshold
        sensitivity = privacy.clip * privacy.scale + math.sqrt(LENGTH)
        self.share_sigma2 = Fraction(math.ceil(
            (privacy.noise_multiplier * sensitivity) ** 2 / privacy.honest_shares(threshold)))
        self.ids = ids
        self.clients: dict[str, SecAggClient] = {}
        self.signal = {s: np.full(LENGTH, 7 * (i + 1), np.int64) for i, s in enumerate(SILOS)}
        self.noise = {s: sample_discrete_gaussian(self.share_sigma2, LENGTH,
                                                  SeededRandomSource(s.encode()))
                      for s in SILOS}

    def env(self, phase: Phase) -> Envelope:
        return Envelope("f", self.m.round, self.m.attempt, phase)

    def advertise(self, names: list[str]) -> None:
        for s in names:
            client = SecAggClient(s, self.m.context(), self.m.secagg_config, self.ids[s].key_pem,
                                  self.ids[s].ca_pem)
            self.clients[s] = client
            a = client.advert()
            self.m.advertise(s, KeyAdvertisement(self.env(Phase.ADVERTISE_KEY), a.cipher_key,
                                                 a.mask_key, a.signature, LENGTH), 1.0)

    def share(self, names: list[str]) -> None:
        for s in names:
            bundle = self.m.key_bundle(s, self.env(Phase.KEYS_READY))
            relayed = [RelayedAdvert(KeyAdvert(k.silo, k.cipher_key, k.mask_key, k.signature),
                                     k.certificate_pem) for k in bundle.keys]
            sealed = self.clients[s].share_keys(relayed)
            self.m.upload_shares(s, SealedShares(self.env(Phase.SHARE_KEYS), tuple(sealed)), 1.0)

    def inputs(self, names: list[str]) -> None:
        for s in names:
            received = self.m.shares_for(s, self.env(Phase.SHARES_READY)).shares
            ring = (self.signal[s] + self.noise[s]).view(np.uint64)
            self.m.masked_input(s, self.env(Phase.MASKED_INPUT),
                                self.clients[s].mask_input(ring, received), 2.0)

    def sign(self, names: list[str]) -> None:
        for s in names:
            survivors = self.m.instruction(s).participants
            self.m.sign_survivors(s, SignedSurvivors(
                self.env(Phase.SIGN_SURVIVORS), self.clients[s].sign_survivors(survivors)), 2.0)

    def reveal(self, names: list[str]) -> None:
        for s in names:
            if self.m.round != 1:
                return
            request = self.m.unmask_request(s, self.env(Phase.UNMASK)).request
            self.m.reveal_shares(s, self.env(Phase.REVEAL_SHARES),
                                 tuple(self.clients[s].reveal(request)), 2.0)


@pytest.mark.parametrize("stage", [None, *STAGES])
def test_noise_shares_sum_to_the_calibrated_variance_whoever_drops_at_any_stage(
        ids, stage: str | None) -> None:
    d = PrivateDriver(ids)
    m = d.m
    for s in SILOS:
        m.join(s, d.ids[s].cert_pem, 0.0)
    live = list(SILOS)
    for step in STAGES:
        if step == stage:
            m.leave("e", 1.5)
            live = SILOS[:4]
        expected = m.secagg.expected() if m.secagg else ()
        act = {"advertise": d.advertise, "share": d.share, "input": d.inputs,
               "consistency": d.sign, "unmask": d.reveal}[step]
        act([s for s in live if s in expected])
        if m.round == 2:
            break
    assert m.round == 2
    dropped_early = stage in ("advertise", "share", "input")
    contributors = SILOS[:4] if dropped_early else SILOS
    assert m.history[0].participants == tuple(contributors)
    privacy = d.plan.public.privacy
    # Exactly the survivors' noisy integers, decoded by the public scale, batch and count.
    total = sum(d.signal[s] + d.noise[s] for s in contributors)
    step = -privacy.server_lr * total / privacy.scale / (privacy.batch * len(contributors))
    assert m.global_state is not None
    np.testing.assert_allclose(m.global_state, step.astype(np.float32), rtol=1e-6)
    # The noise in the sum: one share per contributor, never below the floor t - c shares.
    noise = sum(d.noise[s] for s in contributors).astype(np.float64)
    variance = float(noise.var())
    calibrated = len(contributors) * float(d.share_sigma2)
    floor = privacy.honest_shares(d.plan.public.aggregation.threshold) * float(d.share_sigma2)
    # Sample variance of 20,000 values: relative standard error sqrt(2/n) = 1 %; allow 5 %.
    assert abs(variance / calibrated - 1) < 0.05
    assert variance > floor


def test_a_private_input_carries_no_weight_coordinate(ids) -> None:
    d = PrivateDriver(ids)
    for s in SILOS:
        d.m.join(s, d.ids[s].cert_pem, 0.0)
    d.advertise(SILOS)
    d.share(SILOS)
    received = d.m.shares_for("a", d.env(Phase.SHARES_READY)).shares
    with_weight = np.zeros(LENGTH + 1, np.uint64)
    with pytest.raises(InvalidPayload, match="shape"):
        d.m.masked_input("a", d.env(Phase.MASKED_INPUT),
                         d.clients["a"].mask_input(with_weight, received), 2.0)
