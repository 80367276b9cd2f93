"""FedHGN (docs/algorithms.md §5): sealed envelopes, coefficient records, early stopping, the plan,
the round machine's envelope stage and its refusals, and a simulation of three silos whose
schemas differ in names and shape."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.support.federation import (
    HETERO_SILOS,
    Workspace,
    drive_machine_until,
    hetero_graphs,
    hetero_sessions,
    write_hetero_plan,
    write_plan,
)
from trellis.coordinator.rounds.errors import Duplicate, InvalidPayload, OutOfPhase
from trellis.coordinator.rounds.machine import RoundMachine, RoundRecord, Stage
from trellis.coordinator.rounds.strategies import (
    EarlyStoppingStrategy,
    best_round,
    make_strategy,
    weighted_accuracy,
    weighted_rounds,
)
from trellis.coordinator.serving.service import start_server
from trellis.coordinator.simulation.sequential import run_simulation
from trellis.crypto.envelopes import envelope_aad, open_records, seal_records, sealed_size
from trellis.crypto.errors import ProtocolError, VerificationFailed
from trellis.crypto.groupkey import GROUP_KEY_BYTES
from trellis.crypto.pki import throwaway_identities
from trellis.protos.algorithms import ALGORITHMS
from trellis.protos.messages import Phase
from trellis.protos.plan import HeteroConfig, PlanError, PublicPlan, load_plan
from trellis.silo.data.hetero import save_hetero_folder
from trellis.silo.federation.coefficients import record_bytes, records_to_rows, rows_to_records
from trellis.silo.federation.session import SiloSession
from trellis.silo.training.trainers import make_silo_trainer, union_relations

KEY = bytes(range(GROUP_KEY_BYTES))
AAD = envelope_aad("fed-1", "coefficients", run="")


# -- sealed envelopes ---------------------------------------------------------------------------
def _records(n: int, size: int = 12) -> list[bytes]:
    return [bytes([i + 1]) * size for i in range(n)]


def test_envelopes_round_trip_with_one_size_for_any_number_of_records() -> None:
    """0, 1 or `slots` records seal to exactly sealed_size(slots, record) bytes and open back."""
    slots, size = 5, 12
    assert sealed_size(slots, size) == 12 + 12 + slots * (1 + size) + 16
    for n in (0, 1, 3, slots):
        sealed = seal_records(KEY, _records(n), slots=slots, record_bytes=size, aad=AAD)
        assert len(sealed) == sealed_size(slots, size)
        assert open_records(KEY, sealed, slots=slots, record_bytes=size, aad=AAD) == _records(n)
    # Fresh nonces: the same records never seal to the same bytes.
    twice = {seal_records(KEY, _records(2), slots=slots, record_bytes=size, aad=AAD)
             for _ in range(2)}
    assert len(twice) == 2


def test_dummies_are_dropped_by_their_inner_flag_even_when_they_look_real() -> None:
    """Dummy slots filled with a copy of a real record still open as dummies (the flag, sealed
    inside, decides), so a receiver gets exactly the real records."""
    real = _records(2)
    fill = iter([real[0]] * 3 + [bytes(12)])        # three dummies, then the nonce

    sealed = seal_records(KEY, real, slots=5, record_bytes=12, aad=AAD,
                          random_bytes=lambda n: next(fill)[:n])
    assert open_records(KEY, sealed, slots=5, record_bytes=12, aad=AAD) == real


def test_tampered_or_misbound_envelopes_fail_verification() -> None:
    """A flipped byte anywhere, another federation's, run's or purpose's aad, or another key
    raise VerificationFailed."""
    sealed = seal_records(KEY, _records(2), slots=3, record_bytes=12, aad=AAD)
    for position in (0, 11, 12, 30, len(sealed) // 2, len(sealed) - 1):
        flipped = bytearray(sealed)
        flipped[position] ^= 0x01
        with pytest.raises(VerificationFailed, match="does not authenticate"):
            open_records(KEY, bytes(flipped), slots=3, record_bytes=12, aad=AAD)
    for aad in (envelope_aad("fed-2", "coefficients", run=""),
                envelope_aad("fed-1", "coefficients", run="another-run"),
                envelope_aad("fed-1", "other", run=""), b""):
        with pytest.raises(VerificationFailed):
            open_records(KEY, sealed, slots=3, record_bytes=12, aad=aad)
    with pytest.raises(VerificationFailed):
        open_records(bytes(GROUP_KEY_BYTES), sealed, slots=3, record_bytes=12, aad=AAD)


def test_envelope_inputs_of_the_wrong_shape_are_protocol_errors() -> None:
    """Too many records, a record of the wrong length, an envelope of the wrong length, a
    header for another format and a bad key raise ProtocolError with a clear message."""
    with pytest.raises(ProtocolError, match="4 records do not fit in 3 envelope slots"):
        seal_records(KEY, _records(4), slots=3, record_bytes=12, aad=AAD)
    with pytest.raises(ProtocolError, match="every record must be 12 bytes"):
        seal_records(KEY, [bytes(12), bytes(11)], slots=3, record_bytes=12, aad=AAD)
    with pytest.raises(ProtocolError, match="every record must be 12 bytes"):
        seal_records(KEY, [bytearray(12)], slots=3, record_bytes=12, aad=AAD)  # type: ignore
    with pytest.raises(ProtocolError, match="group key must be 32 bytes"):
        seal_records(KEY[:16], [], slots=3, record_bytes=12, aad=AAD)
    sealed = seal_records(KEY, _records(1), slots=4, record_bytes=12, aad=AAD)
    size = sealed_size(4, 12)
    for wrong in (sealed[:-1], sealed + b"\0", b""):
        with pytest.raises(ProtocolError, match=f"an envelope must be {size} bytes"):
            open_records(KEY, wrong, slots=4, record_bytes=12, aad=AAD)
    with pytest.raises(ProtocolError, match="must be"):
        open_records(KEY, sealed, slots=3, record_bytes=12, aad=AAD)
    # Two slots of 25 bytes make an envelope of the same length: the sealed header refuses it.
    assert sealed_size(2, 25) == size
    with pytest.raises(ProtocolError, match="header does not match"):
        open_records(KEY, sealed, slots=2, record_bytes=25, aad=AAD)


# -- coefficient records ------------------------------------------------------------------------
def test_coefficient_rows_survive_as_a_multiset_of_fixed_size_records() -> None:
    """rows_to_records then records_to_rows returns the same rows (in any order), each record
    4 * bases bytes; an empty set is a (0, bases) matrix."""
    rows = np.random.default_rng(0).standard_normal((7, 3)).astype(np.float32)
    records = rows_to_records(rows)
    assert len(records) == 7 and {len(r) for r in records} == {record_bytes(3)} == {12}
    back = records_to_rows(records, 3)
    assert back.dtype == np.float32 and back.shape == (7, 3)
    assert sorted(map(tuple, back.tolist())) == sorted(map(tuple, rows.tolist()))
    assert records_to_rows([], 3).shape == (0, 3)
    with pytest.raises(ValueError, match="must be a matrix"):
        rows_to_records(rows[0])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_or_wrong_length_coefficient_records_are_refused(bad: float) -> None:
    """A record holding NaN or infinity, or of the wrong length, is refused."""
    rows = np.ones((2, 3), np.float32)
    rows[1, 2] = bad
    with pytest.raises(ValueError, match="NaN or infinite"):
        records_to_rows(rows_to_records(rows), 3)
    with pytest.raises(ValueError, match="must be 12 bytes"):
        records_to_rows([bytes(12), bytes(8)], 3)
    with pytest.raises(ValueError, match="must be 16 bytes"):
        records_to_rows([bytes(12)], 4)


# -- early stopping -------------------------------------------------------------------------------
def _record(round_: int, val: dict[str, tuple[float, int]],
            test: dict[str, tuple[float, int]] | None = None) -> RoundRecord:
    metrics = {s: {"val_acc": a, "val_count": float(n)} for s, (a, n) in val.items()}
    for s, (a, n) in (test or {}).items():
        metrics.setdefault(s, {}).update(test_acc=a, test_count=float(n))
    return RoundRecord(round_, 1, tuple(sorted(metrics)), 10, 0.0, 1.0, metrics)


def test_best_round_is_the_first_to_beat_the_best_by_min_delta() -> None:
    """best_round keeps the first of equal values, needs at least min_delta to improve, and
    counts the scored rounds since the best."""
    assert best_round([], 0.0) == (None, None, 0)
    assert best_round([(1, 0.5), (2, 0.7), (3, 0.7), (4, 0.6)], 1e-5) == (2, 0.7, 2)
    assert best_round([(1, 0.5), (2, 0.50001), (3, 0.4)], 1e-3) == (1, 0.5, 2)
    assert best_round([(1, 0.5), (2, 0.50001), (3, 0.4)], 0.0) == (2, 0.50001, 1)
    assert best_round([(3, 0.2), (5, 0.9)], 1e-5) == (5, 0.9, 0)


def test_weighted_accuracy_weights_silos_by_their_node_counts() -> None:
    """Accuracy over silos weighted by <which>_count; silos without counted nodes or with NaN
    are left out; None when nothing is counted."""
    metrics = {"a": {"val_acc": 1.0, "val_count": 1.0, "test_acc": 0.5, "test_count": 3.0},
               "b": {"val_acc": 0.0, "val_count": 3.0},
               "c": {"val_acc": float("nan"), "val_count": 5.0},
               "d": {"val_acc": 0.9, "val_count": 0.0},
               "e": {"val_acc": 0.7}}
    assert weighted_accuracy(metrics, "val") == pytest.approx(0.25)
    assert weighted_accuracy(metrics, "test") == pytest.approx(0.5)
    assert weighted_accuracy({"b": {"val_acc": 0.4}}, "val") is None
    history = [_record(1, {"a": (0.5, 2)}), RoundRecord(2, 1, ("a",), 10, 0.0, 1.0),
               _record(3, {"a": (1.0, 1), "b": (0.0, 1)})]
    assert weighted_rounds(history, "val") == [(1, 0.5), (3, 0.5)]


def test_should_stop_ignores_the_round_whose_reports_are_still_to_come() -> None:
    """With patience 2 the strategy stops once two complete rounds after the best did not
    improve; the last record never counts (its reports arrive a round later)."""
    strategy = EarlyStoppingStrategy(ALGORITHMS["fedhgn"], HeteroConfig(classes=2, patience=2))
    val = [0.5, 0.6, 0.55, 0.58, 0.59]
    history = [_record(i + 1, {"a": (v, 10), "b": (v, 30)}) for i, v in enumerate(val)]
    # Round 4 would be the second stale round, but as the last record it is not yet counted.
    assert weighted_rounds(history[:4], "val")[-1] == (4, pytest.approx(0.58))
    assert not strategy.should_stop(history[:4])    # scores rounds 1-3: one stale round
    assert strategy.should_stop(history[:5])        # rounds 1-4 scored: 2 stale
    # A better last round does not count either: the decision lags one round.
    better = [*history[:4], _record(5, {"a": (0.99, 10), "b": (0.99, 30)})]
    assert strategy.should_stop(better)
    unreported = [*history[:4], RoundRecord(5, 1, ("a", "b"), 40, 0.0, 1.0)]
    assert strategy.should_stop(unreported)
    assert not strategy.should_stop([])
    assert not EarlyStoppingStrategy(ALGORITHMS["fedhgn"], HeteroConfig(classes=2, patience=3)
                                     ).should_stop(history)


def test_selection_reports_the_best_validation_round_and_its_weighted_test_accuracy() -> None:
    """selection names the first round with the best node-weighted validation accuracy and
    that round's node-weighted test accuracy (not the best test accuracy)."""
    strategy = EarlyStoppingStrategy(ALGORITHMS["fedhgn"], HeteroConfig(classes=2, patience=5,
                                                            min_delta=1e-5))
    history = [
        _record(1, {"a": (0.2, 10), "b": (1.0, 1)}, {"a": (0.9, 10), "b": (1.0, 10)}),
        _record(2, {"a": (0.6, 10), "b": (0.0, 1)}, {"a": (0.5, 10), "b": (0.7, 30)}),
        _record(3, {"a": (0.5, 10), "b": (1.0, 1)}, {"a": (1.0, 10), "b": (1.0, 30)}),
    ]
    # Weighted val: 3/11, 6/11, 6/11 -> round 2 first; unweighted means would pick round 1.
    selected = strategy.selection(history)
    assert selected["best_round"] == 2 and selected["val_acc"] == pytest.approx(6 / 11)
    assert selected["test_acc"] == pytest.approx((0.5 * 10 + 0.7 * 30) / 40)
    assert selected["rounds_scored"] == 3 and selected["patience"] == 5
    assert strategy.selection([])["best_round"] is None
    assert strategy.exchanges_envelopes and strategy.needs_group_key and strategy.stops_early
    fedavg = make_strategy("hgn-fedavg", hetero=HeteroConfig(classes=2))
    assert fedavg.stops_early and not fedavg.exchanges_envelopes and not fedavg.needs_group_key


