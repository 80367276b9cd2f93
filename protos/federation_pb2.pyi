from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHASE_UNSPECIFIED: _ClassVar[Phase]
    JOIN: _ClassVar[Phase]
    WAITING: _ClassVar[Phase]
    ROUND_OPEN: _ClassVar[Phase]
    ADVERTISE_KEY: _ClassVar[Phase]
    KEYS_READY: _ClassVar[Phase]
    MASKED_INPUT: _ClassVar[Phase]
    ROUND_ABORTED: _ClassVar[Phase]
    REPORT: _ClassVar[Phase]
    FINISHED: _ClassVar[Phase]
    FETCH_STATE: _ClassVar[Phase]
    SHARE_KEYS: _ClassVar[Phase]
    SHARES_READY: _ClassVar[Phase]
    CONSISTENCY_CHECK: _ClassVar[Phase]
    SIGN_SURVIVORS: _ClassVar[Phase]
    UNMASK: _ClassVar[Phase]
    REVEAL_SHARES: _ClassVar[Phase]
    GROUP_SETUP: _ClassVar[Phase]
    GROUP_SEAL: _ClassVar[Phase]
    GROUP_OPEN: _ClassVar[Phase]
    ENCRYPT_UPDATE: _ClassVar[Phase]
    DECRYPT_SIMILARITY: _ClassVar[Phase]

class ShareKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SHARE_KIND_UNSPECIFIED: _ClassVar[ShareKind]
    MASK_KEY: _ClassVar[ShareKind]
    MASK_SEED: _ClassVar[ShareKind]
PHASE_UNSPECIFIED: Phase
JOIN: Phase
WAITING: Phase
ROUND_OPEN: Phase
ADVERTISE_KEY: Phase
KEYS_READY: Phase
MASKED_INPUT: Phase
ROUND_ABORTED: Phase
REPORT: Phase
FINISHED: Phase
FETCH_STATE: Phase
SHARE_KEYS: Phase
SHARES_READY: Phase
CONSISTENCY_CHECK: Phase
SIGN_SURVIVORS: Phase
UNMASK: Phase
REVEAL_SHARES: Phase
GROUP_SETUP: Phase
GROUP_SEAL: Phase
GROUP_OPEN: Phase
ENCRYPT_UPDATE: Phase
DECRYPT_SIMILARITY: Phase
SHARE_KIND_UNSPECIFIED: ShareKind
MASK_KEY: ShareKind
MASK_SEED: ShareKind

class Envelope(_message.Message):
    __slots__ = ("federation_id", "round", "attempt", "phase")
    FEDERATION_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    federation_id: str
    round: int
    attempt: int
    phase: Phase
    def __init__(self, federation_id: _Optional[str] = ..., round: _Optional[int] = ..., attempt: _Optional[int] = ..., phase: _Optional[_Union[Phase, str]] = ...) -> None: ...

class AttendRequest(_message.Message):
    __slots__ = ("envelope", "agent_version")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    envelope: Envelope
    agent_version: str
    def __init__(self, envelope: _Optional[_Union[Envelope, _Mapping]] = ..., agent_version: _Optional[str] = ...) -> None: ...

class Instruction(_message.Message):
    __slots__ = ("envelope", "participants", "public_plan_json", "message", "total_rounds", "run_id")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    envelope: Envelope
    participants: _containers.RepeatedScalarFieldContainer[str]
    public_plan_json: str
    message: str
    total_rounds: int
    run_id: str
    def __init__(self, envelope: _Optional[_Union[Envelope, _Mapping]] = ..., participants: _Optional[_Iterable[str]] = ..., public_plan_json: _Optional[str] = ..., message: _Optional[str] = ..., total_rounds: _Optional[int] = ..., run_id: _Optional[str] = ...) -> None: ...

class TensorHeader(_message.Message):
    __slots__ = ("name", "dtype", "shape", "total_bytes", "sha256")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    total_bytes: int
    sha256: bytes
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., total_bytes: _Optional[int] = ..., sha256: _Optional[bytes] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ("envelope", "header", "data", "last", "statistics")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    STATISTICS_FIELD_NUMBER: _ClassVar[int]
    envelope: Envelope
    header: TensorHeader
    data: bytes
    last: bool
    statistics: _containers.RepeatedCompositeFieldContainer[Metric]
    def __init__(self, envelope: _Optional[_Union[Envelope, _Mapping]] = ..., header: _Optional[_Union[TensorHeader, _Mapping]] = ..., data: _Optional[bytes] = ..., last: _Optional[bool] = ..., statistics: _Optional[_Iterable[_Union[Metric, _Mapping]]] = ...) -> None: ...

