"""Privacy accounting: dp-accounting for the Gaussian, a port of the distributed discrete Gaussian.

The continuous Gaussian (Poisson-subsampled) is dp-accounting's, in RDP and PLD. The distributed
discrete Gaussian (DDG: the sum of n honest N_Z(0, sigma_l^2) shares) has no library event: its
RDP is Kairouz, Liu, Steinke (ICML'21, arXiv 2102.06387) Proposition 14 / Eq. 17, subsampled by
the general upper bound of Zhu & Wang (ICML'19, "Poisson subsampled Renyi differential privacy",
Theorem 9), as in google-research/federated:distributed_dp/accounting_utils.py (read, not
copied). A PrivacyLedger sums per-round RDP curves over one fixed list of integer orders.

dp-accounting (and the scipy it brings) is the `privacy` extra, which the `silo` extra includes:
a coordinator that serves no private plan runs without it. This module imports without it, and
so do the events and the DDG bound; only an epsilon needs the library, and raises
AccountantMissing, naming the extra, where it is absent.

Two accountants, named by the plan's `privacy.accountant`: "rdp" (the above; what a plan that
names none gets, so its noise and hash stay what they were) and "pld", the tight one
(crypto/dp_pld.py): the DDG as a post-processed Gaussian up to a max-divergence slack, composed
by privacy-loss distributions; the continuous Gaussian's own PLD for a local-gaussian event.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from importlib.metadata import PackageNotFoundError, version

import numpy as np

from trellis.crypto.dp_encoding import DdgEncoding
from trellis.crypto.dp_pld import SMOOTHING, pld_epsilon, reduce_discrete_noise
from trellis.crypto.errors import CryptoError

# Integer orders: Zhu & Wang's bound sums over integer l <= alpha. Those of the reference file.
ORDERS: tuple[int, ...] = tuple(range(2, 129)) + (256,)
MECHANISMS = ("ddg", "local-gaussian")
ACCOUNTANTS = ("rdp", "pld")


def _library_version() -> str:
    try:
        return version("dp-accounting")
    except PackageNotFoundError:
        return "missing"


# What the audit logs name as the accountant of every epsilon they record.
ACCOUNTANT_VERSION = (f"dp-accounting {_library_version()} RDP; ddg: Kairouz et al. 2021 "
                      "Prop. 14, Poisson-subsampled by Zhu & Wang 2019")
PLD_ACCOUNTANT_VERSION = (f"dp-accounting {_library_version()} PLD; ddg: trellis dp_pld 1, "
                          f"the shares' sum as K(Gaussian), smoothing {SMOOTHING:g}, "
                          "docs/privacy.md")


def accountant_version(accountant: str) -> str:
    """What the audit logs name as the accountant `accountant` ("rdp" or "pld")."""
    return PLD_ACCOUNTANT_VERSION if accountant == "pld" else ACCOUNTANT_VERSION


class AccountingError(CryptoError):
    """A privacy event or ledger is malformed, or a target cannot be met."""


# How to install the accountant, as every refusal for want of it says.
PRIVACY_EXTRA = "pip install 'trellis-fgl[privacy]'"


class AccountantMissing(AccountingError):
    """dp-accounting does not import here: the message names the extra that installs it."""


def require_accountant() -> None:
    """Raise AccountantMissing unless dp-accounting imports (a second to load, the first time)."""
    try:
        import dp_accounting.dp_event  # noqa: F401
        import dp_accounting.pld  # noqa: F401
        import dp_accounting.rdp  # noqa: F401
    except ImportError as exc:
        # Only an ImportError: a library that is there but fails otherwise is a bug to see.
        raise AccountantMissing(f"epsilon accounting needs dp-accounting, which does not "
                                f"import here ({exc}); install the privacy extra: "
                                f"{PRIVACY_EXTRA}") from None


def gaussian_rdp(noise_multiplier: float, q: float, steps: int,
                 orders: Sequence[int] = ORDERS) -> np.ndarray:
    """RDP curve of `steps` Poisson-subsampled Gaussians (dp-accounting's tight bound)."""
    require_accountant()
    from dp_accounting import dp_event, rdp  # here: a second to load

    accountant = rdp.RdpAccountant(list(orders))
    event = dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(noise_multiplier))
    accountant.compose(event, steps)
    return np.asarray(accountant.rdp, dtype=np.float64)