# -- the plan -----------------------------------------------------------------------------------
PLAN = """
[federation]
id = "hgn"
algorithm = "{algorithm}"
rounds = 5
silos = [{silos}]

[server]
state_dir = "st"

{fedhgn}
"""


def _load(tmp_path: Path, algorithm: str = "fedhgn", fedhgn: str = "[fedhgn]\nclasses = 4",
          silos: str = '"a", "b", "c"'):
    path = tmp_path / "plan.toml"
    path.write_text(PLAN.format(algorithm=algorithm, fedhgn=fedhgn, silos=silos))
    return load_plan(path)


def test_plan_requires_fedhgn_classes_and_knows_only_its_fields(tmp_path: Path) -> None:
    """[fedhgn] without classes, with an unknown key or a bad value is refused naming each
    field; a graph-classification plan needs no [fedhgn] table."""
    for algorithm in ("fedhgn", "hgn-fedavg", "hgn-local"):
        with pytest.raises(PlanError) as info:
            _load(tmp_path, algorithm, fedhgn="")
        assert any(p.startswith("fedhgn.classes: required") for p in info.value.problems)
    with pytest.raises(PlanError) as info:
        _load(tmp_path, fedhgn="[fedhgn]\nclasses = 4\nslots = 8\ncoefficient_slots = 0")
    problems = " | ".join(info.value.problems)
    assert "fedhgn.slots: unknown field; expected one of" in problems
    assert "coefficient_slots" in problems and "fedhgn.coefficient_slots" in problems
    assert _load(tmp_path, "fedstar", fedhgn="").public.hetero == HeteroConfig()


