"""The gRPC edge with real TLS: who is refused, misplaced messages, large tensors streaming."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest

from tests.support.federation import assert_refused, keep_attending, make_workspace, write_plan
from trellis.coordinator.rounds.machine import GroupSetup, RoundMachine, RoundRecord
from trellis.coordinator.rounds.strategies import ClusteredStrategy, make_strategy
from trellis.coordinator.serving.capture import read_capture
from trellis.coordinator.serving.federation_servicer import REPLY_CHUNK_BYTES
from trellis.coordinator.serving.service import RunningServer, serve_until_done, start_server
from trellis.coordinator.state.checkpoint import load_checkpoint, save_checkpoint
from trellis.crypto.pki import Identity, init_ca, load_identity, request_identity, sign_request
from trellis.crypto.secagg_client import SecAggClient
from trellis.protos import codec
from trellis.protos import federation_pb2 as pb
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos.messages import PROTOCOL_VERSION, Envelope, KeyAdvertisement, Phase
from trellis.protos.plan import Plan, load_plan


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("service")
    ws = make_workspace(root, graphs=20)
    init_ca(root / "other-ca", ["localhost"])
    sign_request(request_identity("hospital-a", root / "foreign"), root / "other-ca")
    return ws


def _plan(ws, name: str, **kwargs) -> Plan:
    return load_plan(write_plan(ws, name, port=0, **kwargs))


@pytest.fixture
def server(ws) -> Iterator[RunningServer]:
    running = start_server(_plan(ws, "svc", algorithm="fedavg", min_silos=2), progress=False,
                           listen="127.0.0.1:0")
    yield running
    running.stop(0)


def _stub(port: int, ident: Identity | None, ca_pem: bytes) -> tuple[grpc.Channel,
                                                                     pb_grpc.FederationStub]:
    if ident is None:
        creds = grpc.ssl_channel_credentials(root_certificates=ca_pem)
    else:
        creds = grpc.ssl_channel_credentials(root_certificates=ca_pem,
                                             private_key=ident.key_pem,
                                             certificate_chain=ident.cert_pem)
    channel = grpc.secure_channel(f"127.0.0.1:{port}", creds)
    return channel, pb_grpc.FederationStub(channel)


def _attend(stub: pb_grpc.FederationStub, federation: str = "",
            version: str = PROTOCOL_VERSION) -> grpc.RpcError | list:
    stream = stub.Attend(codec.attend_request(Envelope(federation, 0, 0, Phase.JOIN), version),
                         timeout=5)
    try:
        return [codec.instruction_from_pb(next(stream))]
    except grpc.RpcError as exc:
        return exc


@pytest.mark.parametrize("client", ["no certificate", "certificate from another CA"])
def test_tls_handshake_refuses_unknown_clients(ws, server: RunningServer, client: str) -> None:
    # The foreign identity even carries the name of an admitted silo.
    ident = None if client == "no certificate" else load_identity(ws.root / "foreign")
    channel, stub = _stub(server.port, ident, (ws.ca / "ca.crt").read_bytes())
    with channel:
        result = _attend(stub)
    assert isinstance(result, grpc.RpcError)
    assert result.code() is grpc.StatusCode.UNAVAILABLE
    assert server.core.machine.present == {}


def test_valid_certificate_not_in_the_plan_is_refused(ws, server: RunningServer) -> None:
    intruder = load_identity(ws.identity("intruder"))
    channel, stub = _stub(server.port, intruder, intruder.ca_pem)
    with channel:
        result = _attend(stub)
        assert isinstance(result, grpc.RpcError)
        assert result.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "'intruder' is not admitted" in result.details()
        with pytest.raises(grpc.RpcError) as info:
            stub.FetchKeys(codec.stage_request(Envelope("svc", 1, 1, Phase.KEYS_READY)),
                           timeout=5)
        assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert server.core.machine.present == {}


def test_admitted_silo_gets_the_plan_on_joining(ws, server: RunningServer) -> None:
    ident = load_identity(ws.identity("hospital-a"))
    channel, stub = _stub(server.port, ident, ident.ca_pem)
    with channel:
        result = _attend(stub)
    assert not isinstance(result, grpc.RpcError)
    assert result[0].envelope.phase is Phase.JOIN and '"algorithm": "fedavg"' in \
        result[0].public_plan_json
    wrong = _stub(server.port, ident, ident.ca_pem)
    with wrong[0]:
        refused = _attend(wrong[1], federation="another-federation")
    assert isinstance(refused, grpc.RpcError)
    assert refused.code() is grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize(("version", "said"), [
    ("", "sent no version"),
    ("trellis/0.1", "speaks trellis/0.1"),
    ("trellis/0", "malformed version 'trellis/0'"),
    ("0.2", "malformed version '0.2'"),
    ("trellis/0.2-beta", "malformed version 'trellis/0.2-beta'"),
])
def test_an_agent_older_than_the_protocol_is_refused_with_both_versions(
        ws, server: RunningServer, version: str, said: str) -> None:
    ident = load_identity(ws.identity("hospital-a"))
    channel, stub = _stub(server.port, ident, ident.ca_pem)
    with channel:
        refused = _attend(stub, version=version)
        assert isinstance(refused, grpc.RpcError)
        assert refused.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert f"this coordinator speaks protocol {PROTOCOL_VERSION}" in refused.details()
        assert said in refused.details() and "upgrade Trellis on the silo" in refused.details()
        assert server.core.machine.present == {}          # refused before it joined
        for current in (PROTOCOL_VERSION, "trellis/0.10"):  # this version, or a newer one
            joined = _attend(stub, version=current)
            assert not isinstance(joined, grpc.RpcError), joined.details()
            assert joined[0].envelope.phase is Phase.JOIN


def test_out_of_phase_replayed_and_malformed_messages_are_refused(ws, server: RunningServer
                                                                  ) -> None:
    ids = {s: load_identity(ws.identity(s)) for s in ("hospital-a", "pharma-b", "social-c")}
    channels = {s: _stub(server.port, i, i.ca_pem) for s, i in ids.items()}
    streams = [keep_attending(stub) for _, stub in channels.values()]
    machine = server.core.machine
    for _ in range(100):
        if machine.attempt == 1:
            break
        threading.Event().wait(0.05)
    assert machine.round == 1 and machine.attempt == 1
    stub = channels["hospital-a"][1]
    signed = SecAggClient("hospital-a", machine.context(), machine.secagg_config,
                          ids["hospital-a"].key_pem, ids["hospital-a"].ca_pem).advert()
    keys = (signed.cipher_key, signed.mask_key)
    advert = KeyAdvertisement(Envelope("svc", 1, 1, Phase.ADVERTISE_KEY), *keys,
                              signed.signature, 10)
    stub.AdvertiseKey(codec.advert_to_pb(advert), timeout=5)
    cases = [
        (advert, grpc.StatusCode.ALREADY_EXISTS, "already answered"),
        (KeyAdvertisement(Envelope("svc", 2, 1, Phase.ADVERTISE_KEY), *keys, b"s", 10),
         grpc.StatusCode.FAILED_PRECONDITION, "round 2"),
        (KeyAdvertisement(Envelope("svc", 1, 1, Phase.MASKED_INPUT), *keys, b"s", 10),
         grpc.StatusCode.FAILED_PRECONDITION, "expected phase ADVERTISE_KEY"),
    ]
    for message, code, text in cases:
        with pytest.raises(grpc.RpcError) as info:
            stub.AdvertiseKey(codec.advert_to_pb(message), timeout=5)
        assert info.value.code() is code and text in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        channels["pharma-b"][1].AdvertiseKey(codec.advert_to_pb(KeyAdvertisement(
            Envelope("svc", 1, 1, Phase.ADVERTISE_KEY), b"short", bytes(32), b"s", 10)), timeout=5)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    chunks = list(codec.tensor_to_chunks("masked_input", np.zeros(11, np.uint64),
                                         Envelope("svc", 1, 1, Phase.MASKED_INPUT)))
    chunks[-1].data = b"\x01" + chunks[-1].data[1:]
    with pytest.raises(grpc.RpcError) as info:
        stub.UploadMasked(iter(chunks), timeout=5)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "digest" in info.value.details()
    assert set(machine.secagg.servers[0].adverts) == {"hospital-a"}  # nothing else taken in
    for stream in streams:
        stream.cancel()
    for channel, _ in channels.values():
        channel.close()


def test_fifty_million_float32_values_stream_through_grpc(ws, tmp_path: Path) -> None:
    plan = _plan(ws, "big", algorithm="fedavg", rounds=1)
    big = np.random.default_rng(0).standard_normal(50_000_000, dtype=np.float32)
    # A coordinator resumed after its last round serves the final state to its silos.
    done = [RoundRecord(1, 1, plan.silos, 300, 0.0, 1.0)]
    save_checkpoint(plan.server.state_dir, RoundMachine(plan, make_strategy("fedavg"), 0.0,
                                                        start_round=2, global_state=big,
                                                        history=done))
    running = start_server(plan, progress=False, listen="127.0.0.1:0")
    try:
        ident = load_identity(ws.identity("hospital-a"))
        channel, stub = _stub(running.port, ident, ident.ca_pem)
        with channel:
            stream = keep_attending(stub)
            for _ in range(100):
                if "hospital-a" in running.core.machine.present:
                    break
                threading.Event().wait(0.05)
            chunks = stub.FetchState(codec.stage_request(Envelope("big", 1, 0,
                                                                  Phase.FETCH_STATE)))
            sizes: list[int] = []

            def measured(stream_: Iterator[pb.TensorChunk]) -> Iterator[pb.TensorChunk]:
                for chunk in stream_:
                    sizes.append(len(chunk.data))
                    yield chunk

            _, name, received = codec.chunks_to_tensor(measured(chunks), max_bytes=1 << 31)
            stream.cancel()
        assert name == "global_state" and received.shape == big.shape
        assert np.array_equal(received, big)
        # Sent in the server's reply chunks, which every silo's reader takes (they are smaller
        # than the chunks it sends), so that silos fetching at once hold less of its memory.
        assert max(sizes) == REPLY_CHUNK_BYTES < codec.CHUNK_BYTES
        assert len(sizes) == 1 + -(-big.nbytes // REPLY_CHUNK_BYTES)
    finally:
        running.stop(0)


def test_group_key_and_similarity_calls_refuse_misplaced_and_malformed_input(ws) -> None:
    running = start_server(_plan(ws, "gsvc", algorithm="gcfl", min_silos=3), progress=False,
                           listen="127.0.0.1:0")
    ids = {s: load_identity(ws.identity(s)) for s in ("hospital-a", "pharma-b", "social-c")}
    channels = {s: _stub(running.port, i, i.ca_pem) for s, i in ids.items()}
    try:
        streams = [keep_attending(stub) for _, stub in channels.values()]
        machine = running.core.machine
        for _ in range(100):
            if machine.group_setup is not None:
                break
            threading.Event().wait(0.05)
        assert machine.group_setup is not None      # every silo is here: setup has begun
        stub = channels["pharma-b"][1]
        setup_env = Envelope("gsvc", 0, machine.setup_generation, Phase.GROUP_SETUP)
        # A message of another setup run (e.g. one begun before a coordinator restart).
        assert_refused(stub.AdvertiseSetup,
                       codec.setup_key_to_pb(replace(setup_env, attempt=2), b"old"),
                       grpc.StatusCode.FAILED_PRECONDITION, "is not from group-key setup run 1")

        assert_refused(stub.AdvertiseSetup, codec.setup_key_to_pb(setup_env, b""),
                       grpc.StatusCode.INVALID_ARGUMENT, "empty setup key")
        assert_refused(stub.AdvertiseSetup,
                       codec.setup_key_to_pb(replace(setup_env, phase=Phase.GROUP_SEAL), b"x"),
                       grpc.StatusCode.FAILED_PRECONDITION, "expected phase GROUP_SETUP")
        stub.AdvertiseSetup(codec.setup_key_to_pb(setup_env, b"signed advert"), timeout=5)
        assert_refused(stub.AdvertiseSetup, codec.setup_key_to_pb(setup_env, b"again"),
                       grpc.StatusCode.ALREADY_EXISTS, "already sent its setup key")
        seal_env = replace(setup_env, phase=Phase.GROUP_SEAL)
        assert_refused(stub.UploadGroupSeal,
                       codec.blobs_to_chunks({"box/social-c": b"b", "ckks_public": b"p"}, seal_env),
                       grpc.StatusCode.FAILED_PRECONDITION, "does not match")
        assert_refused(stub.UploadGroupSeal, codec.blobs_to_chunks({"secret": b"s"}, seal_env),
                       grpc.StatusCode.INVALID_ARGUMENT, "unexpected ['secret']")
        assert_refused(stub.FetchSetupBundle, codec.stage_request(seal_env),
                       grpc.StatusCode.FAILED_PRECONDITION, "does not match")
        update_env = replace(setup_env, phase=Phase.ENCRYPT_UPDATE)
        assert_refused(stub.UploadEncryptedUpdate,
                       codec.blobs_to_chunks({"ciphertext/1": b"c", "ciphertext/0": b"c"},
                                             update_env),
                       grpc.StatusCode.INVALID_ARGUMENT, "in order")
        assert_refused(stub.UploadEncryptedUpdate, codec.blobs_to_chunks({"ciphertext/0": b"c"},
                                                                         update_env),
                       grpc.StatusCode.FAILED_PRECONDITION, "does not match")
        decrypt_env = replace(setup_env, phase=Phase.DECRYPT_SIMILARITY)
        assert_refused(stub.FetchBlinded, codec.stage_request(decrypt_env),
                       grpc.StatusCode.FAILED_PRECONDITION, "does not match")
        assert_refused(stub.UploadSimilarities,
                       codec.similarities_to_pb(decrypt_env, {("pharma-b", "social-c"): 0.5}),
                       grpc.StatusCode.FAILED_PRECONDITION, "does not match")
        assert set(machine.group_setup.adverts) == {"pharma-b"}    # nothing else taken in
        for stream in streams:
            stream.cancel()
    finally:
        for channel, _ in channels.values():
            channel.close()
        running.stop(0)


def test_gcfl_checkpoint_keeps_clusters_sums_group_and_envelopes(ws) -> None:
    """What a restarted GCFL (or FedHGN) coordinator needs comes back exactly."""
    plan = _plan(ws, "gsvc-resume", algorithm="gcfl", rounds=4)
    before = RoundMachine(plan, make_strategy("gcfl", plan.clustering, plan.silos), 0.0,
                          start_round=3, history=[RoundRecord(r, 1, plan.silos, 30, 0.0, 1.0)
                                                  for r in (1, 2)])
    strategy = before.strategy
    assert isinstance(strategy, ClusteredStrategy)
    rng = np.random.default_rng(0)
    whole = tuple(sorted(plan.silos))
    strategy.cumulative[whole] = rng.standard_normal(5)
    strategy._touched = {whole}              # as if round 2 had just been aggregated
    strategy._split(whole, whole[:1], whole[1:], 0.5, 2.0)
    strategy.close_round(2)
    assert strategy.state_for(whole[1]) is not None
    strategy.to_load[whole[0]] = None
    before.group_setup = GroupSetup(whole, whole[0], opened=set(whole),
                                    public_context=b"public ckks context")
    before.setup_generation = 2
    before.envelopes = {"pharma-b": b"sealed-1", "hospital-a": b"sealed-2"}
    save_checkpoint(plan.server.state_dir, before)
    resume = load_checkpoint(plan.server.state_dir, plan)
    assert resume is not None and resume.setup_generation == 2
    after = RoundMachine(plan, make_strategy("gcfl", plan.clustering, plan.silos), 0.0,
                         start_round=resume.next_round, history=resume.history)
    after.restore_durable_state(resume.durable, resume.durable_arrays,
                                resume.setup_generation, 0.0)
    restored = after.strategy
    assert isinstance(restored, ClusteredStrategy)
    assert restored.state.clusters == strategy.state.clusters == [whole[:1], whole[1:]]
    assert restored.splits == strategy.splits and restored.norms == strategy.norms
    assert restored.cumulative.keys() == strategy.cumulative.keys()
    assert all(np.array_equal(restored.cumulative[c], v) for c, v in strategy.cumulative.items())
    for silo in plan.silos:
        mine, theirs = restored.state_for(silo), strategy.state_for(silo)
        assert (mine is None and theirs is None) or np.array_equal(mine, theirs), silo
    assert after.group_setup is not None and after.group_setup.leader == whole[0]
    assert after.group_setup.public_context == b"public ckks context"
    assert after.group_setup.opened == set(whole) and after.setup_generation == 2
    assert after.envelopes == before.envelopes


def test_checkpoint_records_the_open_attempt_and_refuses_what_it_cannot_resume(ws) -> None:
    plan = _plan(ws, "ckpt", algorithm="fedavg", rounds=3)
    state_dir = plan.server.state_dir
    machine = RoundMachine(plan, make_strategy("fedavg"), 0.0, start_round=2,
                           global_state=np.arange(4, dtype=np.float32),
                           history=[RoundRecord(1, 1, plan.silos, 30, 0.0, 1.0,
                                                {"hospital-a": {"test_acc": 0.5}})])
    machine.attempt = 3                  # attempts 1-3 of round 2 were opened, then a crash
    save_checkpoint(state_dir, machine)
    resume = load_checkpoint(state_dir, plan)
    assert resume is not None and (resume.next_round, resume.attempts_opened) == (2, 3)
    assert resume.history[0].metrics == {"hospital-a": {"test_acc": 0.5}}
    assert np.array_equal(resume.global_state, np.arange(4, dtype=np.float32))
    # A restarted server opens attempt 4 of round 2 (checked in test_rounds), for this plan only.
    other = _plan(ws, "ckpt", algorithm="fedavg", rounds=4)
    with pytest.raises(ValueError, match="belongs to a different plan"):
        load_checkpoint(state_dir, other)
    # A checkpoint without a completed round loses nothing: another plan may start afresh.
    save_checkpoint(state_dir, RoundMachine(plan, make_strategy("fedavg"), 0.0))
    assert load_checkpoint(state_dir, other) is None
    (state_dir / "checkpoint.json").write_text('{"plan": ')
    with pytest.raises(ValueError, match="checkpoint.json cannot be read back"):
        load_checkpoint(state_dir, plan)


@pytest.mark.parametrize("body", [b"\xff\xff\xff\xff", b"\x0a\x03\x0a\x01\xff"],
                         ids=["corrupt wire format", "bad UTF-8 in a string field"])
def test_request_bytes_that_do_not_parse_are_invalid_argument_not_internal(ws, body: bytes
                                                                          ) -> None:
    """Found by tests/e2e/test_fuzz.py: gRPC answered these with INTERNAL (a server bug's code)
    and the wire capture never saw a message; now each kind of call refuses them clearly."""
    plan = _plan(ws, f"undecodable-{len(body)}", algorithm="fedavg", min_silos=2)
    capture = plan.server.state_dir / "capture.bin"
    running = start_server(plan, progress=False, listen="127.0.0.1:0", capture=capture)
    ident = load_identity(ws.identity("hospital-a"))
    channel, stub = _stub(running.port, ident, ident.ca_pem)
    method = "/trellis.v1.Federation/"
    calls = {
        "AdvertiseKey": lambda: channel.unary_unary(method + "AdvertiseKey")(body, timeout=5),
        "FetchState": lambda: list(channel.unary_stream(method + "FetchState")(body,
                                                                              timeout=5)),
        "UploadMasked": lambda: channel.stream_unary(method + "UploadMasked")(iter([body]),
                                                                              timeout=5),
    }
    try:
        with channel:
            for name, call in calls.items():
                with pytest.raises(grpc.RpcError) as info:
                    call()
                assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, name
                assert f"the {name} request is not a valid Trellis message" in \
                    info.value.details()
            # The server still answers a well-formed request.
            assert isinstance(_attend(stub), list)
    finally:
        running.stop(0)
    assert [m for m, _ in read_capture(capture)] == [method + "Attend"]


def test_uploads_waiting_for_the_budget_hold_no_server_thread(ws, server) -> None:
    """Forty uploads wait inside the server at once (one holds the budget, 39 wait for it)
    while the server's threads grow by at most its fixed pool: no thread per call."""
    from trellis.coordinator.serving.aio_edge import CORE_THREADS
    from trellis.protos import federation_pb2 as pb

    ident = load_identity(ws.identity("hospital-a"))
    declared = 200 << 20            # each fills most of the 256 MiB budget: one at a time
    header = pb.TensorChunk(
        envelope=codec.envelope_to_pb(Envelope("svc", 1, 0, Phase.MASKED_INPUT)),
        header=pb.TensorHeader(name="masked", dtype="uint64", shape=[declared // 8],
                               total_bytes=declared, sha256=bytes(32)), last=False)
    budget = server.budget
    assert budget is not None
    calls = 40

    async def scenario() -> int:
        creds = grpc.ssl_channel_credentials(root_certificates=ident.ca_pem,
                                             private_key=ident.key_pem,
                                             certificate_chain=ident.cert_pem)
        async with grpc.aio.secure_channel(f"127.0.0.1:{server.port}", creds) as channel:
            stub = pb_grpc.FederationStub(channel)
            never = asyncio.Event()

            async def upload() -> AsyncIterator[pb.TensorChunk]:
                yield header
                await never.wait()           # the data never comes

            before = threading.active_count()
            pending = [stub.UploadMasked(upload()) for _ in range(calls)]
            for _ in range(400):
                if budget.waited == calls - 1:
                    break
                await asyncio.sleep(0.05)
            grown = threading.active_count() - before
            assert (budget.waited, budget.used) == (calls - 1, declared + 2 * codec.CHUNK_BYTES)
            for call in pending:
                call.cancel()
            return grown

    grown = asyncio.run(scenario())
    assert grown <= CORE_THREADS
    for _ in range(200):
        if budget.used == 0:
            break
        threading.Event().wait(0.05)
    assert budget.used == 0


def test_a_stop_request_as_listening_is_told_still_writes_the_interrupted_results(ws) -> None:
    """SIGTERM (Terminated) that lands while "listening" is being told: it reaches the caller
    as itself (so the command exits 143 and says how to resume, not typer's bare 130), after
    the results are written and the audit log closed, as for a stop at any later moment."""
    from trellis.protos.stop import Terminated, exit_code

    plan = _plan(ws, "stop-at-listening", algorithm="fedavg")
    running = start_server(plan, progress=False, listen="127.0.0.1:0")

    def announce() -> None:
        raise Terminated()            # what the signal handler raises in the main thread

    with pytest.raises(Terminated) as stopped:
        serve_until_done(running, announce=announce)
    assert exit_code(stopped.value) == 143
    results = json.loads((plan.server.state_dir / "results.json").read_text())
    assert results["status"] == "interrupted" and results["rounds_completed"] == 0
    events = [json.loads(line)["event"]
              for line in (plan.server.state_dir / "audit.jsonl").read_text().splitlines()]
    assert "results_written" in events