class KeyAdvertisement(_message.Message):
    __slots__ = ("envelope", "cipher_public_key", "mask_public_key", "signature", "shared_length")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    CIPHER_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    MASK_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    SHARED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    envelope: Envelope
    cipher_public_key: bytes
    mask_public_key: bytes
    signature: bytes
    shared_length: int
    def __init__(self, envelope: _Optional[_Union[Envelope, _Mapping]] = ..., cipher_public_key: _Optional[bytes] = ..., mask_public_key: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., shared_length: _Optional[int] = ...) -> None: ...

class SignedKey(_message.Message):
    __slots__ = ("silo", "cipher_public_key", "mask_public_key", "signature", "certificate_pem")
    SILO_FIELD_NUMBER: _ClassVar[int]
    CIPHER_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    MASK_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    silo: str
    cipher_public_key: bytes
    mask_public_key: bytes
    signature: bytes
    certificate_pem: bytes
    def __init__(self, silo: _Optional[str] = ..., cipher_public_key: _Optional[bytes] = ..., mask_public_key: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., certificate_pem: _Optional[bytes] = ...) -> None: ...

class StageRequest(_message.Message):
    __slots__ = ("envelope",)
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    envelope: Envelope
    def __init__(self, envelope: _Optional[_Union[Envelope, _Mapping]] = ...) -> None: ...

class KeyBundle(_message.Message):
    __slots__ = ("envelope", "keys")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    envelope: Envelope
    keys: _containers.RepeatedCompositeFieldContainer[SignedKey]
    def __init__(self, envelope: _Optional[_Union[Envelope, _Mapping]] = ..., keys: _Optional[_Iterable[_Union[SignedKey, _Mapping]]] = ...) -> None: ...

class EncryptedShare(_message.Message):
    __slots__ = ("sender", "receiver", "box")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_FIELD_NUMBER: _ClassVar[int]
    BOX_FIELD_NUMBER: _ClassVar[int]
    sender: str
    receiver: str
    box: bytes
    def __init__(self, sender: _Optional[str] = ..., receiver: _Optional[str] = ..., box: _Optional[bytes] = ...) -> None: ...

class SealedShares(_message.Message):
    __slots__ = ("envelope", "shares")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    envelope: Envelope
    shares: _containers.RepeatedCompositeFieldContainer[EncryptedShare]
    def __init__(self, envelope: _Optional[_Union[Envelope, _Mapping]] = ..., shares: _Optional[_Iterable[_Union[EncryptedShare, _Mapping]]] = ...) -> None: ...

class SurvivorSignature(_message.Message):
    __slots__ = ("envelope", "silo", "signature")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    SILO_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    envelope: Envelope
    silo: str
    signature: bytes
    def __init__(self, envelope: _Optional[_Union[Envelope, _Mapping]] = ..., silo: _Optional[str] = ..., signature: _Optional[bytes] = ...) -> None: ...

class UnmaskRequest(_message.Message):
    __slots__ = ("envelope", "survivors", "seed_shares_of", "key_shares_of", "signatures")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    SURVIVORS_FIELD_NUMBER: _ClassVar[int]
    SEED_SHARES_OF_FIELD_NUMBER: _ClassVar[int]
    KEY_SHARES_OF_FIELD_NUMBER: _ClassVar[int]
    SIGNATURES_FIELD_NUMBER: _ClassVar[int]
    envelope: Envelope
    survivors: _containers.RepeatedScalarFieldContainer[str]
    seed_shares_of: _containers.RepeatedScalarFieldContainer[str]
    key_shares_of: _containers.RepeatedScalarFieldContainer[str]
    signatures: _containers.RepeatedCompositeFieldContainer[SurvivorSignature]
    def __init__(self, envelope: _Optional[_Union[Envelope, _Mapping]] = ..., survivors: _Optional[_Iterable[str]] = ..., seed_shares_of: _Optional[_Iterable[str]] = ..., key_shares_of: _Optional[_Iterable[str]] = ..., signatures: _Optional[_Iterable[_Union[SurvivorSignature, _Mapping]]] = ...) -> None: ...

class RevealedShare(_message.Message):
    __slots__ = ("owner", "kind", "share")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    owner: str
    kind: ShareKind
    share: bytes
    def __init__(self, owner: _Optional[str] = ..., kind: _Optional[_Union[ShareKind, str]] = ..., share: _Optional[bytes] = ...) -> None: ...

class RevealedShares(_message.Message):
    __slots__ = ("envelope", "shares")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    envelope: Envelope
    shares: _containers.RepeatedCompositeFieldContainer[RevealedShare]
    def __init__(self, envelope: _Optional[_Union[Envelope, _Mapping]] = ..., shares: _Optional[_Iterable[_Union[RevealedShare, _Mapping]]] = ...) -> None: ...