def test_hgn_central_needs_exactly_one_silo(tmp_path: Path) -> None:
    """hgn-central over two silos is refused (it trains one model on one whole graph)."""
    with pytest.raises(PlanError) as info:
        _load(tmp_path, "hgn-central", silos='"a", "b"')
    assert any(p.startswith("federation.silos: hgn-central trains one model")
               for p in info.value.problems)
    plan = _load(tmp_path, "hgn-central", silos='"a"')
    assert plan.silos == ("a",) and plan.min_silos == 1


def test_public_plan_json_round_trip_keeps_the_fedhgn_settings(tmp_path: Path) -> None:
    """The plan a silo receives carries every [fedhgn] value, and a silo re-validates it."""
    plan = _load(tmp_path, fedhgn="[fedhgn]\nclasses = 4\nbases = 5\ncoefficient_slots = 9\n"
                                  "patience = 3\nmin_delta = 0.01\nlr = 0.05")
    expected = HeteroConfig(classes=4, bases=5, coefficient_slots=9, patience=3,
                            min_delta=0.01, lr=0.05)
    assert plan.public.hetero == expected
    again = PublicPlan.from_json(plan.public.to_json())
    assert again == plan.public and again.hetero == expected
    no_classes = replace(plan.public, hetero=replace(expected, classes=0))
    with pytest.raises(PlanError, match="fedhgn.classes"):
        PublicPlan.from_json(no_classes.to_json())


