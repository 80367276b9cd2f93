"""Secure aggregation, ours against Flower's SecAgg+, in one process on the same inputs.

For each n (silos), d (float32 values) and dropout fraction (silos that vanish after the share
stage), one full aggregation runs through Trellis's protocol (crypto/secagg_local.py: the same
client and server objects as a real federation, with real certificates, a cryptographic PRG and
a 32-bit ring) and through Flower's own SecAgg+ code (the ``secaggplus_mod`` client mod and the
``SecAggPlusWorkflow`` server workflow, driven by an in-memory grid) with the same n, d,
threshold and neighbour count (full graph). Both aggregates are checked against the plain sum.

Printed per setting: per-silo compute seconds (mean over silos that sent a masked input),
coordinator compute seconds, bytes uploaded per silo (payload bytes) and the ratios to Flower.
``upload_ratio`` is our upload per silo divided by (plain float32 vector + our sealed shares).

Flower 1.42 pins protobuf < 7 while Trellis needs protobuf 7, so Flower runs from its own
environment: ``make bench-secagg`` builds ``.venv-bench`` (bench/requirements-flower.txt) and runs
this file with the repository on PYTHONPATH; Trellis's crypto/ needs only numpy and cryptography.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trellis.crypto.fixedpoint import FixedPointSpec  # noqa: E402
from trellis.crypto.keyagreement import RoundContext  # noqa: E402
from trellis.crypto.pki import throwaway_identities  # noqa: E402
from trellis.crypto.secagg import SecAggConfig  # noqa: E402
from trellis.crypto.secagg_local import run_local_aggregation  # noqa: E402

CLIP = 8.0                       # Flower's default clipping range
FLOWER_QUANTIZATION = 1 << 22    # Flower's default quantization range: step 16 / 2^22 = 2^-18
FRACTION_BITS = 18               # the same step for our fixed point


def run_ours(vectors: dict[str, np.ndarray], ids: dict, threshold: int,
             dropped: set[str]) -> dict:
    """One aggregation through Trellis's protocol with a 32-bit ring."""
    spec = FixedPointSpec(CLIP, FRACTION_BITS, ring_bits=32, max_weight=1)
    spec.check_capacity(len(vectors))
    encoded = {s: spec.encode(v, 1) for s, v in vectors.items()}
    outcome = run_local_aggregation(encoded, ids, SecAggConfig(threshold), RoundContext(
        "bench", 1, 1, run="bench"), {s: "input" for s in dropped})
    if outcome.total is None:
        raise RuntimeError(outcome.aborted)
    mean, weight = spec.decode_mean(outcome.total)
    survivors = [s for s in vectors if s not in dropped]
    plain = np.mean([vectors[s].astype(np.float64) for s in survivors], axis=0)
    correct = (weight == len(survivors) and tuple(sorted(survivors)) == outcome.survivors
               and float(np.max(np.abs(mean - plain))) <= spec.error_bound(len(survivors),
                                                                           weight) + 1e-12)
    d = next(iter(vectors.values())).size
    senders = [s for s in survivors]
    share_bytes = np.mean([outcome.silo_bytes[s] - (d + 1) * 4 for s in senders])
    return {"silo_s": float(np.mean([outcome.silo_seconds[s] for s in senders])),
            "coordinator_s": outcome.coordinator_seconds,
            "bytes_per_silo": float(np.mean([outcome.silo_bytes[s] for s in senders])),
            "plain_plus_shares": float(4 * d + share_bytes),
            "correct": bool(correct)}


