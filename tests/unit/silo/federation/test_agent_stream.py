"""The silo agent's reading of its control stream (silo/federation/agent.py `_latest`)."""

from __future__ import annotations

import queue

import pytest

from trellis.protos.messages import Envelope, Instruction, Phase
from trellis.silo.federation.agent import _latest, _StreamClosed


def _ins(phase: Phase, round_no: int = 1) -> Instruction:
    return Instruction(Envelope("f", round_no, 1, phase))


def test_a_finished_queued_before_the_stream_closed_is_acted_on_first() -> None:
    inbox: queue.Queue = queue.Queue()
    finished = _ins(Phase.FINISHED, 2)
    inbox.put(finished)
    inbox.put(None)                        # the coordinator ended the stream after it
    assert _latest(inbox) is finished
    with pytest.raises(_StreamClosed):
        _latest(inbox)


def test_the_newest_instruction_supersedes_older_ones_and_a_join_comes_first() -> None:
    inbox: queue.Queue = queue.Queue()
    join, old, new = _ins(Phase.JOIN), _ins(Phase.ROUND_OPEN, 1), _ins(Phase.ROUND_OPEN, 2)
    for item in (join, old, new):
        inbox.put(item)
    assert _latest(inbox) is join
    assert _latest(inbox) is new


def test_a_stream_error_with_nothing_before_it_is_raised() -> None:
    inbox: queue.Queue = queue.Queue()
    inbox.put(None)
    with pytest.raises(_StreamClosed):
        _latest(inbox)
