"""A standing coordinator's jobs: its deployment file, the job plans operators submit, the job
table that survives a restart, and the pure scheduler that moves jobs from submission through
the silos' approval to running.

A standing coordinator is started once with a ``deployment.toml`` (``deployment``: where it
listens, which silos it admits, which operators may submit) and runs many jobs, each from a
signed plan without deployment sections (``job_plan``). Jobs live in SQLite (``store``) so that a
coordinator killed at any moment restarts where it was; which job moves next is decided by
``scheduler``, from the jobs and the silos' answers alone (no I/O, no clock of its own).

Needs no torch. May import ``trellis.coordinator.state``, ``trellis.coordinator.rounds``,
``trellis.protos`` and ``trellis.crypto`` (and the standard library's ``sqlite3``); never gRPC,
serving, operations, simulation or the command line.
"""