# -- the round machine --------------------------------------------------------------------------
def _hetero_plan(tmp_path: Path, *, algorithm: str = "fedhgn", rounds: int = 6,
                 slots: int = 8, patience: int = 10):
    """A plan for HETERO_SILOS whose simulation data are hetero_graphs() folders."""
    ws = Workspace(tmp_path, HETERO_SILOS)
    graphs = hetero_graphs()
    for silo, graph in graphs.items():
        save_hetero_folder(graph, ws.data(silo))
    plan = load_plan(write_hetero_plan(ws, "hgn-sim", algorithm=algorithm, rounds=rounds,
                                       slots=slots, patience=patience, port=1))
    return plan, graphs


def test_fedhgn_simulation_of_three_different_schemas_stops_early_at_the_best_round(
        tmp_path: Path) -> None:
    """Three silos with different node types and relations train FedHGN to well above chance,
    stop `patience` rounds after the best (plus the reporting lag) before the round limit, and
    results select the first best node-weighted validation round and its test accuracy."""
    plan, graphs = _hetero_plan(tmp_path, rounds=30, patience=5)
    assert len({(len(g.node_types), len(g.relations)) for g in graphs.values()}) == 3
    seen = {}

    def inspect(machine: RoundMachine, sessions: Mapping[str, SiloSession]) -> None:
        seen["envelopes"] = dict(machine.envelopes)
        seen["pools"] = {s: len(x.trainer.pool) for s, x in sessions.items()}

    results = run_simulation(plan, graphs, progress=False, inspect=inspect)
    assert results["status"] == "completed"
    completed = results["rounds_completed"]
    assert 4 <= completed < 30 and len(results["rounds"]) == completed
    val = [(r["round"], weighted_accuracy(r["metrics"], "val")) for r in results["rounds"]]
    test = {r["round"]: weighted_accuracy(r["metrics"], "test") for r in results["rounds"]}
    assert all(v is not None for _, v in val)
    # The last round ran only because reports lag a round; the reference never ran it, so it
    # is not a candidate (even when it happens to score best).
    considered = val[:-1]
    # The first round at least min_delta above every earlier best (weighted accuracies that
    # are equal can differ in the last float bits, which must not count as a gain).
    best, first_best = float("-inf"), 0
    for r, v in considered:
        if v >= best + plan.public.hetero.min_delta:
            best, first_best = v, r
    chosen = results["early_stopping"]
    assert chosen["stopped_after"] == considered[-1][0]
    assert chosen["best_round"] == first_best
    assert chosen["val_acc"] == pytest.approx(best)
    assert chosen["test_acc"] == pytest.approx(test[first_best])
    # It stopped once five scored rounds after the best (of those scored then) were no better.
    before_last, _, stale = best_round(val[:-1], plan.public.hetero.min_delta)
    assert stale == 5 and completed == before_last + 5 + 1
    # Training is meaningful: far above the 1/3 of chance, and better than round 1.
    assert best >= 0.75 and best > val[0][1]
    # Every silo's envelope has the one plan size; each pool holds the other silos' rows.
    size = sealed_size(8, 4 * plan.public.hetero.bases)
    assert set(seen["envelopes"]) == set(plan.silos)
    assert {len(e) for e in seen["envelopes"].values()} == {size}
    total = sum(len(g.relations) for g in graphs.values())
    assert seen["pools"] == {s: total - len(g.relations) for s, g in graphs.items()}
    assert "zqxjv_" not in repr(results)