# -- Flower ------------------------------------------------------------------------------------
def run_flower(vectors: dict[str, np.ndarray], threshold: int, dropped: set[str]) -> dict:
    """One aggregation through Flower's SecAgg+ client mod and server workflow, in memory."""
    from flwr.app import ConfigRecord, Context, Message, RecordDict
    from flwr.client.mod.secure_aggregation.secaggplus_mod import secaggplus_mod
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.common.secure_aggregation.secaggplus_constants import (
        RECORD_KEY_CONFIGS,
        Key,
        Stage,
    )
    from flwr.compat.common import recorddict_compat as compat
    from flwr.server.client_manager import SimpleClientManager
    from flwr.server.client_proxy import ClientProxy
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.secure_aggregation.secaggplus_workflow import SecAggPlusWorkflow
    from flwr.supercore.task_identity import TaskIdentity

    logging.getLogger("flwr").setLevel(logging.WARNING)
    # One process plays the server app and every client app: give messages an identity.
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    names = sorted(vectors)
    node_of = {name: 1000 + i for i, name in enumerate(names)}
    name_of = {v: k for k, v in node_of.items()}
    dead = {node_of[s] for s in dropped}

    class Proxy(ClientProxy):
        def get_properties(self, *a, **k):  # type: ignore[no-untyped-def]
            raise NotImplementedError

        get_parameters = fit = evaluate = reconnect = get_properties

    manager = SimpleClientManager()
    for name in names:
        proxy = Proxy(name)
        proxy.node_id = node_of[name]
        manager.register(proxy)
    n = len(names)
    strategy = FedAvg(fraction_fit=1.0, min_fit_clients=n, min_available_clients=n,
                      fit_metrics_aggregation_fn=lambda metrics: {})
    base = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    context = LegacyContext(base, strategy=strategy, client_manager=manager)
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({"current_round": 1})
    zeros = ndarrays_to_parameters([np.zeros(next(iter(vectors.values())).size, np.float32)])
    context.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
        zeros, keep_input=True)
    node_contexts = {node: Context(run_id=1, node_id=node, node_config={}, state=RecordDict(),
                                   run_config={}) for node in node_of.values()}
    silo_seconds = dict.fromkeys(node_of.values(), 0.0)
    silo_bytes = dict.fromkeys(node_of.values(), 0)
    transport = [0.0]                 # copying messages stands in for the network: not counted

    def train(msg: Message, ctxt: Context) -> Message:
        vector = vectors[name_of[ctxt.node_id]]
        fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([vector]), 1, {})
        return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=msg)

    class Grid:
        def send_and_receive(self, messages, timeout=None):  # type: ignore[no-untyped-def]
            replies = []
            for sent in messages:
                # A transport would serialise: every client gets its own copy (the mod pops
                # keys from the configs it receives, and the workflow shares one content).
                copied = time.perf_counter()
                msg = copy.deepcopy(sent)
                transport[0] += time.perf_counter() - copied
                node = msg.metadata.dst_node_id
                stage = msg.content.config_records[RECORD_KEY_CONFIGS][Key.STAGE]
                if node in dead and stage in (Stage.COLLECT_MASKED_VECTORS, Stage.UNMASK):
                    continue      # vanished after the share stage
                started = time.perf_counter()
                reply = secaggplus_mod(msg, node_contexts[node], train)
                silo_seconds[node] += time.perf_counter() - started
                silo_bytes[node] += _payload_bytes(reply.content)
                replies.append(reply)
            return replies

    workflow = SecAggPlusWorkflow(num_shares=n, reconstruction_threshold=threshold,
                                  clipping_range=CLIP, quantization_range=FLOWER_QUANTIZATION,
                                  max_weight=1.0)
    started = time.perf_counter()
    workflow(Grid(), context)
    total = time.perf_counter() - started
    survivors = [s for s in names if s not in dropped]
    params = compat.arrayrecord_to_parameters(context.state.array_records[MAIN_PARAMS_RECORD],
                                              keep_input=True)
    aggregate = parameters_to_ndarrays(params)[0]
    plain = np.mean([vectors[s].astype(np.float64) for s in survivors], axis=0)
    # Flower quantises with stochastic rounding: allow a few quantisation steps.
    error = float(np.max(np.abs(aggregate - plain))) if aggregate.shape == plain.shape else (
        math.inf)
    correct = error <= 4 * 2 * CLIP / FLOWER_QUANTIZATION
    senders = [node_of[s] for s in survivors]
    return {"silo_s": float(np.mean([silo_seconds[x] for x in senders])),
            "coordinator_s": total - sum(silo_seconds.values()) - transport[0],
            "bytes_per_silo": float(np.mean([silo_bytes[x] for x in senders])),
            "max_error": error, "correct": bool(correct)}


def _payload_bytes(content) -> int:  # type: ignore[no-untyped-def]
    """Bytes and array payload in a Flower reply (what a transport would have to carry)."""
    total = 0
    for record in content.config_records.values():
        for value in record.values():
            items = value if isinstance(value, list) else [value]
            total += sum(len(v) if isinstance(v, bytes | str) else 8 for v in items)
    for record in content.array_records.values():
        total += sum(len(array.data) for array in record.values())
    return total


# -- driver ------------------------------------------------------------------------------------
def one_setting(n: int, d: int, dropout: float, ids: dict, seed: int) -> dict:
    """Run both implementations on the same inputs and dropouts."""
    rng = np.random.default_rng(seed)
    names = sorted(ids)[:n]
    vectors = {s: rng.uniform(-1, 1, d).astype(np.float32) for s in names}
    dropped = set(rng.choice(names, size=int(round(dropout * n)), replace=False).tolist())
    threshold = n // 2 + 1
    ours = run_ours(vectors, {s: ids[s] for s in names}, threshold, dropped)
    flower = run_flower(vectors, threshold, dropped)
    return {"n": n, "d": d, "dropout": dropout, "threshold": threshold, "ours": ours,
            "flower": flower,
            "silo_speedup": flower["silo_s"] / ours["silo_s"],
            "coordinator_speedup": flower["coordinator_s"] / ours["coordinator_s"],
            "upload_vs_flower": ours["bytes_per_silo"] / flower["bytes_per_silo"],
            "upload_ratio": ours["bytes_per_silo"] / ours["plain_plus_shares"]}


