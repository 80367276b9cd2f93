"""One clause of a silo's policy that a plan breaks, as the operator and the audit trail see it.

Both halves of a policy produce them: its ``[accept]`` clauses (silo/privacy/policy.py) and its
``[privacy]`` table (silo/privacy/dp_policy.py, with silo/privacy/budget.py for the budget). It
sits under both, so that the policy can read its ``[privacy]`` table without an import circle.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Violation:
    """One clause the plan breaks: the policy's limit and what the plan asks, as text."""

    clause: str
    limit: str
    value: str

    def line(self) -> str:
        """The operator's one line."""
        return f"policy: {self.clause} allows {self.limit}; the plan asks {self.value}"

    def record(self) -> dict[str, str]:
        """The audit trail's form."""
        return {"clause": self.clause, "allows": self.limit, "plan": self.value}