def test_private_fedhgn_is_silo_level_without_envelopes_or_early_stop(tmp_path: Path) -> None:
    """FedHGN with differential privacy (the whole silo is the unit): silos swap no coefficient
    envelopes (they would reach every peer without noise), the federation runs every planned
    round (early stopping would follow plain validation figures), and each silo accounts each
    round's epsilon. A plan that keeps the alignment term is refused with the reason."""
    plan, graphs = _hetero_plan(tmp_path, rounds=4)
    text = Path(plan.source).read_text()
    private = text.replace("[fedhgn]\n", "[fedhgn]\nalign_weight = 0\n") + (
        '\n[privacy]\nmechanism = "ddg"\nunit = "silo"\nnoise_multiplier = 0.5\n'
        'clip = 1.0\n')
    path = tmp_path / "private.toml"
    path.write_text(private)
    plan = load_plan(path)
    seen = {}

    def inspect(machine: RoundMachine, sessions: Mapping[str, SiloSession]) -> None:
        seen["envelopes"] = dict(machine.envelopes)
        seen["pools"] = [x.trainer.pool for x in sessions.values()]
        seen["epsilons"] = {s: x.budget.epsilon() for s, x in sessions.items()}
        seen["rounds"] = {s: x.budget.rounds for s, x in sessions.items()}
        seen["shared"] = {s: x.trainer.get_shared() for s, x in sessions.items()}

    results = run_simulation(plan, graphs, progress=False, inspect=inspect)
    assert results["status"] == "completed" and results["rounds_completed"] == 4
    # No peer's coefficients ever arrived: each pool is still the origin it starts from.
    assert seen["envelopes"] == {} and all(not p.any() for p in seen["pools"])
    assert all(0 < e < float("inf") for e in seen["epsilons"].values())
    assert {len(r) for r in seen["rounds"].values()} == {4}
    # Every silo loaded the same noisy shared state.
    first, *others = seen["shared"].values()
    assert all(np.array_equal(first, o) for o in others)
    path.write_text(text + '\n[privacy]\nmechanism = "ddg"\nunit = "silo"\n'
                    'noise_multiplier = 0.5\n')
    with pytest.raises(PlanError, match="align_weight = 0"):
        load_plan(path)