def gaussian_epsilon_pld(noise_multiplier: float, q: float, steps: int, delta: float,
                         discretization: float = 1e-4) -> float:
    """Epsilon of the Poisson-subsampled Gaussian by privacy-loss distributions (tighter)."""
    require_accountant()
    from dp_accounting import dp_event, pld

    accountant = pld.PLDAccountant(value_discretization_interval=discretization)
    event = dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(noise_multiplier))
    accountant.compose(event, steps)
    return float(accountant.get_epsilon(delta))


def epsilon_from_rdp(curve: np.ndarray, delta: float, orders: Sequence[int] = ORDERS) -> float:
    """(epsilon at delta) from an RDP curve, by dp-accounting's conversion (Balle et al. 2020)."""
    require_accountant()
    from dp_accounting import rdp

    return float(rdp.rdp_privacy_accountant.compute_epsilon(list(orders), list(curve), delta)[0])


def ddg_tau(local_sigma2: float, honest_shares: int) -> float:
    """Kairouz Thm 1's tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma_l^2 k / (k + 1))."""
    return 10.0 * sum(math.exp(-2 * math.pi**2 * local_sigma2 * k / (k + 1))
                      for k in range(1, honest_shares))


def ddg_unsampled_rdp(l2_sensitivity: float, l1_sensitivity: float, local_sigma2: float,
                      honest_shares: int, dim: int) -> Callable[[int], float]:
    """alpha -> RDP of one unsampled DDG release (Kairouz Prop. 14, min of three terms)."""
    if honest_shares < 1 or local_sigma2 <= 0:
        return lambda alpha: math.inf  # no honest noise: no privacy
    central = math.sqrt(honest_shares * local_sigma2)
    l2, l1 = l2_sensitivity / central, l1_sensitivity / central
    tau = ddg_tau(local_sigma2, honest_shares)

    def epsilon(alpha: int) -> float:
        return min(alpha / 2 * l2**2 + tau * dim,
                   alpha / 2 * (l2**2 + 2 * l1 * tau + tau**2 * dim),
                   alpha / 2 * (l2 + math.sqrt(dim) * tau) ** 2)
    return epsilon


def _logsumexp(terms: np.ndarray) -> float:
    """log(sum(exp(terms))), stable, numpy only."""
    top = float(np.max(terms))
    return top if math.isinf(top) else top + math.log(float(np.sum(np.exp(terms - top))))


def subsampled_rdp(epsilon: Callable[[int], float], q: float,
                   orders: Sequence[int] = ORDERS) -> np.ndarray:
    """RDP at each integer order after Poisson subsampling at rate q (Zhu & Wang Thm 9, min'd)."""
    unsampled = np.array([epsilon(int(a)) for a in orders], dtype=np.float64)
    if q == 1:
        return unsampled
    if q == 0:
        return np.zeros(len(orders))
    top = max(int(a) for a in orders)
    eps_l = np.array([0.0, 0.0] + [epsilon(ell) for ell in range(2, top + 1)])
    log_q, log_1q = math.log(q), math.log1p(-q)
    out = []
    for alpha, plain in zip(orders, unsampled, strict=True):
        a = int(alpha)
        ell = np.arange(3, a + 1)
        log_comb = np.array([math.lgamma(a + 1) - math.lgamma(k + 1) - math.lgamma(a - k + 1)
                             for k in ell])
        terms = np.concatenate([
            [(a - 1) * log_1q + math.log(a * q - q + 1),
             math.log(a * (a - 1) / 2) + 2 * log_q + (a - 2) * log_1q + eps_l[2]],
            math.log(3) + log_comb + (a - ell) * log_1q + ell * log_q + (ell - 1) * eps_l[ell],
        ])
        out.append(min(_logsumexp(terms) / (a - 1), plain))
    return np.array(out, dtype=np.float64)


