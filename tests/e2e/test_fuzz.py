"""Hostile input from an admitted silo, through the real gRPC service, beside an honest federation.

A real coordinator (in-process, mTLS on loopback) runs a FedStar plan of four admitted silos:
three honest `silo join` processes and "lab-d", played by this test from a few threads with its
own certificate. lab-d sends thousands of seeded hostile messages (malformed and undecodable
protobuf, unknown enum values, wrong federation/round/attempt/phase, replays, truncated,
oversized and inconsistent tensor streams, wrong-length, NaN and out-of-ring masked vectors,
garbage keys, shares and signatures, NaN/inf metrics) and drops out of each round it is opened
with by closing its control stream. Every message must be answered with a status other than
UNKNOWN/INTERNAL (an unhandled exception) and a reason; the coordinator must keep answering,
take nothing from lab-d, and the honest silos' rounds must equal the simulation of the same
three silos exactly (masks cancel in Z_2^64, so dropping lab-d changes no bit of the sum).
"""

from __future__ import annotations

import hashlib
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.federation import (
    SILOS,
    Workspace,
    keep_attending,
    simulate_like_silo_processes,
    start_silo,
    write_plan,
)
from trellis.coordinator.rounds.machine import Stage
from trellis.coordinator.serving.service import RunningServer, serve_until_done, start_server
from trellis.crypto.pki import load_identity
from trellis.protos import codec
from trellis.protos import federation_pb2 as pb
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos.messages import PROTOCOL_VERSION, Envelope, Phase
from trellis.protos.plan import load_plan

pytestmark = pytest.mark.slow

