"""The plan's [privacy] table: differential privacy of what silos share (docs/privacy.md).

Off unless `mechanism` is set. The table is public: every silo receives it, checks it against
its own policy (silo/privacy/dp_policy.py) and accounts its own epsilon from it and from its own
number of graphs. Nothing here decides a silo's noise or samples: those use the silo's private
randomness.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from trellis.protos.algorithms import NODE_TASK, algorithm
from trellis.protos.fields import check_keys, read_float, read_int, shown

# "ddg": each silo adds a discrete Gaussian share to its integer vector; only the secure sum
# carries the full noise. "local-gaussian": each silo adds the full noise itself (trusts no
# peer and needs no secure aggregation, at about sqrt(n) times the noise in the sum).
MECHANISMS = ("ddg", "local-gaussian")
# "record": one graph; "silo": a silo's whole update (weak below about a hundred silos).
UNITS = ("record", "silo")
# "rdp": Kairouz et al.'s bound for ddg, subsampled by Zhu & Wang's general bound (what a plan
# naming none gets: its noise and hash stay what they were); "pld": the tight accountant,
# privacy-loss distributions over the shares' sum (crypto/dp_pld.py, docs/privacy.md).
ACCOUNTANTS = ("rdp", "pld")
DEFAULT_ACCOUNTANT = "rdp"
SILO_LEVEL_ADVISED = 100
# Integer units per clip norm are 2^bits: below 8 the stochastic rounding's inflation of the
# sensitivity (sqrt(d)) dominates; above 24 sums of many silos approach the ring's range.
BITS_RANGE = (8, 24)
DEFAULT_BITS = 16
# The integer sensitivity the plan's own projections take for one coordinate (2^16 units): each
# silo accounts with its real one, which differs only in the rounding's small share.
REFERENCE_SENSITIVITY = float(2 ** DEFAULT_BITS)
# Rounding adds sqrt(d) to the sensitivity 2^bits: allowed for up to 10 % of it when the bits
# are chosen (d up to 167k at 12 bits, 2.7M at 14).
_ROUNDING_ALLOWANCE = 1.1

# What a plan file's [privacy] table gets for the fields it leaves out: the recipe of
# docs/privacy.md#the-recipe (searched for FedStar on NCI1 over 5 silos, bench/dp_accuracy.py).
# The dataclass's own defaults below stay the wire's: a public plan that names no accountant
# means "rdp", as it did before the recipe, so its hash and its noise stay what they were.
# The accountant for every private plan; the rest for record level, where it was searched.
RECIPE_ACCOUNTANT = "pld"
RECIPE_RECORD_DEFAULTS: dict[str, Any] = {"batch": 128, "server_lr": 0.3, "server_momentum": 0.9}
# The local slice's Adam step under record-level privacy, when [training] names no lr.
RECIPE_TRAINING_LR = 0.01
# The model's dropout under record-level privacy, when [model] names none: the noise already
# regularises, and without dropout the recipe gained at epsilon 8 at 11 of 15 paired seeds (+0.7
# to +1.2 points over three sets of draws) and lost nothing at 4 (docs/privacy.md).
RECIPE_MODEL_DROPOUT = 0.0


def with_recipe_defaults(privacy: Any, training: Any, model: Any) -> tuple[Any, Any, Any]:
    """A plan file's [privacy], [training] and [model] tables, the recipe filling what a
    private plan leaves out (a plan without privacy, or a malformed table, is returned as it
    is)."""
    if not isinstance(privacy, dict) or not privacy.get("mechanism"):
        return privacy, training, model
    privacy = {"accountant": RECIPE_ACCOUNTANT, **privacy}
    if privacy.get("unit", "record") != "record":
        return privacy, training, model
    privacy = {**RECIPE_RECORD_DEFAULTS, **privacy}
    if isinstance(training, dict) and "lr" not in training:
        training = {**training, "lr": RECIPE_TRAINING_LR}
    if isinstance(model, dict) and "dropout" not in model:
        model = {**model, "dropout": RECIPE_MODEL_DROPOUT}
    return privacy, training, model


@dataclass(frozen=True)
class PrivacyConfig:
    """How the shared tensors are made differentially private (all public)."""

    mechanism: str = ""              # "" : no differential privacy
    unit: str = "record"
    epsilon: float = 0.0             # target over the plan's rounds, for `design_graphs`
    delta: float = 1e-5
    noise_multiplier: float = 0.0    # z of the aggregate; 0 in a plan file: from `epsilon`
    clip: float = 1.0                # L2 bound of one record's (or one silo's) contribution
    # Integer units per clip norm: scale = 2^bits / clip. 0 in a plan file: chosen once z is
    # known (`resolve_bits`).
    bits: int = 0
    batch: int = 32                  # expected graphs per silo and round (Poisson sampling)
    design_graphs: int = 0           # training graphs the projection assumes for a silo
    colluders: int = 0               # silos assumed to pool their noise with the coordinator
    server_lr: float = 1.0           # step the coordinator applies to the mean noisy update
    server_momentum: float = 0.0
    accountant: str = DEFAULT_ACCOUNTANT  # how epsilon is accounted, by the plan and the silos

    @property
    def enabled(self) -> bool:
        """Whether the plan asks for differential privacy at all."""
        return bool(self.mechanism)

    @property
    def scale(self) -> float:
        """Integer units per unit of the clipped vector (the rounding's scale)."""
        return float(2 ** (self.bits or DEFAULT_BITS)) / self.clip

    def sampling_rate(self, graphs: int) -> float:
        """The Poisson rate a silo with `graphs` training graphs samples each round at."""
        if self.unit == "silo":
            return 1.0
        return min(1.0, self.batch / max(graphs, 1))

    def honest_shares(self, threshold: int) -> int:
        """Noise shares every unmaskable sum is guaranteed to hold from honest silos."""
        return max(threshold - self.colluders, 1) if self.mechanism == "ddg" else 1


FIELDS = set(PrivacyConfig.__dataclass_fields__)


def read_privacy(raw: Any, problems: list[str], path: str = "privacy") -> PrivacyConfig:
    """The [privacy] table's fields, each checked on its own (cross-checks: check_privacy)."""
    if not isinstance(raw, dict):
        problems.append(f"{path}: must be a table")
        return PrivacyConfig()
    check_keys(raw, path, FIELDS, problems)
    d = PrivacyConfig()
    mechanism = raw.get("mechanism", d.mechanism)
    if mechanism not in ("", *MECHANISMS):
        problems.append(f"{path}.mechanism: {shown(mechanism)} is not a mechanism; valid: "
                        + ", ".join(MECHANISMS))
    unit = raw.get("unit", d.unit)
    if unit not in UNITS:
        problems.append(f"{path}.unit: {shown(unit)} is not a privacy unit; valid: "
                        + ", ".join(UNITS))
    accountant = raw.get("accountant", d.accountant)
    if accountant not in ACCOUNTANTS:
        problems.append(f"{path}.accountant: {shown(accountant)} is not an accountant; valid: "
                        + ", ".join(ACCOUNTANTS))
    config = PrivacyConfig(
        mechanism=str(mechanism), unit=str(unit), accountant=str(accountant),
        epsilon=read_float(raw, "epsilon", f"{path}.epsilon", problems, d.epsilon, low=0.0),
        delta=read_float(raw, "delta", f"{path}.delta", problems, d.delta, low=1e-300,
                         high=0.1),
        noise_multiplier=read_float(raw, "noise_multiplier", f"{path}.noise_multiplier",
                                    problems, d.noise_multiplier, low=0.0, high=1e4),
        clip=read_float(raw, "clip", f"{path}.clip", problems, d.clip, low=1e-6, high=1e6),
        bits=read_int(raw, "bits", f"{path}.bits", problems, d.bits, low=0,
                      high=BITS_RANGE[1]),
        batch=read_int(raw, "batch", f"{path}.batch", problems, d.batch, low=1),
        design_graphs=read_int(raw, "design_graphs", f"{path}.design_graphs", problems,
                               d.design_graphs, low=0),
        colluders=read_int(raw, "colluders", f"{path}.colluders", problems, d.colluders,
                           low=0),
        server_lr=read_float(raw, "server_lr", f"{path}.server_lr", problems, d.server_lr,
                             low=1e-9),
        server_momentum=read_float(raw, "server_momentum", f"{path}.server_momentum",
                                   problems, d.server_momentum, low=0.0, high=0.999),
    )
    if config.bits and config.bits < BITS_RANGE[0]:
        problems.append(f"{path}.bits: must be 0 (chosen from the noise) or between "
                        f"{BITS_RANGE[0]} and {BITS_RANGE[1]}, got {config.bits}")
    if config.enabled and not (config.epsilon > 0 or config.noise_multiplier > 0):
        problems.append(f"{path}: set epsilon (the target the noise is calibrated to) or "
                        "noise_multiplier")
    return config


def check_privacy(privacy: PrivacyConfig, algorithm_name: str, threshold: int,
                  model_norm: str, problems: list[str], align_weight: float = 0.0) -> None:
    """What the table asks must fit the algorithm and the secure-aggregation threshold."""
    if not privacy.enabled:
        return
    row = algorithm(algorithm_name)
    if row.clustered:
        problems.append(f"privacy.mechanism: {algorithm_name} clusters silos by their plain "
                        "update statistics or similarities, which no noise covers; choose an "
                        "algorithm that only sums (fedstar, feddense, fedavg, fedprox, local)")
    if row.task == NODE_TASK and privacy.unit != "silo":
        problems.append(f"privacy.unit: {algorithm_name} learns on one graph per silo, whose "
                        "nodes enter their neighbours' losses, so clipping one record bounds "
                        "nothing; use unit = \"silo\"")
    if row.task == NODE_TASK and privacy.unit == "silo" and not row.aggregates:
        problems.append(f"privacy: {algorithm_name} shares nothing; there is nothing to noise")
    if not row.aggregates and privacy.mechanism == "ddg":
        problems.append(f"privacy.mechanism: {algorithm_name} aggregates nothing, so no "
                        "secure sum can carry distributed noise; use \"local-gaussian\"")
    if not row.aggregates and privacy.unit == "silo":
        problems.append(f"privacy.unit: {algorithm_name} shares nothing; silo-level privacy "
                        "protects a silo's shared update, so use unit = \"record\"")
    if row.exchanges_envelopes and align_weight != 0:
        problems.append(f"fedhgn.align_weight: {algorithm_name}'s sealed coefficient envelopes "
                        "would reach every silo without noise, so a private federation swaps "
                        "none and trains without the alignment they feed; set "
                        "fedhgn.align_weight = 0 to say so")
    if privacy.unit == "record" and model_norm == "batch" and row.model == "dual_dense_gin":
        problems.append("model.norm: BatchNorm mixes the graphs of a batch, so one graph's "
                        "gradient is not bounded by clipping; set norm = \"layer\" with "
                        "record-level privacy")
    if privacy.mechanism == "ddg" and privacy.colluders >= threshold:
        problems.append(f"privacy.colluders: {privacy.colluders} must be below the "
                        f"secure-aggregation threshold {threshold}, or a sum could hold no "
                        "honest noise")
    if privacy.unit == "record" and row.aggregates and privacy.design_graphs == 0:
        problems.append("privacy.design_graphs: required with record-level privacy: the number "
                        "of training graphs the projected epsilon assumes for a silo (each "
                        "silo accounts its own)")


def resolve_noise(privacy: PrivacyConfig, rounds: int, threshold: int,
                  problems: list[str]) -> PrivacyConfig:
    """Calibrate the noise multiplier to the target epsilon when the plan leaves it at 0."""
    if not privacy.enabled or privacy.noise_multiplier > 0:
        return privacy
    from trellis.crypto.dp_accountant import AccountantMissing, noise_multiplier_for

    rate = privacy.sampling_rate(privacy.design_graphs or 1)
    try:
        # ddg at a realistic integer scale: at a sensitivity of 1 unit the discrete Gaussian is
        # nothing like the continuous one and the bound would ask for ten times the noise.
        z = noise_multiplier_for(privacy.epsilon, privacy.delta, rate, rounds,
                                 mechanism=privacy.mechanism,
                                 l2_sensitivity=REFERENCE_SENSITIVITY,
                                 l1_sensitivity=REFERENCE_SENSITIVITY,
                                 accountant=privacy.accountant)
    except AccountantMissing as exc:   # a coordinator installed without the privacy extra
        problems.append(f"privacy.epsilon: calibrating the noise to it: {exc}")
        return privacy
    except ValueError as exc:
        problems.append(f"privacy.epsilon: cannot be reached: {exc}")
        return privacy
    return replace(privacy, noise_multiplier=round(z, 4) + 1e-4)


def resolve_bits(privacy: PrivacyConfig) -> PrivacyConfig:
    """Choose `bits` when the plan leaves it at 0: the most (finest rounding, up to 16) whose
    noise stays within the exact sampler's fast integer path; fewer only cost the rounding's
    share of the sensitivity, sqrt(d) / 2^bits."""
    if not privacy.enabled or privacy.bits:
        return privacy
    from trellis.crypto.discrete_gaussian import VECTOR_MAX_SIGMA2

    largest_sigma = VECTOR_MAX_SIGMA2 ** 0.5
    bits = DEFAULT_BITS
    while bits > BITS_RANGE[0] and (
            privacy.noise_multiplier * _ROUNDING_ALLOWANCE * 2 ** bits > largest_sigma):
        bits -= 1
    return replace(privacy, bits=bits)
