"""Coordinator: runs the rounds of a federation for its admitted silos; needs no torch.

Sub-packages, from the bottom up (each may import only those below it; pyproject.toml's
import-linter contracts hold it): ``rounds`` (pure round logic: the round machine, its stages,
the strategies), ``state`` (checkpoint, state-folder lock, results file), ``operations`` and
``pki`` (status, progress, reports, compliance; onboarding kits), ``serving`` (the gRPC service
and its core) beside ``simulation`` (one-process and Ray simulation, the one place that also
imports the silo), and ``cli`` (the ``coordinator`` command).
"""