@pytest.fixture
def at_input(tmp_path: Path):
    """A fedhgn machine at round 1's masked-input stage, with real silo sessions."""
    plan, graphs = _hetero_plan(tmp_path)
    identities = throwaway_identities(list(plan.silos), tmp_path / "ids")
    machine = RoundMachine(plan, make_strategy("fedhgn", hetero=plan.public.hetero), 0.0)
    sessions = hetero_sessions(plan, graphs, identities)
    for name in plan.silos:
        machine.join(name, identities[name].cert_pem, 0.0)
    drive_machine_until(machine, sessions, lambda: machine.stage is Stage.INPUT)
    return machine, sessions, graphs


def test_fedhgn_round_one_aligns_to_the_origin_counted_once(at_input) -> None:
    """Before any peer's coefficients arrive, a silo aligns to the zero vector (the
    reference's initial server store), once: lambda * sum ||beta||^2, not the reference's
    doubled term; an empty pool later returns to the origin, and real rows replace it."""
    import torch

    from trellis.silo.models.hgn import alignment_loss

    _, sessions, _ = at_input
    bases = next(iter(sessions.values()))._plan().hetero.bases
    for session in sessions.values():
        pool = session.trainer.pool
        assert pool is not None and tuple(pool.shape) == (1, bases) and not pool.any()
        beta = session.trainer.model.coefficients.detach()
        assert float(alignment_loss(beta, pool)) == pytest.approx(float(beta.pow(2).sum()))
    session = next(iter(sessions.values()))
    rows = np.ones((2, bases), np.float32)
    session.trainer.set_pool(rows)
    assert torch.equal(session.trainer.pool, torch.ones(2, bases))
    assert session.load_pool([]) == 0
    assert not session.trainer.pool.any() and tuple(session.trainer.pool.shape) == (1, bases)


def _submit(machine: RoundMachine, session: SiloSession):
    """The silo's upload envelope, masked vector and sealed coefficients for this stage."""
    ins = machine.instruction(session.name)
    assert ins.envelope.phase is Phase.SHARES_READY
    masked = session.masked_input(machine.shares_for(session.name, ins.envelope))
    return replace(ins.envelope, phase=Phase.MASKED_INPUT), masked, session.sealed_coefficients