@dataclass(frozen=True)
class RoundEvent:
    """One round's release: its mechanism, noise, sampling rate and number of steps."""

    mechanism: str                 # "ddg" or "local-gaussian" (each silo adds the full noise)
    q: float                       # Poisson sampling rate of a record (1: silo level)
    steps: int = 1
    noise_multiplier: float = 0.0  # local-gaussian: std / L2 sensitivity
    local_sigma2: float = 0.0      # ddg: one share's sigma_l^2, integer units
    honest_shares: int = 0         # ddg: honest noise shares that actually reached the sum
    l2_sensitivity: float = 0.0    # ddg: Delta2, integer units
    l1_sensitivity: float = 0.0    # ddg: Delta1, integer units
    dim: int = 0                   # ddg: vector length

    def __post_init__(self) -> None:
        # Plain floats and ints only (a Fraction sigma_l^2 from DdgEncoding is not JSON).
        for name in ("q", "noise_multiplier", "local_sigma2", "l2_sensitivity", "l1_sensitivity"):
            object.__setattr__(self, name, float(getattr(self, name)))
        for name in ("steps", "honest_shares", "dim"):
            object.__setattr__(self, name, int(getattr(self, name)))
        if self.mechanism not in MECHANISMS:
            raise AccountingError(f"mechanism must be one of {', '.join(MECHANISMS)}")
        if not 0 <= self.q <= 1 or self.steps < 0 or self.noise_multiplier < 0:
            raise AccountingError("need 0 <= q <= 1, steps >= 0 and noise_multiplier >= 0")
        if self.mechanism == "ddg" and (self.dim < 1 or self.l2_sensitivity <= 0
                                        or self.l1_sensitivity <= 0 or self.local_sigma2 < 0
                                        or self.honest_shares < 0):
            raise AccountingError("a ddg event needs dim, l2/l1 sensitivities > 0, sigma >= 0")

    def rdp(self, orders: Sequence[int] = ORDERS) -> np.ndarray:
        """RDP curve of this event over `orders`."""
        if self.steps == 0 or self.q == 0:
            return np.zeros(len(orders))
        if self.mechanism == "local-gaussian":
            if self.noise_multiplier == 0:
                return np.full(len(orders), math.inf)
            return gaussian_rdp(self.noise_multiplier, self.q, self.steps, orders)
        one = ddg_unsampled_rdp(self.l2_sensitivity, self.l1_sensitivity, self.local_sigma2,
                                self.honest_shares, self.dim)
        return self.steps * subsampled_rdp(one, self.q, orders)

    def gaussian_release(self) -> tuple[float, float, int, float]:
        """(z, q, steps, slack per step) of the Gaussian this event is accounted as by "pld"."""
        if self.mechanism == "local-gaussian":
            return self.noise_multiplier, self.q, self.steps, 0.0
        ideal = reduce_discrete_noise(self.local_sigma2, self.honest_shares,
                                      self.l2_sensitivity, self.dim)
        return ideal.noise_multiplier, self.q, self.steps, ideal.slack


def ddg_event(encoding: DdgEncoding, honest_shares: int, q: float, steps: int = 1) -> RoundEvent:
    """The event of one DDG release encoded by `encoding`, with the honest shares that survived."""
    return RoundEvent("ddg", q, steps, local_sigma2=float(encoding.local_sigma2),
                      honest_shares=honest_shares, l2_sensitivity=encoding.l2_sensitivity,
                      l1_sensitivity=encoding.l1_sensitivity, dim=encoding.dim)


