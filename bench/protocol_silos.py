"""Protocol-only silos for load tests: many real silos in one process, none of them training.

Each silo is the agent of `silo join` (silo/federation/agent.py): its own certificate and TLS
channel, the real wire protocol, key agreement, Shamir shares, masking and audit log. Only the
model is missing: a synthetic trainer stands in for it and contributes a fixed pseudo-random vector
of the asked length, so a 2-core machine can host hundreds of silos, a few dozen per process
(bench/secagg_scale.py starts several of these processes).

A silo named in ``--drop`` leaves in round 1 after it has sent its key shares (its stream and
channel close, as when the process dies), which is the dropout secure aggregation must survive.

    python bench/protocol_silos.py --target 127.0.0.1:PORT --identities DIR --state DIR \
        --length D --silos silo-000 silo-001 ... [--drop silo-001]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trellis.crypto.pki import load_identity  # noqa: E402
from trellis.silo.federation.agent import SiloAgent  # noqa: E402
from trellis.silo.federation.session import SiloSession  # noqa: E402

DROP_ROUND = 1


class Dropped(Exception):
    """Raised inside a dropping silo once its shares are out: ends its agent like a crash."""


def synthetic_vector(silo: str, length: int) -> np.ndarray:
    """The silo's contribution: values in [-1, 1) drawn from a seed named after the silo."""
    seed = int.from_bytes(silo.encode(), "little") % (2**63)
    return np.random.default_rng(seed).uniform(-1.0, 1.0, length).astype(np.float32)


def synthetic_weight(silo: str) -> int:
    """The silo's aggregation weight (its 'training set size'): 1 to 100, from its name."""
    return 1 + sum(silo.encode()) % 100


class SyntheticTrainer:
    """The trainer surface SiloSession uses, with a fixed vector instead of a model."""

    def __init__(self, silo: str, length: int, drop: bool) -> None:
        self.silo = silo
        self.device = "cpu"                  # where the driver says a round's step ran
        self.layout = SimpleNamespace(length=length)
        self.num_train = synthetic_weight(silo)
        self.update_statistics: dict[str, float] = {}
        self.last_update = None
        self.drop = drop
        self.rounds_trained = 0
        self.received: list[float] = []      # the first value of each global state received
        self._vector = synthetic_vector(silo, length)

    def get_shared(self) -> np.ndarray:
        """The fixed vector."""
        return self._vector

    def upload_vector(self) -> np.ndarray:
        """The fixed vector (what the silo masks and uploads)."""
        return self._vector

    def set_shared(self, vector: np.ndarray) -> None:
        """Keep a fingerprint of the global state the coordinator sent."""
        self.received.append(float(np.asarray(vector)[0]))

    def train(self) -> dict[str, float]:
        """No training; a dropping silo leaves here, after its shares went out."""
        self.rounds_trained += 1
        if self.drop and self.rounds_trained == DROP_ROUND:
            raise Dropped(self.silo)
        return {"train_loss": 0.0}

    def metrics(self, names: Any) -> dict[str, float]:
        """Zeros: there is no model to evaluate."""
        return {name: 0.0 for name in names}

    def snapshot(self) -> dict[str, Any]:
        """Nothing to keep between attempts."""
        return {}

    def final_snapshot(self) -> dict[str, Any]:
        """Nothing to keep as a final model."""
        return {}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Nothing to restore."""

    def model_recipe(self) -> dict[str, Any]:
        """No model."""
        return {}


_PRINTING = threading.Lock()


def run_silo(target: str, identities: Path, state: Path, silo: str, length: int, drop: bool,
             outcome: dict[str, str]) -> None:
    """Run one protocol-only silo to the end; record how it ended and print it at once (the
    harness stops the run at the first failure instead of waiting out the coordinator's
    timeouts for a silo that will never come)."""
    try:
        identity = load_identity(identities / silo)
        session = SiloSession(identity, lambda plan: SyntheticTrainer(silo, length, drop))
        agent = SiloAgent(target, identity, session, state / silo,
                          connect_timeout_s=600.0, log=lambda line: None)
        agent.run()
        outcome[silo] = "finished"
    except Dropped:
        outcome[silo] = "dropped"
    except Exception as exc:  # reported to the harness, which fails the run
        outcome[silo] = f"failed: {type(exc).__name__}: {exc}"
    with _PRINTING:
        print(json.dumps({silo: outcome[silo]}), flush=True)


def main() -> None:
    """Run the named silos in threads until each has finished, dropped or failed; one line
    per silo (a JSON object: its name and how it ended) as each ends."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--identities", type=Path, required=True, help="a folder per silo")
    parser.add_argument("--state", type=Path, required=True, help="state folders go here")
    parser.add_argument("--length", type=int, required=True)
    parser.add_argument("--silos", nargs="+", required=True)
    parser.add_argument("--drop", nargs="*", default=[])
    args = parser.parse_args()
    outcome: dict[str, str] = {}
    threads = [threading.Thread(target=run_silo, name=silo, daemon=True,
                                args=(args.target, args.identities, args.state, silo, args.length,
                                      silo in args.drop, outcome))
               for silo in args.silos]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
