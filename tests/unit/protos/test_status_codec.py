"""The federation status: protobuf and JSON round trips (codec seam, status.json)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trellis.protos import codec
from trellis.protos import federation_pb2 as pb
from trellis.protos.codec import CodecError
from trellis.protos.status import FederationStatus, RefusedCaller

names = st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=0, max_size=20)
counts = st.integers(0, 2**32 - 1)
times = st.floats(0, 1e10, allow_nan=False)
statuses = st.builds(
    FederationStatus, names, names, names, counts, counts, counts, names,
    st.lists(names, max_size=4).map(tuple), st.lists(names, max_size=4).map(tuple),
    st.lists(st.builds(RefusedCaller, names, st.text(max_size=40)), max_size=3).map(tuple),
    counts, counts, st.dictionaries(names, st.floats(allow_nan=False), max_size=4),
    times, times, times, times, counts, st.text(max_size=40), st.text(max_size=40))


@given(statuses)
def test_status_round_trips_through_protobuf_and_json(status: FederationStatus) -> None:
    assert codec.status_from_pb(codec.status_to_pb(status)) == status
    doc = json.loads(json.dumps(status.to_json()))
    assert FederationStatus.from_json(doc) == status


def test_a_metric_listed_twice_and_a_broken_document_are_refused() -> None:
    msg = pb.FederationStatus(metrics=[pb.Metric(name="val_acc", value=0.5)] * 2)
    with pytest.raises(CodecError, match="listed twice"):
        codec.status_from_pb(msg)
    with pytest.raises(ValueError, match="not a status document"):
        FederationStatus.from_json({"federation": "f"})


def test_eta_is_mean_round_time_times_rounds_left() -> None:
    status = FederationStatus("f", "fedstar", "r", 3, 10, 2, "input", round_mean_s=1.5)
    assert status.eta_s == pytest.approx(12.0)
    assert FederationStatus("f", "fedstar", "r", 1, 10, 0, "waiting").eta_s is None