def test_machine_refuses_misplaced_and_malformed_envelopes_and_keeps_its_state(at_input) -> None:
    """Wrong size, wrong type, wrong phase or round, a masked input before the envelope and an
    envelope after the masked input are refused with a clear error, and nothing changes."""
    machine, sessions, _ = at_input
    a = "silo-aa"
    upload, masked, sealed = _submit(machine, sessions[a])
    size = machine.envelope_bytes
    assert size == sealed_size(8, 12) and isinstance(sealed, bytes) and len(sealed) == size
    for wrong in (sealed[:-1], sealed + b"\0", b""):
        with pytest.raises(InvalidPayload, match=rf"{a}'s sealed envelope must be exactly "
                                                 rf"{size} bytes \(set by fedhgn.coefficient_"
                                                 rf"slots\); got {len(wrong)}"):
            machine.sealed_envelope(a, upload, wrong, 1.0)
    with pytest.raises(InvalidPayload, match="got bytearray"):
        machine.sealed_envelope(a, upload, bytearray(sealed), 1.0)  # type: ignore[arg-type]
    with pytest.raises(OutOfPhase, match="expected phase MASKED_INPUT, got SHARES_READY"):
        machine.sealed_envelope(a, replace(upload, phase=Phase.SHARES_READY), sealed, 1.0)
    with pytest.raises(OutOfPhase, match="does not match"):
        machine.sealed_envelope(a, replace(upload, round=2), sealed, 1.0)
    assert machine.pending_envelopes == {}
    with pytest.raises(OutOfPhase, match=f"{a} must send its sealed coefficient envelope "
                                         "before its masked input"):
        machine.masked_input(a, upload, masked, 1.0, {})
    assert a in machine.waiting_for() and machine.pending_envelopes == {}
    # In order: accepted; a second envelope after the masked input is a duplicate.
    events = machine.sealed_envelope(a, upload, sealed, 1.0)
    assert [e.kind for e in events] == ["envelope_received"]
    assert events[0].fields["bytes"] == size and "silo-aa" == events[0].fields["silo"]
    machine.masked_input(a, upload, masked, 1.0, {})
    other = sessions[a]._seal_coefficients()
    assert other != sealed and len(other) == size
    with pytest.raises(Duplicate, match=f"{a} already answered"):
        machine.sealed_envelope(a, upload, other, 1.0)
    assert machine.pending_envelopes == {a: sealed} and machine.envelopes == {}
    # The round still completes; every silo's envelope joins the pool, never its own.
    drive_machine_until(machine, sessions, lambda: machine.round == 2)
    assert machine.envelopes[a] == sealed and len(machine.envelopes) == 3
    env = machine.instruction(a).envelope
    pool = machine.pool_for(a, replace(env, phase=Phase.FETCH_STATE))
    assert sorted(pool) == sorted(e for s, e in machine.envelopes.items() if s != a)
    assert sessions[a].load_pool(pool) == sum(
        len(x.trainer.coefficient_rows()) for s, x in sessions.items() if s != a)


def test_sessions_refuse_tampered_or_foreign_envelopes_in_the_pool(at_input) -> None:
    """A pooled envelope with a flipped byte, of the wrong size or sealed for another
    federation makes load_pool raise ProtocolError, and the silo keeps its previous pool."""
    machine, sessions, _ = at_input
    session = sessions["silo-bb"]
    good = sessions["silo-aa"]._seal_coefficients()
    assert session.load_pool([good]) == 3
    before = session.trainer.pool.clone()
    tampered = bytearray(good)
    tampered[40] ^= 0xFF
    hetero = session.plan.hetero
    foreign = seal_records(sessions["silo-aa"].group.group_key, [bytes(12)],
                           slots=hetero.coefficient_slots, record_bytes=12,
                           aad=envelope_aad("another-federation", "coefficients", run=""))
    for bad, text in ((bytes(tampered), "does not authenticate"), (good[:-1], "must be"),
                      (foreign, "does not authenticate")):
        with pytest.raises(ProtocolError, match=f"a coefficient envelope was refused: .*{text}"):
            session.load_pool([good, bad])
        assert np.array_equal(session.trainer.pool.numpy(), before.numpy())


def test_an_envelope_for_an_algorithm_without_envelopes_is_refused(tmp_path: Path) -> None:
    """hgn-fedavg exchanges no envelopes: one sent anyway is refused, masked inputs need none."""
    plan, graphs = _hetero_plan(tmp_path, algorithm="hgn-fedavg")
    identities = throwaway_identities(list(plan.silos), tmp_path / "ids")
    machine = RoundMachine(plan, make_strategy("hgn-fedavg", hetero=plan.public.hetero), 0.0)
    sessions = hetero_sessions(plan, graphs, identities,
                               relations=union_relations(list(graphs.values())))
    for name in plan.silos:
        machine.join(name, identities[name].cert_pem, 0.0)
    drive_machine_until(machine, sessions, lambda: machine.stage is Stage.INPUT)
    assert machine.envelope_bytes == 0
    upload, masked, sealed = _submit(machine, sessions["silo-cc"])
    assert sealed is None
    with pytest.raises(InvalidPayload, match="silo-cc sent a sealed envelope; hgn-fedavg "
                                             "exchanges none"):
        machine.sealed_envelope("silo-cc", upload, bytes(sealed_size(8, 12)), 1.0)
    assert machine.pending_envelopes == {}
    machine.masked_input("silo-cc", upload, masked, 1.0, {})
    assert "silo-cc" not in machine.waiting_for()