ATTACKER = "lab-d"
SEED = 20240521
MIN_CASES = 2000
THREADS = 4
CRASH_CODES = (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
# Read-only calls that a live federation may answer (e.g. the final state once finishing).
READS = ("FetchState", "FetchPool")
SILOS_SORTED = tuple(sorted(SILOS))


@dataclass
class Case:
    """One hostile message: the call, what is sent, and a label for the report."""

    method: str
    request: Any                  # a message, an iterator of chunks, or raw bytes
    label: str
    raw: bool = False


class Fuzzer:
    """Seeded generator of hostile messages relative to the coordinator's current position."""

    def __init__(self, rng: random.Random, running: RunningServer, federation: str) -> None:
        self.rng = rng
        self.running = running
        self.federation = federation
        self.sent: list[Case] = []

    # -- envelopes ------------------------------------------------------------------------------
    def envelope(self, phase: Phase) -> tuple[pb.Envelope, str]:
        """The coordinator's position with one field wrong (or phase unknown)."""
        machine = self.running.core.machine
        env = pb.Envelope(federation_id=self.federation, round=machine.round,
                          attempt=machine.attempt, phase=int(phase))
        # Half the cases carry the right envelope, so that the payload checks are reached.
        which = "as is" if self.rng.random() < 0.5 else self.rng.choice(
            ["federation", "round", "attempt", "phase", "unknown phase"])
        if which == "federation":
            env.federation_id = self.rng.choice(["", "other", self.federation + "x", "é" * 64])
        elif which == "round":
            env.round = self.rng.choice([0, machine.round + 1, 2**32 - 1])
        elif which == "attempt":
            env.attempt = self.rng.choice([0, machine.attempt + 7, 2**32 - 1])
        elif which == "phase":
            env.phase = self.rng.choice([p for p in Phase if p is not phase])
        elif which == "unknown phase":
            env.phase = self.rng.choice([22, 99, 2**31 - 1, -1])
        return env, which

    def garbage(self, low: int = 0, high: int = 96) -> bytes:
        return self.rng.randbytes(self.rng.randint(low, high))

    # -- cases ------------------------------------------------------------------------------------
    def case(self) -> Case:
        kind = self.rng.choice([self.advert, self.shares, self.signature, self.reveal,
                                self.metrics, self.masked, self.stream, self.blobs, self.fetch,
                                self.setup, self.similarities, self.undecodable, self.attend,
                                self.replay])
        return kind()

    def advert(self) -> Case:
        env, which = self.envelope(Phase.ADVERTISE_KEY)
        key = [self.rng.randbytes(32), self.rng.randbytes(32)]
        flaw = self.rng.choice(["short key", "long key", "no signature", "garbage signature",
                                "same key twice", "huge length"])
        signature = self.garbage(1, 80)
        if flaw == "short key":
            key[self.rng.randrange(2)] = self.garbage(0, 31)
        elif flaw == "long key":
            key[self.rng.randrange(2)] = self.garbage(33, 64)
        elif flaw == "no signature":
            signature = b""
        elif flaw == "same key twice":
            key[1] = key[0]
        # The federation's own length, so that the key and signature checks are reached.
        known = self.running.core.machine.shared_length or 0
        length = 2**64 - 1 if flaw == "huge length" else known
        return Case("AdvertiseKey", pb.KeyAdvertisement(
            envelope=env, cipher_public_key=key[0], mask_public_key=key[1], signature=signature,
            shared_length=length), f"advert {flaw}, {which}")

    def shares(self) -> Case:
        env, which = self.envelope(Phase.SHARE_KEYS)
        names = [*SILOS, ATTACKER, "", "nobody"]
        shares = [pb.EncryptedShare(sender=self.rng.choice(names),
                                    receiver=self.rng.choice(names),
                                    box=self.garbage(0, 200))
                  for _ in range(self.rng.randint(0, 6))]
        return Case("UploadShares", pb.SealedShares(envelope=env, shares=shares),
                    f"garbage shares, {which}")

    def signature(self) -> Case:
        env, which = self.envelope(Phase.SIGN_SURVIVORS)
        return Case("SignSurvivors", pb.SurvivorSignature(
            envelope=env, silo=self.rng.choice(SILOS), signature=self.garbage()),
            f"garbage survivor signature, {which}")

    def reveal(self) -> Case:
        env, which = self.envelope(Phase.REVEAL_SHARES)
        shares = [pb.RevealedShare(owner=self.rng.choice([*SILOS, ATTACKER]),
                                   kind=self.rng.choice([0, 1, 2, 3, 77, -5]),
                                   share=self.garbage(0, 80))
                  for _ in range(self.rng.randint(0, 4))]
        return Case("RevealShares", pb.RevealedShares(envelope=env, shares=shares),
                    f"revealed shares with unknown kinds, {which}")

    def metrics(self) -> Case:
        env, which = self.envelope(Phase.REPORT)
        # Always one defect besides any NaN: a NaN alone is a value a silo may report.
        flaw = self.rng.choice(["inf", "-inf", "twice", "future round"])
        values = [pb.Metric(name="test_acc", value=self.rng.choice([float("nan"), 0.5]))]
        if flaw in ("inf", "-inf"):
            values.append(pb.Metric(name="loss", value=float(flaw)))
        elif flaw == "twice":
            values.append(pb.Metric(name="test_acc", value=0.25))
        else:
            env.round = 2**32 - 1
        return Case("ReportMetrics", pb.MetricsReport(envelope=env, metrics=values),
                    f"metrics {flaw}, {which}")

    def masked(self) -> Case:
        """A well-formed stream carrying a wrong masked vector."""
        import numpy as np

        env, which = self.envelope(Phase.MASKED_INPUT)
        length = min(self.running.core.machine.shared_length or 100, 1 << 16)
        flaw = self.rng.choice(["wrong length", "NaN floats", "inf floats", "out of ring",
                                "int64", "2-d"])
        vector: Any
        if flaw == "wrong length":
            vector = np.zeros(self.rng.choice([0, 1, length, length + 2]), np.uint64)
        elif flaw in ("NaN floats", "inf floats"):
            vector = np.full(length + 1, np.nan if flaw == "NaN floats" else np.inf)
        elif flaw == "out of ring":
            vector = np.full(length + 1, 2**40, np.uint64).astype(np.float64)
        elif flaw == "int64":
            vector = np.full(length + 1, -1, np.int64)
        else:
            vector = np.zeros((2, length + 1), np.uint64)
        chunks = list(codec.tensor_to_chunks("masked_input", vector,
                                             codec.envelope_from_pb(env)
                                             if env.phase in set(Phase) else
                                             Envelope(self.federation, 1, 1, Phase.MASKED_INPUT),
                                             chunk_bytes=1 << 14))
        return Case("UploadMasked", iter(chunks), f"masked {flaw}, {which}")

    def stream(self) -> Case:
        """A tensor stream broken in its framing."""
        env, _ = self.envelope(Phase.MASKED_INPUT)
        data = self.garbage(1, 3000)
        header = pb.TensorHeader(name="masked_input", dtype="uint8", shape=[len(data)],
                                 total_bytes=len(data), sha256=hashlib.sha256(data).digest())
        half = len(data) // 2
        first = pb.TensorChunk(envelope=env, header=header, data=data[:half], last=False)
        rest = pb.TensorChunk(envelope=env, data=data[half:], last=True)
        flaw = self.rng.choice(["truncated", "no header", "no last chunk", "data after last",
                                "empty", "bad digest", "envelope changes", "header twice",
                                "hostile shape", "bad dtype", "over the limit", "chunk too big",
                                "longer than header"])
        chunks: list[pb.TensorChunk] = [first, rest]
        if flaw == "truncated":
            chunks = [first]
        elif flaw == "no header":
            first.ClearField("header")
        elif flaw == "no last chunk":
            rest.last = False
        elif flaw == "data after last":
            chunks.append(pb.TensorChunk(envelope=env, data=b"x", last=True))
        elif flaw == "empty":
            chunks = []
        elif flaw == "bad digest":
            header.sha256 = self.garbage(0, 40)
            first.header.CopyFrom(header)
        elif flaw == "envelope changes":
            rest.envelope.round = (rest.envelope.round + 1) % 2**32
        elif flaw == "header twice":
            rest.header.CopyFrom(header)
        elif flaw == "hostile shape":
            # One header-only chunk: numpy would be asked to shape an empty buffer.
            first.header.shape[:] = self.rng.choice([[2**62, 4], [2**63, 2], [0, 2**63],
                                                     [1] * 40, [2**64 - 1]])
            first.header.total_bytes = self.rng.choice([0, 1, 2**64 - 1])
            first.header.sha256, first.data, first.last = hashlib.sha256(b"").digest(), b"", True
            chunks = [first]
        elif flaw == "bad dtype":
            first.header.dtype = self.rng.choice(["object", "complex128", "", "<U8", "V16"])
        elif flaw == "over the limit":
            first.header.dtype, first.header.shape[:] = "uint64", [1 << 28]
            first.header.total_bytes = 8 << 28
        elif flaw == "chunk too big":
            big = self.rng.randbytes(codec.CHUNK_BYTES + 1)
            first.header.shape[:], first.header.total_bytes = [len(big)], len(big)
            first.data, first.last, chunks = big, True, [first]
        else:
            rest.data += b"tail"
        method = self.rng.choice(["UploadMasked", "UploadEnvelope", "UploadGroupSeal",
                                  "UploadEncryptedUpdate"])
        return Case(method, iter(chunks), f"stream {flaw}")

    def blobs(self) -> Case:
        """Named byte strings of the wrong kind for the call."""
        phase, method, names = self.rng.choice([
            (Phase.MASKED_INPUT, "UploadEnvelope", ["envelope", "other"]),
            (Phase.GROUP_SEAL, "UploadGroupSeal", ["box/pharma-b", "secret", "ckks_public"]),
            (Phase.ENCRYPT_UPDATE, "UploadEncryptedUpdate", ["ciphertext/1", "ciphertext/0"])])
        env, which = self.envelope(phase)
        chosen = self.rng.sample(names, self.rng.randint(1, len(names)))
        blobs = {n: self.garbage() for n in chosen}
        domain = (codec.envelope_from_pb(env) if env.phase in set(Phase)
                  else Envelope(self.federation, 0, 0, phase))
        return Case(method, iter(list(codec.blobs_to_chunks(blobs, domain))),
                    f"{method} blobs {sorted(chosen)}, {which}")

    def fetch(self) -> Case:
        method, phase = self.rng.choice([
            ("FetchState", Phase.FETCH_STATE), ("FetchKeys", Phase.KEYS_READY),
            ("FetchShares", Phase.SHARES_READY), ("FetchUnmaskRequest", Phase.UNMASK),
            ("FetchSetupBundle", Phase.GROUP_SEAL), ("FetchGroupBox", Phase.GROUP_OPEN),
            ("ConfirmGroupOpen", Phase.GROUP_OPEN), ("FetchBlinded", Phase.DECRYPT_SIMILARITY),
            ("FetchPool", Phase.MASKED_INPUT)])
        env, which = self.envelope(phase)
        return Case(method, pb.StageRequest(envelope=env), f"{method}, {which}")

    def setup(self) -> Case:
        env, which = self.envelope(Phase.GROUP_SETUP)
        return Case("AdvertiseSetup", pb.SetupKey(envelope=env, advert=self.garbage()),
                    f"garbage setup key, {which}")

    def similarities(self) -> Case:
        env, which = self.envelope(Phase.DECRYPT_SIMILARITY)
        values = [pb.PairValue(first=self.rng.choice(SILOS), second=self.rng.choice(SILOS),
                               value=self.rng.choice([float("nan"), float("inf"), 1e308, 0.0]))
                  for _ in range(self.rng.randint(0, 4))]
        return Case("UploadSimilarities", pb.Similarities(envelope=env, values=values),
                    f"similarities with NaN/inf, {which}")

    def undecodable(self) -> Case:
        method = self.rng.choice(["AdvertiseKey", "UploadShares", "ReportMetrics",
                                  "FetchState", "UploadMasked", "RevealShares", "Attend"])
        body = self.rng.choice([b"\xff" * self.rng.randint(1, 9),
                                b"\x0a\x03\x0a\x01\xff",           # bad UTF-8 in a string
                                b"\x12\x80\x80\x80\x80\x10",       # length past the end
                                self.rng.randbytes(self.rng.randint(1, 64)) + b"\xff\xff"])
        return Case(method, body, "undecodable bytes", raw=True)

    def attend(self) -> Case:
        env = pb.Envelope(federation_id=self.federation, phase=int(Phase.JOIN))
        flaw = self.rng.choice(["old agent", "no version", "wrong phase", "wrong federation"])
        version = PROTOCOL_VERSION
        if flaw == "old agent":
            version = self.rng.choice(["trellis/0.1", "trellis/0.0", "trellis/x", "💥"])
        elif flaw == "no version":
            version = ""
        elif flaw == "wrong phase":
            env.phase = self.rng.choice([0, 4, 99])
        else:
            env.federation_id = "other-federation"
        return Case("Attend", pb.AttendRequest(envelope=env, agent_version=version),
                    f"attend {flaw}")

    def replay(self) -> Case:
        """The same upload again (every upload of lab-d was refused the first time too)."""
        earlier = [c for c in self.sent[-200:] if not c.raw and not isinstance(c.request,
                                                                              Iterator)]
        if not earlier:
            return self.advert()
        case = self.rng.choice(earlier)
        return Case(case.method, case.request, f"replay of: {case.label}")


def _call(channel: grpc.Channel, case: Case) -> tuple[grpc.StatusCode, str]:
    """Send one case and return its status and details (OK and '' if it was accepted)."""
    path = f"/trellis.v1.Federation/{case.method}"
    streaming_in = case.method.startswith("Upload") and case.method not in (
        "UploadShares", "UploadSimilarities")
    streaming_out = case.method in ("Attend", "FetchState", "FetchBlinded", "FetchPool")
    serialise = None if case.raw else (lambda m: m.SerializeToString())
    try:
        if streaming_in:
            requests = iter([case.request]) if case.raw else case.request
            channel.stream_unary(path, request_serializer=serialise)(requests, timeout=20)
        elif streaming_out:
            call = channel.unary_stream(path, request_serializer=serialise)(case.request,
                                                                            timeout=20)
            try:
                for _ in call:
                    if case.method == "Attend":
                        break             # an attend that got through; never expected
            finally:
                call.cancel()
        else:
            channel.unary_unary(path, request_serializer=serialise)(case.request, timeout=20)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


@pytest.fixture(scope="module")
def ws(workspace_factory) -> Workspace:
    return workspace_factory("fuzz", graphs=40, extra=1)      # the three, plus lab-d


def test_hostile_admitted_silo_is_refused_and_the_honest_federation_is_exact(ws: Workspace
                                                                             ) -> None:
    plan_path = write_plan(ws, "fuzz", rounds=2, min_silos=3, port=0)
    plan = load_plan(plan_path)
    assert ATTACKER in plan.silos and plan.public.aggregation.threshold == 3
    running = start_server(plan, progress=False, listen="127.0.0.1:0")
    ident = load_identity(ws.identity(ATTACKER))
    credentials = grpc.ssl_channel_credentials(ident.ca_pem, ident.key_pem, ident.cert_pem)
    channel = grpc.secure_channel(f"127.0.0.1:{running.port}", credentials)
    machine = running.core.machine
    stop = threading.Event()
    answers: Counter[str] = Counter()
    crashes: list[str] = []
    accepted: list[str] = []
    lock = threading.Lock()
    seeds = random.Random(SEED)

    def fuzz(rng: random.Random) -> None:
        fuzzer = Fuzzer(rng, running, plan.federation)
        while not stop.is_set():
            try:
                case = fuzzer.case()
            except Exception as exc:     # a bug of this test's generator: fail, not hang
                crashes.append(f"generator: {type(exc).__name__}: {exc}")
                return
            code, details = _call(channel, case)
            fuzzer.sent.append(case)
            with lock:
                answers[code.name] += 1
                if code in CRASH_CODES or (code is not grpc.StatusCode.OK and not details) or (
                        code in (grpc.StatusCode.DEADLINE_EXCEEDED,
                                 grpc.StatusCode.UNAVAILABLE)):
                    crashes.append(f"{case.method} [{case.label}]: {code.name} {details!r}")
                elif code is grpc.StatusCode.OK and case.method not in READS:
                    accepted.append(f"{case.method} [{case.label}]")

    def drop_out_of_each_round() -> None:
        """lab-d holds each round it is opened with until the honest silos wait only for it
        (and it has sent a few hundred messages meanwhile), then closes its control stream:
        the coordinator drops it and the round goes on with the three."""
        stream = keep_attending(pb_grpc.FederationStub(channel))
        while not stop.is_set():
            waiting = machine.waiting_for()
            if machine.stage is Stage.ADVERTISE and waiting == {ATTACKER}:
                before = sum(answers.values())
                while sum(answers.values()) < before + 300 and not stop.is_set():
                    time.sleep(0.05)
                stream.cancel()
                while ATTACKER in machine.present:
                    time.sleep(0.02)
                stream = keep_attending(pb_grpc.FederationStub(channel))
            time.sleep(0.05)
        stream.cancel()

    workers = [threading.Thread(target=fuzz, args=(random.Random(seeds.getrandbits(64)),),
                                daemon=True) for _ in range(THREADS)]
    presence = threading.Thread(target=drop_out_of_each_round, daemon=True)
    presence.start()
    for _ in range(100):
        if ATTACKER in machine.present:
            break
        time.sleep(0.05)
    for worker in workers:
        worker.start()
    root = ws.root / "fuzz"
    silos = [start_silo(ws, s, running.port, root / s, root / f"{s}.log") for s in SILOS]
    try:
        # Stop early once the coordinator took something of lab-d's: the silos may hang on it.
        deadline = time.monotonic() + 150
        while (any(p.poll() is None for p in silos) and time.monotonic() < deadline
               and not accepted):
            time.sleep(0.2)
        for process in silos:
            if process.poll() is None:
                process.kill()
        codes = [process.wait(timeout=30) for process in silos]
        # The server must still answer after the end: keep going up to the minimum.
        deadline = time.monotonic() + 60
        while (sum(answers.values()) < MIN_CASES and time.monotonic() < deadline
               and codes == [0, 0, 0]):
            time.sleep(0.1)
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=30)
        presence.join(timeout=10)
        channel.close()
        finished = machine.finished
        if not finished:
            running.stop(0)
    logs = {p.name: p.read_text()[-2000:] for p in root.glob("*.log")}
    total = sum(answers.values())
    print(f"\nfuzz: {total} hostile messages answered: {dict(answers)}")
    assert not crashes, crashes[:10]
    assert not accepted, accepted[:10]
    assert codes == [0, 0, 0], logs
    assert total >= MIN_CASES
    assert finished
    results = serve_until_done(running)
    assert results["status"] == "completed" and results["rounds_completed"] == 2, results
    for record in results["rounds"]:
        assert ATTACKER not in record["participants"] and ATTACKER not in record["metrics"]
        assert record["dropped"] == [ATTACKER] or ATTACKER not in record["dropped"]
    # The honest silos' rounds equal those of the same three silos simulated, bit for bit.
    simulated = simulate_like_silo_processes(load_plan(_without_attacker(plan_path)))
    assert [r["participants"] for r in results["rounds"]] == [list(SILOS_SORTED)] * 2
    assert [r["metrics"] for r in results["rounds"]] == [r["metrics"]
                                                         for r in simulated["rounds"]]
    assert results["final_metrics"] == simulated["final_metrics"]


def _without_attacker(plan_path: Path) -> Path:
    """The same plan (same federation id, seed and data) for the three honest silos only."""
    text = re.sub(f', "{ATTACKER}"( = "[^"]*")?', "", plan_path.read_text())
    assert ATTACKER not in text
    path = plan_path.with_name("fuzz-honest.toml")
    path.write_text(text)
    return path
