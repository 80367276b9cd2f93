"""The run id over the real service (issue 34, finding 4): kept by a restart, new for a fresh start.

Real coordinators on loopback with real TLS certificates and state folders. A silo signs its key
advert for the run id it was told on joining. A coordinator restarted on the same state folder
resumes the same run, tells the same run id, and the silos' adverts still verify; the same
federation started afresh draws a new run id, and an advert signed in the earlier run is
refused even though federation, round and attempt all match.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest

from tests.support.federation import keep_attending, make_workspace, write_plan
from trellis.coordinator.serving.service import RunningServer, start_server
from trellis.crypto.keyagreement import RoundContext
from trellis.crypto.pki import Identity, load_identity
from trellis.crypto.secagg_client import SecAggClient
from trellis.protos import codec
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos.messages import PROTOCOL_VERSION, Envelope, KeyAdvertisement, Phase
from trellis.protos.plan import Plan, load_plan

SILOS = ("hospital-a", "pharma-b", "social-c")


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory):
    return make_workspace(tmp_path_factory.mktemp("run-binding"), graphs=20)


@contextmanager
def _serving(plan: Plan) -> Iterator[RunningServer]:
    running = start_server(plan, progress=False, listen="127.0.0.1:0")
    try:
        yield running
    finally:
        running.stop(0)


@contextmanager
def _silos(ws, port: int) -> Iterator[tuple[str, dict[str, pb_grpc.FederationStub],
                                            dict[str, Identity]]]:
    """Every silo attending; yields the run id the coordinator told on joining."""
    ids = {s: load_identity(ws.identity(s)) for s in SILOS}
    channels = {s: grpc.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(
        root_certificates=i.ca_pem, private_key=i.key_pem, certificate_chain=i.cert_pem))
        for s, i in ids.items()}
    stubs = {s: pb_grpc.FederationStub(c) for s, c in channels.items()}
    joined = stubs[SILOS[0]].Attend(codec.attend_request(Envelope("", 0, 0, Phase.JOIN),
                                                         PROTOCOL_VERSION), timeout=5)
    run_id = codec.instruction_from_pb(next(joined)).run_id
    joined.cancel()
    streams = [keep_attending(stub) for stub in stubs.values()]
    try:
        yield run_id, stubs, ids
    finally:
        for stream in streams:
            stream.cancel()
        for channel in channels.values():
            channel.close()


def _wait_for_keys(running: RunningServer) -> None:
    machine = running.core.machine
    for _ in range(400):
        if machine.secagg is not None:
            return
        threading.Event().wait(0.05)
    raise AssertionError(f"no round opened: {machine.describe()}")


def _advert(running: RunningServer, ident: Identity, run_id: str) -> KeyAdvertisement:
    """The advert a silo signs for the position it is told and the run id it was told."""
    machine = running.core.machine
    context = RoundContext(machine.plan.federation, machine.round, machine.attempt, run=run_id)
    signed = SecAggClient(ident.name, context, machine.secagg_config, ident.key_pem,
                          ident.ca_pem).advert()
    return KeyAdvertisement(Envelope(context.federation, context.round, context.attempt,
                                     Phase.ADVERTISE_KEY), signed.cipher_key, signed.mask_key,
                            signed.signature, 10)


def test_a_restart_keeps_the_run_and_a_fresh_start_refuses_the_old_runs_adverts(ws) -> None:
    plan = load_plan(write_plan(ws, "rebind", algorithm="fedavg", port=0))
    with _serving(plan) as first, _silos(ws, first.port) as (run_a, stubs, ids):
        assert run_a == first.core.machine.run_id and len(run_a) == 16
        _wait_for_keys(first)
        old = _advert(first, ids["hospital-a"], run_a)
        stubs["hospital-a"].AdvertiseKey(codec.advert_to_pb(old), timeout=5)
        assert (first.core.machine.round, first.core.machine.attempt) == (1, 1)

    # Restarted on the same state folder: the same run, and adverts signed for it verify.
    with _serving(plan) as second, _silos(ws, second.port) as (told, stubs, ids):
        assert told == run_a == second.core.machine.run_id
        _wait_for_keys(second)
        stubs["hospital-a"].AdvertiseKey(
            codec.advert_to_pb(_advert(second, ids["hospital-a"], told)), timeout=5)
        assert "hospital-a" in second.core.machine.secagg.servers[0].adverts

    # Started afresh (the operator moved the state folder away): a new run id, and silo-a's
    # advert of the first run, for the very same federation, round 1 and attempt 1, is refused.
    shutil.move(plan.server.state_dir, plan.server.state_dir.with_name("earlier-run"))
    with _serving(plan) as third, _silos(ws, third.port) as (run_b, stubs, ids):
        assert run_b != run_a
        _wait_for_keys(third)
        assert (third.core.machine.round, third.core.machine.attempt) == (1, 1)
        with pytest.raises(grpc.RpcError) as info:
            stubs["hospital-a"].AdvertiseKey(codec.advert_to_pb(old), timeout=5)
        assert (f"the key advert of hospital-a is not signed by its certificate for federation "
                f"'rebind', run '{run_b}', round 1, attempt 1") in info.value.details()
        assert third.core.machine.secagg.servers[0].adverts == {}
        stubs["hospital-a"].AdvertiseKey(
            codec.advert_to_pb(_advert(third, ids["hospital-a"], run_b)), timeout=5)
