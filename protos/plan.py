"""The federation plan: TOML -> typed, validated object (STYLE.md principle 11).

Every problem is reported at once, each with the dotted path of its field. Relative paths are
resolved against the plan file's folder. ``PublicPlan`` is the part a silo receives on joining.

Over 400 lines because the plan's tables and the rules that check them, side by side, are the
one place an operator's file is validated; the generic field readers are in protos/fields.py,
the [clustering] and [fedhgn] tables in protos/algorithm_tables.py, the size limits in
protos/plan_limits.py.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from trellis.protos.algorithm_tables import (
    ClusteringConfig,
    HeteroConfig,
    read_clustering,
    read_hetero,
)
from trellis.protos.algorithms import ALGORITHMS, NODE_TASK, algorithm
from trellis.protos.fields import (
    MAX_NAME,
    check_keys,
    path_problem,
    read_float,
    read_int,
    read_path,
    read_table,
    shown,
    valid_address,
    valid_name,
)
from trellis.protos.metrics import DEFAULT_VALIDATION_METRIC, VALIDATION_METRICS
from trellis.protos.metrics_plan import (
    MetricsConfig,
    capacity_problem,
    check_metrics,
    read_metrics,
)
from trellis.protos.plan_limits import limit
from trellis.protos.privacy_plan import (
    DEFAULT_ACCOUNTANT,
    PrivacyConfig,
    check_privacy,
    read_privacy,
    resolve_bits,
    resolve_noise,
    with_recipe_defaults,
)
from trellis.protos.starting_point import read_frozen, read_init_sha256
from trellis.protos.user_text import NotText, decode_user_text

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class PlanError(ValueError):
    """A plan has one or more invalid fields; `problems` lists them as 'path: message'."""

    def __init__(self, problems: list[str], source: str = "plan") -> None:
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


@dataclass(frozen=True)
class ModelConfig:
    """Model hyper-parameters (docs/algorithms.md §1.3, §2.2)."""

    hidden: int = 64
    layers: int = 3
    dropout: float = 0.5
    n_rw: int = 16
    n_dg: int = 16
    width: int = 32      # FedDense's r: the width of every layer of its model
    norm: str = "batch"  # FedDense's normalisation layers: one of MODEL_NORMS
    # The public initial model's SHA-256 ("": the plan seed's random start) and the groups no
    # step changes (protos/starting_point.py).
    init_sha256: str = ""
    frozen: tuple[str, ...] = ()


# "batch": BatchNorm1d (mixes the graphs of a batch); "layer": a per-row LayerNorm, which
# per-graph DP-SGD needs (silo/privacy/per_graph_gradients.py).
MODEL_NORMS = ("batch", "layer")


@dataclass(frozen=True)
class TrainingConfig:
    """Local optimisation (docs/algorithms.md §1.4)."""

    lr: float = 0.001
    weight_decay: float = 5e-4
    batch_size: int = 128
    local_epochs: int = 1
    split_seed: int = 123
    mu: float = 0.01
    # What picks the best round and drives early stopping: one of VALIDATION_METRICS.
    validation_metric: str = DEFAULT_VALIDATION_METRIC
    # Each silo evaluates, reports and keeps as its final model an exponential average of its
    # model over the rounds, this much per round (0: the model itself). Post-processing: under
    # differential privacy it costs no epsilon (docs/privacy.md).
    average: float = 0.0


@dataclass(frozen=True)
class AggregationConfig:
    """Fixed-point encoding and secure aggregation parameters (DESIGN.md §5).

    `threshold` is the Shamir threshold t: at least t silos must survive every stage of a round
    (0 in a plan file: a majority of each silo's share holders). `neighbours` is 0 for the full
    graph of Bonawitz et al. or an even k for a SecAgg+ graph. `ring_bits` may be "auto" in a
    plan file: 32 when the overflow check allows it, else 64. `unweighted_sum` is not set in a
    plan file but follows `clustering.mean_norm`: GCFL silos then also mask their unweighted
    update, so silos see in the public plan that this sum is revealed.
    """

    clip: float = 64.0
    fraction_bits: int = 24
    ring_bits: int = 64
    max_sample_count: int = 1_000_000
    threshold: int = 0
    neighbours: int = 0
    unweighted_sum: bool = False


@dataclass(frozen=True)
class ServerConfig:
    """Where and how the coordinator listens and keeps its state."""

    listen: str = "127.0.0.1:50051"
    ca_cert: Path = Path("ca/ca.crt")
    server_cert: Path = Path("ca/server.crt")
    server_key: Path = Path("ca/server.key")
    state_dir: Path = Path("state")
    # The CA's revocation list, watched while serving; crl.pem beside ca_cert unless set.
    crl: Path | None = None
    # The most memory masked inputs being received at once may take; more wait their turn
    # (gRPC flow control holds their senders back). Bounds the coordinator whatever N is.
    upload_memory_mb: int = 256
    # Each connected silo's unread upload data in gRPC's buffers
    # (coordinator/serving/upload_budget.py).
    stream_window_kb: int = 64

    @property
    def crl_path(self) -> Path:
        """Where the coordinator looks for the federation's CRL."""
        return self.crl if self.crl is not None else self.ca_cert.parent / "crl.pem"


@dataclass(frozen=True)
class TimeoutConfig:
    """How long the coordinator waits for silos, in seconds."""

    join_s: float = 600.0
    round_s: float = 1800.0        # from the end of key sharing to the last masked input
    stage_s: float = 120.0         # each other secure-aggregation stage (silent silos only)
    report_s: float = 120.0
    max_attempts: int = 3


@dataclass(frozen=True)
class PublicPlan:
    """The part of the plan every admitted silo receives when it joins."""

    federation: str
    algorithm: str
    rounds: int
    seed: int
    model: ModelConfig
    training: TrainingConfig
    aggregation: AggregationConfig
    hetero: HeteroConfig = field(default_factory=HeteroConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    # The dataset a standing silo trains on (`silo serve --data NAME=PATH`); "" for a one-plan
    # federation, whose silos are each given one folder.
    dataset: str = ""
    # [data] reference_sha256: the reference-set fingerprint every silo's dataset must record
    # (silo/data/molecules/fingerprint.py); "" requires none.
    reference_sha256: str = ""
    # [metrics]: evaluation counts summed inside the masked vector (protos/metrics_plan.py).
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def to_json(self) -> str:
        """Serialise for the wire."""
        doc = asdict(self)
        for optional in ("dataset", "reference_sha256"):
            if not doc[optional]:
                # Left out when unset, so a plan without it keeps the hash it always had.
                del doc[optional]
        if self.training.validation_metric == DEFAULT_VALIDATION_METRIC:
            del doc["training"]["validation_metric"]       # likewise
        if not self.training.average:
            del doc["training"]["average"]                 # likewise
        if self.privacy.accountant == DEFAULT_ACCOUNTANT:
            del doc["privacy"]["accountant"]               # likewise
        for optional in ("init_sha256", "frozen"):
            if not doc["model"][optional]:
                del doc["model"][optional]                 # likewise
        if self.metrics == MetricsConfig():
            del doc["metrics"]                             # likewise
        return json.dumps(doc, sort_keys=True)

    def sha256(self) -> str:
        """SHA-256 (hex) of the canonical wire form: how audit records and model labels name it."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @classmethod
    def from_json(cls, text: str) -> PublicPlan:
        """Parse and validate the wire form (a silo does not trust it blindly)."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError([f"public plan is not valid JSON: {exc}"]) from exc
        problems: list[str] = []
        plan = _public_from_dict(raw, problems)
        if problems or plan is None:
            raise PlanError(problems or ["public plan: invalid"], "public plan")
        return plan


@dataclass(frozen=True)
class Plan:
    """A whole, validated federation plan."""

    public: PublicPlan
    min_silos: int
    silos: tuple[str, ...]
    server: ServerConfig
    timeouts: TimeoutConfig
    simulation_data: dict[str, Path] = field(default_factory=dict)
    # [simulation] init_model: the public initial model every simulated silo is given.
    simulation_init: Path | None = None
    clustering: ClusteringConfig = field(default_factory=ClusteringConfig)
    source: Path | None = None

    @property
    def federation(self) -> str:
        """The federation id."""
        return self.public.federation

    @property
    def silos_without_data(self) -> list[str]:
        """Admitted silos the [simulation] table gives no data folder."""
        return [s for s in self.silos if s not in self.simulation_data]


def load_plan(path: Path) -> Plan:
    """Read and validate a plan file."""
    try:
        text = decode_user_text(path.read_bytes())
    except OSError as exc:
        raise PlanError([f"cannot read plan file: {exc.strerror}"], str(path)) from exc
    except NotText as exc:
        raise PlanError([str(exc)], str(path)) from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError([f"not valid TOML: {exc}"], str(path)) from exc
    return parse_plan(raw, base_dir=path.resolve().parent, source=path)


def parse_plan(raw: dict[str, Any], *, base_dir: Path, source: Path | None = None) -> Plan:
    """Validate a parsed TOML document into a Plan, collecting every problem."""
    problems: list[str] = []
    check_keys(raw, "", {"federation", "model", "training", "aggregation", "server",
                          "timeouts", "simulation", "clustering", "fedhgn", "privacy", "data",
                          "metrics"},
               problems)
    fed = read_table(raw, "federation", problems)
    check_keys(fed, "federation", {"id", "algorithm", "rounds", "seed", "min_silos", "silos",
                                   "dataset"}, problems)
    data = read_table(raw, "data", problems)
    check_keys(data, "data", {"reference_sha256"}, problems)
    privacy, training, model = with_recipe_defaults(raw.get("privacy", {}),
                                                    raw.get("training", {}),
                                                    raw.get("model", {}))
    public = _public_from_dict(
        {
            "federation": fed.get("id"),
            "algorithm": fed.get("algorithm"),
            "rounds": fed.get("rounds"),
            "seed": fed.get("seed", 1),
            "model": model,
            "training": training,
            "aggregation": raw.get("aggregation", {}),
            "hetero": raw.get("fedhgn", {}),
            "privacy": privacy,
            "metrics": raw.get("metrics", {}),
            "dataset": fed.get("dataset", ""),
            "reference_sha256": data.get("reference_sha256", ""),
        },
        problems,
        paths={"federation": "federation.id", "algorithm": "federation.algorithm",
               "rounds": "federation.rounds", "seed": "federation.seed",
               "dataset": "federation.dataset",
               "reference_sha256": "data.reference_sha256"},
    )
    silos = fed.get("silos")
    silo_names: tuple[str, ...] = ()
    if not isinstance(silos, list) or not silos:
        problems.append("federation.silos: must be a non-empty list of silo names "
                        "(certificate subjects)")
    else:
        for i, name in enumerate(silos):
            if not valid_name(name):
                problems.append(f"federation.silos[{i}]: {shown(name)} is not a valid silo name "
                                "(letters, digits, '.', '_', '-')")
        if len(set(map(str, silos))) != len(silos):
            problems.append("federation.silos: names must be unique")
        silo_names = tuple(str(s) for s in silos)
    min_silos = read_int(fed, "min_silos", "federation.min_silos", problems,
                     default=max(len(silo_names), 1), low=1)
    if silo_names and min_silos > len(silo_names):
        problems.append(f"federation.min_silos: {min_silos} exceeds the {len(silo_names)} "
                        "admitted silos")
    if public is not None and algorithm(public.algorithm).aggregates and min_silos < 2:
        problems.append("federation.min_silos: secure aggregation needs at least 2 silos")
    if public is not None and algorithm(public.algorithm).one_silo and len(silo_names) != 1:
        problems.append(f"federation.silos: {public.algorithm} trains one model on the whole "
                        "graph; "
                        "list exactly one silo whose data folder holds it")

    server_raw = read_table(raw, "server", problems)
    check_keys(server_raw, "server", {"listen", "ca_cert", "server_cert", "server_key",
                                       "state_dir", "crl", "upload_memory_mb",
                                       "stream_window_kb"}, problems)
    defaults = ServerConfig()
    listen = server_raw.get("listen", defaults.listen)
    if not isinstance(listen, str) or not valid_address(listen):
        problems.append(f"server.listen: expected 'host:port', got {shown(listen)}")
    server = ServerConfig(
        listen=str(listen),
        ca_cert=read_path(server_raw, "ca_cert", "server", base_dir, defaults.ca_cert, problems),
        server_cert=read_path(server_raw, "server_cert", "server", base_dir, defaults.server_cert,
                          problems),
        server_key=read_path(server_raw, "server_key", "server", base_dir, defaults.server_key,
                         problems),
        state_dir=read_path(server_raw, "state_dir", "server", base_dir, defaults.state_dir,
                        problems),
        crl=(read_path(server_raw, "crl", "server", base_dir, Path("crl.pem"), problems)
             if "crl" in server_raw else None),
        upload_memory_mb=read_int(server_raw, "upload_memory_mb", "server.upload_memory_mb",
                                  problems, defaults.upload_memory_mb, low=1),
        stream_window_kb=read_int(server_raw, "stream_window_kb", "server.stream_window_kb",
                                  problems, defaults.stream_window_kb, low=16, high=1 << 20),
    )
    t_raw = read_table(raw, "timeouts", problems)
    check_keys(t_raw, "timeouts", {"join_s", "round_s", "stage_s", "report_s", "max_attempts"},
                problems)
    td = TimeoutConfig()
    timeouts = TimeoutConfig(
        join_s=read_float(t_raw, "join_s", "timeouts.join_s", problems, td.join_s, low=0.1),
        round_s=read_float(t_raw, "round_s", "timeouts.round_s", problems, td.round_s, low=0.1),
        stage_s=read_float(t_raw, "stage_s", "timeouts.stage_s", problems, td.stage_s, low=0.1),
        report_s=read_float(t_raw, "report_s", "timeouts.report_s", problems, td.report_s, low=0.1),
        max_attempts=read_int(t_raw, "max_attempts", "timeouts.max_attempts", problems,
                          default=td.max_attempts, low=1),
    )
    sim_raw = read_table(raw, "simulation", problems)
    check_keys(sim_raw, "simulation", {"data", "init_model"}, problems)
    sim_init = (read_path(sim_raw, "init_model", "simulation", base_dir, Path(), problems)
                if "init_model" in sim_raw else None)
    if sim_init is not None and public is not None and not public.model.init_sha256:
        problems.append("simulation.init_model: the plan names no public initial model "
                        "([model] init_sha256) for the silos to start from")
    sim_data: dict[str, Path] = {}
    data = sim_raw.get("data", {})
    if not isinstance(data, dict):
        problems.append("simulation.data: must be a table mapping silo name to a data folder")
    else:
        for name, folder in data.items():
            if silo_names and name not in silo_names:
                problems.append(f"simulation.data.{shown(name)[1:-1]}: not one of "
                                "federation.silos")
            if path_problem(folder):
                problems.append(f"simulation.data.{shown(name)[1:-1]}: {path_problem(folder)}")
            else:
                sim_data[name] = (base_dir / folder).resolve()

    clustering = read_clustering(read_table(raw, "clustering", problems), problems)
    if "unweighted_sum" in (raw.get("aggregation") or {}):
        problems.append("aggregation.unweighted_sum: not set in a plan; it follows "
                        "clustering.mean_norm")
    elif public is not None and algorithm(public.algorithm).clustered:
        public = replace(public, aggregation=replace(
            public.aggregation, unweighted_sum=clustering.mean_norm == "unweighted"))
    if public is not None and silo_names:
        public = _resolve_aggregation(public, raw.get("aggregation", {}), len(silo_names),
                                      min_silos, problems)
        threshold = public.aggregation.threshold
        check_privacy(public.privacy, public.algorithm, threshold,
                      public.model.norm, problems, public.hetero.align_weight)
        if not problems:
            public = replace(public, privacy=resolve_bits(resolve_noise(
                public.privacy, public.rounds, threshold, problems)))
    if problems:
        raise PlanError(problems, str(source) if source else "plan")
    assert public is not None  # for the type checker: problems would be non-empty otherwise
    return Plan(public=public, min_silos=min_silos, silos=silo_names, server=server,
                timeouts=timeouts, simulation_data=sim_data, simulation_init=sim_init,
                clustering=clustering,
                source=source)


def _public_from_dict(raw: Any, problems: list[str],
                      paths: dict[str, str] | None = None) -> PublicPlan | None:
    paths = paths or {}
    if not isinstance(raw, dict):
        problems.append("public plan: must be an object")
        return None
    before = len(problems)
    fed = raw.get("federation")
    fed_path = paths.get("federation", "federation")
    if fed is None:
        problems.append(f"{fed_path}: required")
    elif not valid_name(fed):
        problems.append(f"{fed_path}: at most {MAX_NAME} letters, digits, '.', '_', '-', "
                        f"starting with a letter or digit (got {shown(fed)})")
    algorithm_name = raw.get("algorithm")
    alg_path = paths.get("algorithm", "algorithm")
    if algorithm_name not in ALGORITHMS:
        problems.append(f"{alg_path}: {shown(algorithm_name)} is not an algorithm; valid choices: "
                        + ", ".join(ALGORITHMS))
    rounds = read_int(raw, "rounds", paths.get("rounds", "rounds"), problems, default=None, low=1,
                      high=limit("federation.rounds"))
    seed = read_int(raw, "seed", paths.get("seed", "seed"), problems, default=1, low=0)
    dataset = raw.get("dataset", "")
    if dataset != "" and not valid_name(dataset):
        problems.append(f"{paths.get('dataset', 'dataset')}: at most {MAX_NAME} letters, digits, "
                        f"'.', '_', '-', starting with a letter or digit (got {shown(dataset)})")
    reference = raw.get("reference_sha256", "")
    if reference != "" and not (isinstance(reference, str) and _SHA256_HEX.fullmatch(reference)):
        problems.append(f"{paths.get('reference_sha256', 'reference_sha256')}: a SHA-256 in 64 "
                        "lowercase hex digits, as `silo data fingerprint` prints it (got "
                        f"{shown(reference)})")
    m_raw = raw.get("model", {})
    t_raw = raw.get("training", {})
    a_raw = raw.get("aggregation", {})
    h_raw = raw.get("hetero", {})
    for name, table in (("model", m_raw), ("training", t_raw), ("aggregation", a_raw),
                        ("fedhgn", h_raw)):
        if not isinstance(table, dict):
            problems.append(f"{name}: must be a table")
    m_raw = m_raw if isinstance(m_raw, dict) else {}
    t_raw = t_raw if isinstance(t_raw, dict) else {}
    a_raw = a_raw if isinstance(a_raw, dict) else {}
    h_raw = h_raw if isinstance(h_raw, dict) else {}
    check_keys(m_raw, "model", set(ModelConfig.__dataclass_fields__), problems)
    check_keys(t_raw, "training", set(TrainingConfig.__dataclass_fields__), problems)
    check_keys(a_raw, "aggregation", set(AggregationConfig.__dataclass_fields__), problems)
    md, tdf, ad = ModelConfig(), TrainingConfig(), AggregationConfig()
    model = ModelConfig(
        hidden=read_int(m_raw, "hidden", "model.hidden", problems, md.hidden, low=1,
                        high=limit("model.hidden")),
        layers=read_int(m_raw, "layers", "model.layers", problems, md.layers, low=1,
                        high=limit("model.layers")),
        dropout=read_float(m_raw, "dropout", "model.dropout", problems, md.dropout, low=0.0,
                       high=0.99),
        n_rw=read_int(m_raw, "n_rw", "model.n_rw", problems, md.n_rw, low=1,
                        high=limit("model.n_rw")),
        n_dg=read_int(m_raw, "n_dg", "model.n_dg", problems, md.n_dg, low=1,
                        high=limit("model.n_dg")),
        width=read_int(m_raw, "width", "model.width", problems, md.width, low=1,
                        high=limit("model.width")),
        norm=str(m_raw.get("norm", md.norm)),
        init_sha256=read_init_sha256(m_raw, "model", algorithm_name, problems),
        frozen=read_frozen(m_raw, "model", algorithm_name, problems),
    )
    if m_raw.get("norm", md.norm) not in MODEL_NORMS:
        problems.append(f"model.norm: {shown(m_raw.get('norm'))} is not a normalisation; valid "
                        "choices: " + ", ".join(MODEL_NORMS))
    training = TrainingConfig(
        lr=read_float(t_raw, "lr", "training.lr", problems, tdf.lr, low=1e-12),
        weight_decay=read_float(t_raw, "weight_decay", "training.weight_decay", problems,
                            tdf.weight_decay, low=0.0),
        batch_size=read_int(t_raw, "batch_size", "training.batch_size", problems, tdf.batch_size,
                            low=1, high=limit("training.batch_size")),
        local_epochs=read_int(t_raw, "local_epochs", "training.local_epochs", problems,
                              tdf.local_epochs, low=1, high=limit("training.local_epochs")),
        split_seed=read_int(t_raw, "split_seed", "training.split_seed", problems, tdf.split_seed,
                        low=0),
        mu=read_float(t_raw, "mu", "training.mu", problems, tdf.mu, low=0.0),
        validation_metric=str(t_raw.get("validation_metric", tdf.validation_metric)),
        average=read_float(t_raw, "average", "training.average", problems, tdf.average,
                           low=0.0, high=0.999),
    )
    if t_raw.get("validation_metric", tdf.validation_metric) not in VALIDATION_METRICS:
        problems.append(f"training.validation_metric: {shown(t_raw.get('validation_metric'))} "
                        "is not a validation metric; valid choices: "
                        + ", ".join(VALIDATION_METRICS))
    aggregation = AggregationConfig(
        clip=read_float(a_raw, "clip", "aggregation.clip", problems, ad.clip, low=1e-9),
        fraction_bits=read_int(a_raw, "fraction_bits", "aggregation.fraction_bits", problems,
                           ad.fraction_bits, low=0, high=52),
        ring_bits=64 if a_raw.get("ring_bits") == "auto" else read_int(
            a_raw, "ring_bits", "aggregation.ring_bits", problems, ad.ring_bits, low=32,
            high=64),
        max_sample_count=read_int(a_raw, "max_sample_count", "aggregation.max_sample_count",
                              problems, ad.max_sample_count, low=1),
        threshold=read_int(a_raw, "threshold", "aggregation.threshold", problems, ad.threshold,
                       low=0),
        neighbours=read_int(a_raw, "neighbours", "aggregation.neighbours", problems,
                        ad.neighbours, low=0),
        unweighted_sum=a_raw.get("unweighted_sum", False) is True,
    )
    if not isinstance(a_raw.get("unweighted_sum", False), bool):
        problems.append("aggregation.unweighted_sum: must be true or false")
    if aggregation.ring_bits not in (32, 64):
        problems.append(f"aggregation.ring_bits: must be 32 or 64, got {aggregation.ring_bits}")
    privacy = read_privacy(raw.get("privacy", {}), problems)
    metrics = read_metrics(raw.get("metrics", {}), problems)
    if algorithm_name in ALGORITHMS:
        check_metrics(metrics, str(algorithm_name), training.validation_metric, privacy,
                      problems)
    hetero = read_hetero(h_raw, algorithm_name in ALGORITHMS
                     and ALGORITHMS[algorithm_name].task == NODE_TASK,
                     problems)
    if (training.average and algorithm_name in ALGORITHMS
            and ALGORITHMS[algorithm_name].task == NODE_TASK):
        problems.append(f"training.average: {algorithm_name} evaluates its model as it is; an "
                        "average over the rounds is for the graph-classification algorithms")
    if (training.validation_metric == "roc_auc" and hetero.classes > 2
            and algorithm_name in ALGORITHMS and ALGORITHMS[algorithm_name].task == NODE_TASK):
        # Graph tasks' class counts are the silos' to know: each refuses at join instead.
        problems.append(f"training.validation_metric: roc_auc needs a binary task; "
                        f"fedhgn.classes is {hetero.classes} (use balanced_acc or acc)")
    if len(problems) > before:
        return None
    return PublicPlan(federation=str(fed), algorithm=str(algorithm_name), rounds=int(rounds or 0),
                      seed=seed, model=model, training=training, aggregation=aggregation,
                      hetero=hetero, privacy=privacy, dataset=str(dataset),
                      reference_sha256=str(reference), metrics=metrics)


def default_threshold(holders: int) -> int:
    """A majority of a silo's share holders: the smallest t for which 2t > holders."""
    return holders // 2 + 1


def _resolve_aggregation(public: PublicPlan, a_raw: Any, n_silos: int, min_silos: int,
                         problems: list[str]) -> PublicPlan:
    """Pick the ring for "auto", fill in the threshold, and check both against the silo count."""
    from trellis.crypto.errors import EncodingError
    from trellis.crypto.fixedpoint import FixedPointSpec

    agg = public.aggregation
    auto_ring = isinstance(a_raw, dict) and a_raw.get("ring_bits") == "auto"
    rings = (32, 64) if auto_ring else (agg.ring_bits,)
    if public.privacy.enabled:
        # A Poisson sample has no largest size and the noise no largest value: only the 64-bit
        # ring leaves room that a private sum cannot reach in practice (to_ring refuses beyond).
        if not auto_ring and agg.ring_bits != 64:
            problems.append(f"aggregation.ring_bits: a private plan needs the 64-bit ring (a "
                            f"noisy sum of Poisson-sampled gradients has no bound that "
                            f"{agg.ring_bits} bits are sure to hold); set 64 or \"auto\"")
        rings = (64,)
    errors = []
    for ring in rings:
        try:
            FixedPointSpec(agg.clip, agg.fraction_bits, ring,
                           agg.max_sample_count).check_capacity(n_silos)
        except EncodingError as exc:
            errors.append(str(exc))
            continue
        overflow = capacity_problem(public.metrics, ring, n_silos, agg.max_sample_count)
        if overflow:       # the summed evaluation counts need their room too
            errors.append(overflow)
            continue
        agg = replace(agg, ring_bits=ring)
        break
    else:
        problems.append(f"aggregation: {errors[-1]}")
    holders = n_silos if agg.neighbours == 0 or agg.neighbours >= n_silos - 1 else (
        agg.neighbours + 1)
    if agg.neighbours % 2:
        problems.append(f"aggregation.neighbours: must be 0 (full graph) or even, got "
                        f"{agg.neighbours}")
    if agg.threshold == 0:
        agg = replace(agg, threshold=default_threshold(holders))
    t = agg.threshold
    if algorithm(public.algorithm).aggregates:
        if 2 * t <= holders:
            problems.append(f"aggregation.threshold: {t} must exceed half of the {holders} "
                            "silos holding each silo's key shares, or two disjoint groups "
                            "could each unmask a silo (Bonawitz et al. 2017, §4)")
        if t > min_silos:
            problems.append(f"aggregation.threshold: {t} exceeds federation.min_silos "
                            f"({min_silos}): a round with the minimum number of silos could "
                            "never unmask")
    return replace(public, aggregation=agg)