class Metric(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: float
    def __init__(self, name: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...

class MetricsReport(_message.Message):
    __slots__ = ("envelope", "metrics")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    envelope: Envelope
    metrics: _containers.RepeatedCompositeFieldContainer[Metric]
    def __init__(self, envelope: _Optional[_Union[Envelope, _Mapping]] = ..., metrics: _Optional[_Iterable[_Union[Metric, _Mapping]]] = ...) -> None: ...

class SetupKey(_message.Message):
    __slots__ = ("envelope", "advert")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    ADVERT_FIELD_NUMBER: _ClassVar[int]
    envelope: Envelope
    advert: bytes
    def __init__(self, envelope: _Optional[_Union[Envelope, _Mapping]] = ..., advert: _Optional[bytes] = ...) -> None: ...

class SetupEntry(_message.Message):
    __slots__ = ("silo", "advert", "certificate_pem")
    SILO_FIELD_NUMBER: _ClassVar[int]
    ADVERT_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    silo: str
    advert: bytes
    certificate_pem: bytes
    def __init__(self, silo: _Optional[str] = ..., advert: _Optional[bytes] = ..., certificate_pem: _Optional[bytes] = ...) -> None: ...

class SetupBundle(_message.Message):
    __slots__ = ("envelope", "entries")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    envelope: Envelope
    entries: _containers.RepeatedCompositeFieldContainer[SetupEntry]
    def __init__(self, envelope: _Optional[_Union[Envelope, _Mapping]] = ..., entries: _Optional[_Iterable[_Union[SetupEntry, _Mapping]]] = ...) -> None: ...

class GroupBox(_message.Message):
    __slots__ = ("envelope", "box", "leader_advert", "leader_certificate_pem")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    BOX_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADVERT_FIELD_NUMBER: _ClassVar[int]
    LEADER_CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    envelope: Envelope
    box: bytes
    leader_advert: bytes
    leader_certificate_pem: bytes
    def __init__(self, envelope: _Optional[_Union[Envelope, _Mapping]] = ..., box: _Optional[bytes] = ..., leader_advert: _Optional[bytes] = ..., leader_certificate_pem: _Optional[bytes] = ...) -> None: ...

class PairValue(_message.Message):
    __slots__ = ("first", "second", "value")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    SECOND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    first: str
    second: str
    value: float
    def __init__(self, first: _Optional[str] = ..., second: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...

class Similarities(_message.Message):
    __slots__ = ("envelope", "values")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    envelope: Envelope
    values: _containers.RepeatedCompositeFieldContainer[PairValue]
    def __init__(self, envelope: _Optional[_Union[Envelope, _Mapping]] = ..., values: _Optional[_Iterable[_Union[PairValue, _Mapping]]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("envelope", "message")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    envelope: Envelope
    message: str
    def __init__(self, envelope: _Optional[_Union[Envelope, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RefusedCaller(_message.Message):
    __slots__ = ("subject", "reason")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    subject: str
    reason: str
    def __init__(self, subject: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class FederationStatus(_message.Message):
    __slots__ = ("federation_id", "algorithm", "run_id", "round", "rounds", "rounds_completed", "stage", "connected", "dropped", "refused", "metrics_round", "reported", "metrics", "started_at", "updated_at", "elapsed_s", "round_mean_s", "pid", "failure", "plan")
    FEDERATION_ID_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    METRICS_ROUND_FIELD_NUMBER: _ClassVar[int]
    REPORTED_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    ROUND_MEAN_S_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    federation_id: str
    algorithm: str
    run_id: str
    round: int
    rounds: int
    rounds_completed: int
    stage: str
    connected: _containers.RepeatedScalarFieldContainer[str]
    dropped: _containers.RepeatedScalarFieldContainer[str]
    refused: _containers.RepeatedCompositeFieldContainer[RefusedCaller]
    metrics_round: int
    reported: int
    metrics: _containers.RepeatedCompositeFieldContainer[Metric]
    started_at: float
    updated_at: float
    elapsed_s: float
    round_mean_s: float
    pid: int
    failure: str
    plan: str
    def __init__(self, federation_id: _Optional[str] = ..., algorithm: _Optional[str] = ..., run_id: _Optional[str] = ..., round: _Optional[int] = ..., rounds: _Optional[int] = ..., rounds_completed: _Optional[int] = ..., stage: _Optional[str] = ..., connected: _Optional[_Iterable[str]] = ..., dropped: _Optional[_Iterable[str]] = ..., refused: _Optional[_Iterable[_Union[RefusedCaller, _Mapping]]] = ..., metrics_round: _Optional[int] = ..., reported: _Optional[int] = ..., metrics: _Optional[_Iterable[_Union[Metric, _Mapping]]] = ..., started_at: _Optional[float] = ..., updated_at: _Optional[float] = ..., elapsed_s: _Optional[float] = ..., round_mean_s: _Optional[float] = ..., pid: _Optional[int] = ..., failure: _Optional[str] = ..., plan: _Optional[str] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("plan_toml", "submission_json", "signature")
    PLAN_TOML_FIELD_NUMBER: _ClassVar[int]
    SUBMISSION_JSON_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    plan_toml: bytes
    submission_json: str
    signature: bytes
    def __init__(self, plan_toml: _Optional[bytes] = ..., submission_json: _Optional[str] = ..., signature: _Optional[bytes] = ...) -> None: ...

class JobRequest(_message.Message):
    __slots__ = ("job_id", "follow", "offset")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    follow: bool
    offset: int
    def __init__(self, job_id: _Optional[int] = ..., follow: _Optional[bool] = ..., offset: _Optional[int] = ...) -> None: ...

class JobListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SiloAnswer(_message.Message):
    __slots__ = ("silo", "answer", "reason", "at")
    SILO_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    silo: str
    answer: str
    reason: str
    at: float
    def __init__(self, silo: _Optional[str] = ..., answer: _Optional[str] = ..., reason: _Optional[str] = ..., at: _Optional[float] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("at", "state", "reason")
    AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    at: float
    state: str
    reason: str
    def __init__(self, at: _Optional[float] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class JobSummary(_message.Message):
    __slots__ = ("job_id", "federation_id", "algorithm", "dataset", "operator", "state", "reason", "submitted_at", "updated_at", "silos", "min_silos", "answers", "events", "status", "has_status", "public_sha256", "rounds")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FEDERATION_ID_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    SILOS_FIELD_NUMBER: _ClassVar[int]
    MIN_SILOS_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HAS_STATUS_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_SHA256_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    federation_id: str
    algorithm: str
    dataset: str
    operator: str
    state: str
    reason: str
    submitted_at: float
    updated_at: float
    silos: _containers.RepeatedScalarFieldContainer[str]
    min_silos: int
    answers: _containers.RepeatedCompositeFieldContainer[SiloAnswer]
    events: _containers.RepeatedCompositeFieldContainer[JobEvent]
    status: FederationStatus
    has_status: bool
    public_sha256: str
    rounds: int
    def __init__(self, job_id: _Optional[int] = ..., federation_id: _Optional[str] = ..., algorithm: _Optional[str] = ..., dataset: _Optional[str] = ..., operator: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., submitted_at: _Optional[float] = ..., updated_at: _Optional[float] = ..., silos: _Optional[_Iterable[str]] = ..., min_silos: _Optional[int] = ..., answers: _Optional[_Iterable[_Union[SiloAnswer, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[JobEvent, _Mapping]]] = ..., status: _Optional[_Union[FederationStatus, _Mapping]] = ..., has_status: _Optional[bool] = ..., public_sha256: _Optional[str] = ..., rounds: _Optional[int] = ...) -> None: ...

class JobList(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobSummary]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobSummary, _Mapping]]] = ...) -> None: ...

class LogLines(_message.Message):
    __slots__ = ("lines", "offset")
    LINES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    lines: _containers.RepeatedScalarFieldContainer[str]
    offset: int
    def __init__(self, lines: _Optional[_Iterable[str]] = ..., offset: _Optional[int] = ...) -> None: ...

class ResultFile(_message.Message):
    __slots__ = ("name", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    data: bytes
    def __init__(self, name: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class WatchJobsRequest(_message.Message):
    __slots__ = ("agent_version",)
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    agent_version: str
    def __init__(self, agent_version: _Optional[str] = ...) -> None: ...

class JobOffer(_message.Message):
    __slots__ = ("job_id", "state", "federation_id", "public_plan_json", "submission_json", "signature", "operator_certificate_pem", "participants", "reason", "answer")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FEDERATION_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    SUBMISSION_JSON_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    state: str
    federation_id: str
    public_plan_json: str
    submission_json: str
    signature: bytes
    operator_certificate_pem: bytes
    participants: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    answer: str
    def __init__(self, job_id: _Optional[int] = ..., state: _Optional[str] = ..., federation_id: _Optional[str] = ..., public_plan_json: _Optional[str] = ..., submission_json: _Optional[str] = ..., signature: _Optional[bytes] = ..., operator_certificate_pem: _Optional[bytes] = ..., participants: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., answer: _Optional[str] = ...) -> None: ...

class SiteJobs(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobOffer]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobOffer, _Mapping]]] = ...) -> None: ...

class JobAnswer(_message.Message):
    __slots__ = ("job_id", "approve", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    approve: bool
    reason: str
    def __init__(self, job_id: _Optional[int] = ..., approve: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...