def render_markdown(doc: dict) -> str:
    """A docs/benchmarks.md section for one run."""
    lines = [f"\n## Secure aggregation vs Flower {doc['flwr']} SecAgg+ "
             f"({time.strftime('%Y-%m-%d')}, {doc['machine']['cpus']} cores)\n",
             f"`{doc['command']}` (full graph, threshold n/2+1, dropout after the share stage; "
             "ours: 32-bit ring, AES-256-CTR masks, certificates; per-silo figures are means "
             "over silos that sent a masked input)\n",
             "| n | d | dropout | silo s (ours / Flower / x) | coordinator s (ours / Flower / x) "
             "| MB per silo (ours / Flower) | ours / (float32 + shares) | correct |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in doc["rows"]:
        o, f = r["ours"], r["flower"]
        lines.append(
            f"| {r['n']} | {r['d']:,} | {r['dropout']:.0%} | {o['silo_s']:.3f} / "
            f"{f['silo_s']:.3f} / {r['silo_speedup']:.1f}x | {o['coordinator_s']:.3f} / "
            f"{f['coordinator_s']:.3f} / {r['coordinator_speedup']:.1f}x | "
            f"{o['bytes_per_silo'] / 1e6:.3f} / {f['bytes_per_silo'] / 1e6:.3f} | "
            f"{r['upload_ratio']:.3f} | {o['correct'] and f['correct']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Parse arguments, run the settings, print a table and write the results file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="only n=50, d=100000, 10%% dropout")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" /
                        "secagg_vs_flower.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--setting", nargs=3, action="append", metavar=("N", "D", "DROPOUT"),
                        help="run only this setting (repeatable), e.g. --setting 100 1000000 0.1")
    parser.add_argument("--no-append", action="store_true",
                        help="do not append the table to docs/benchmarks.md")
    args = parser.parse_args()
    settings = [(50, 100_000, 0.1)] if args.quick else [
        (n, d, p) for n in (10, 50, 100) for d in (100_000, 1_000_000) for p in (0.0, 0.1)]
    if args.setting:
        settings = [(int(n), int(d), float(p)) for n, d, p in args.setting]
    with tempfile.TemporaryDirectory() as tmp:
        ids = throwaway_identities([f"silo-{i:03d}" for i in range(max(n for n, _, _ in settings))],
                                   Path(tmp))
        rows = []
        header = (f"{'n':>4} {'d':>8} {'drop':>5} | {'silo s':>8} {'flwr':>8} {'x':>6} | "
                  f"{'coord s':>8} {'flwr':>8} {'x':>6} | {'MB/silo':>8} {'flwr':>8} "
                  f"{'ratio':>6} {'vs plain':>8} | ok")
        print(header)
        for n, d, p in settings:
            row = one_setting(n, d, p, ids, args.seed)
            rows.append(row)
            o, f = row["ours"], row["flower"]
            print(f"{n:>4} {d:>8} {p:>5.0%} | {o['silo_s']:>8.3f} {f['silo_s']:>8.3f} "
                  f"{row['silo_speedup']:>6.1f} | {o['coordinator_s']:>8.3f} "
                  f"{f['coordinator_s']:>8.3f} {row['coordinator_speedup']:>6.1f} | "
                  f"{o['bytes_per_silo'] / 1e6:>8.3f} {f['bytes_per_silo'] / 1e6:>8.3f} "
                  f"{row['upload_vs_flower']:>6.2f} {row['upload_ratio']:>8.3f} | "
                  f"{o['correct'] and f['correct']}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    import flwr
    doc = {"machine": {"cpus": os.cpu_count()}, "flwr": flwr.__version__,
           "command": " ".join(sys.argv), "rows": rows}
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    if not args.no_append:
        with open(ROOT / "docs" / "benchmarks.md", "a") as handle:
            handle.write(render_markdown(doc))
    last = rows[-1]
    correct = all(r["ours"]["correct"] and r["flower"]["correct"] for r in rows)
    print(f"results: {args.out}")
    print(f"silo_speedup={last['silo_speedup']:.2f} "
          f"coordinator_speedup={last['coordinator_speedup']:.2f} "
          f"upload_ratio={last['upload_ratio']:.3f} correct={str(correct).lower()}")
    if not math.isfinite(last["silo_speedup"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
