"""What a restarted silo process reads back of its session's `resume_state` (its own disk).

Checked whole before anything of it is used: a file cut short or of another plan is one clear
ProtocolError, never a half-restored session.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from trellis.crypto.errors import CryptoError, ProtocolError
from trellis.crypto.groupkey import GroupSecrets
from trellis.protos.plan import PublicPlan


@dataclass(frozen=True)
class SavedProgress:
    """The counters, snapshot and group secrets of a saved session."""

    round: int
    attempt: int
    snapshot_round: int
    snapshot: dict[str, Any]
    reported: set[int]
    took_part: set[int]
    group: GroupSecrets | None


def read_saved(saved: Mapping[str, Any], plan: PublicPlan) -> SavedProgress:
    """The saved progress of a session of `plan` (ProtocolError if incomplete or of another
    plan; a finished federation's state also goes on under the same plan with more rounds)."""
    try:
        saved_plan = PublicPlan.from_json(saved["plan"])
        # A federation that finished may be extended: the same plan with more rounds.
        same_plan = saved_plan == plan or (
            bool(saved.get("finished")) and plan.rounds > saved_plan.rounds
            and replace(saved_plan, rounds=plan.rounds) == plan)
        secrets = bytes(saved["group_secrets"].numpy().tobytes())
        progress = SavedProgress(
            int(saved["round"]), int(saved["attempt"]), int(saved["snapshot_round"]),
            saved["snapshot"], {int(r) for r in saved["reported"]},
            {int(r) for r in saved.get("took_part", ())},
            GroupSecrets.from_bytes(secrets) if secrets else None)
    except (KeyError, TypeError, ValueError, AttributeError, CryptoError) as exc:
        raise ProtocolError(f"the saved silo state is incomplete ({exc})") from None
    if not same_plan:
        raise ProtocolError("the saved silo state belongs to another plan")
    return progress