class PrivacyLedger:
    """Rounds spent so far, composed by `accountant`: RDP curves summed ("rdp") or privacy-loss
    distributions ("pld"); JSON-serialisable."""

    def __init__(self, events: Sequence[RoundEvent] = (), orders: Sequence[int] = ORDERS,
                 accountant: str = "rdp") -> None:
        if accountant not in ACCOUNTANTS:
            raise AccountingError(f"accountant must be one of {', '.join(ACCOUNTANTS)}")
        self.orders = tuple(int(a) for a in orders)
        self.accountant = accountant
        self.events: list[RoundEvent] = []
        self._rdp = np.zeros(len(self.orders))
        for event in events:
            self.record(event)

    def record(self, event: RoundEvent) -> None:
        """Add one round's release."""
        if self.accountant == "rdp":
            self._rdp = self._rdp + event.rdp(self.orders)
        self.events.append(event)

    def _epsilon_with(self, more: Sequence[RoundEvent], delta: float) -> float:
        """Epsilon at delta of everything recorded and `more`."""
        if self.accountant == "pld":
            require_accountant()
            return pld_epsilon([e.gaussian_release() for e in (*self.events, *more)], delta)
        curve = self._rdp + sum((e.rdp(self.orders) for e in more), np.zeros(len(self.orders)))
        return epsilon_from_rdp(curve, delta, self.orders)

    def epsilon(self, delta: float) -> float:
        """Epsilon at delta of everything recorded."""
        return self._epsilon_with((), delta)

    def would_exceed(self, event: RoundEvent, max_epsilon: float, delta: float) -> bool:
        """Whether recording `event` would take epsilon at delta beyond max_epsilon."""
        return self._epsilon_with((event,), delta) > max_epsilon

    def projected(self, event: RoundEvent, rounds: int, delta: float) -> float:
        """Epsilon at delta if `rounds` more rounds like `event` were recorded."""
        return self._epsilon_with((replace(event, steps=event.steps * rounds),), delta)

    def to_json(self) -> str:
        """The ledger as JSON (orders, accountant and events; curves are recomputed on load)."""
        return json.dumps({"version": 1, "orders": list(self.orders),
                           "accountant": self.accountant,
                           "events": [asdict(e) for e in self.events]}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> PrivacyLedger:
        """Rebuild a ledger from `to_json`'s text (one written before "pld" existed is "rdp")."""
        try:
            raw = json.loads(text)
            if raw.get("version") != 1:
                raise AccountingError("unknown ledger version")
            return cls([RoundEvent(**e) for e in raw["events"]], raw["orders"],
                       raw.get("accountant", "rdp"))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise AccountingError(f"malformed privacy ledger: {exc}") from None


def projected_epsilon(plan: Sequence[RoundEvent], delta: float,
                      orders: Sequence[int] = ORDERS, accountant: str = "rdp") -> float:
    """Epsilon at delta of a planned sequence of rounds."""
    return PrivacyLedger(plan, orders, accountant).epsilon(delta)


def noise_multiplier_for(target_epsilon: float, delta: float, q: float, steps: int,
                         mechanism: str = "local-gaussian", *, l2_sensitivity: float = 1.0,
                         l1_sensitivity: float = 1.0, dim: int = 1, honest_shares: int = 1,
                         tolerance: float = 1e-4, accountant: str = "rdp") -> float:
    """Smallest z (central std / Delta2) whose plan meets target_epsilon, by bisection."""
    def epsilon(z: float) -> float:
        if mechanism == "ddg":
            sigma2 = (z * l2_sensitivity) ** 2 / honest_shares
            event = RoundEvent("ddg", q, steps, local_sigma2=sigma2, honest_shares=honest_shares,
                               l2_sensitivity=l2_sensitivity, l1_sensitivity=l1_sensitivity,
                               dim=dim)
        else:
            event = RoundEvent(mechanism, q, steps, noise_multiplier=z)
        return projected_epsilon([event], delta, accountant=accountant)

    low, high = 0.0, 1.0
    while epsilon(high) > target_epsilon:
        low, high = high, high * 2
        if high > 1e6:
            raise AccountingError(f"no noise multiplier up to 1e6 reaches epsilon "
                                  f"{target_epsilon} at delta {delta}")
    while high - low > tolerance * high:
        mid = (low + high) / 2
        low, high = (mid, high) if epsilon(mid) > target_epsilon else (low, mid)
    return high