# -- silo side, simulation and serve refusals ---------------------------------------------------
def test_a_silo_with_more_relations_than_slots_refuses_the_plan(tmp_path: Path) -> None:
    """accept_plan refuses a plan whose coefficient_slots are fewer than the silo's relations,
    naming fedhgn.coefficient_slots; a silo with exactly that many relations joins."""
    plan, graphs = _hetero_plan(tmp_path, slots=3)
    identities = throwaway_identities(list(plan.silos), tmp_path / "ids")
    counts = {s: len(g.relations) for s, g in graphs.items()}
    assert counts == {"silo-aa": 3, "silo-bb": 4, "silo-cc": 7}
    for silo, count in counts.items():
        session = SiloSession(identities[silo],
                              lambda p, g=graphs[silo], s=silo: make_silo_trainer(g, p, s))
        if count <= 3:
            assert session.accept_plan(plan.public.to_json()) == plan.public
            continue
        with pytest.raises(ProtocolError) as info:
            session.accept_plan(plan.public.to_json())
        assert f"has {count} relations, more than the plan's 3" in str(info.value)
        assert "fedhgn.coefficient_slots" in str(info.value)
        assert session.plan is None and session.trainer is None


def test_simulation_refuses_the_wrong_kind_of_data(tmp_path: Path) -> None:
    """fedhgn refuses a TU dataset and fedstar refuses heterogeneous graphs, naming the silos."""
    from trellis.silo.data.datasets import load_graph_folder
    from trellis.silo.data.synthetic import write_tu_folder

    plan, graphs = _hetero_plan(tmp_path)
    write_tu_folder(tmp_path / "tu", "MOL", "molecules", 12, seed=1)
    mixed = {**graphs, "silo-bb": load_graph_folder(tmp_path / "tu" / "MOL")}
    with pytest.raises(ValueError, match=r"fedhgn needs a heterogeneous graph folder "
                                         r"\(meta.json \+ arrays.npz\) for every silo; not so "
                                         r"for: silo-bb$"):
        run_simulation(plan, mixed, progress=False)
    ws = Workspace(tmp_path, HETERO_SILOS)
    fedstar = load_plan(write_plan(ws, "star", algorithm="fedstar", port=1))
    with pytest.raises(ValueError, match="fedstar needs a TU graph-classification dataset for "
                                         "every silo; not so for: silo-aa, silo-bb, silo-cc"):
        run_simulation(fedstar, graphs, progress=False)


@pytest.mark.parametrize("algorithm", ["hgn-local", "hgn-fedavg", "hgn-fedprox"])
def test_serve_and_join_refuse_the_schema_matching_baselines(tmp_path: Path,
                                                             algorithm: str) -> None:
    """start_server refuses the baselines (they need schema matching) before touching its state
    directory, and a silo's trainer factory refuses them too."""
    plan, graphs = _hetero_plan(tmp_path, algorithm=algorithm)
    with pytest.raises(ValueError) as info:
        start_server(plan, progress=False, listen="127.0.0.1:0")
    text = str(info.value)
    assert f"{algorithm} cannot run as a real federation: it needs schema matching" in text
    assert "coordinator simulate" in text and "fedhgn" in text
    assert not plan.server.state_dir.exists()
    with pytest.raises(ValueError, match="needs schema matching and runs only in"):
        make_silo_trainer(graphs["silo-aa"], plan.public, "silo-aa")


def test_a_silo_that_reports_nothing_sends_no_node_counts(at_input) -> None:
    """A FedHGN silo started with --report none sends no metrics, not even its node counts
    (docs/security.md; DESIGN.md §4.5: silos decide what to report)."""
    machine, sessions, _ = at_input
    silo = sessions["silo-aa"]
    quiet = SiloSession(silo.identity, lambda p: silo.trainer, report=())
    quiet.accept_plan(machine.plan.public.to_json())
    # An empty report still tells the coordinator the silo is done with the round.
    report = quiet.metrics_report(1)
    assert report is not None and report.metrics == {}
    chatty = SiloSession(silo.identity, lambda p: silo.trainer, report=("test_acc",))
    chatty.accept_plan(machine.plan.public.to_json())
    assert set(chatty.metrics_report(1).metrics) == {"test_acc", "test_count"}
