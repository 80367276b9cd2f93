"""A standing coordinator and its jobs: the deployment file, the job plans operators submit,
the job table that survives a restart, the pure scheduler, and what runs them: the job host,
each running job's federation, the router and the Admin and Site services on one port.

A standing coordinator is started once with a ``deployment.toml`` (``deployment``: where it
listens, which silos it admits, which operators may submit) and runs many jobs, each from a
signed plan without deployment sections (``job_plan``). Jobs live in SQLite (``store``) so that a
coordinator killed at any moment restarts where it was; which job moves next is decided by
``scheduler``, from the jobs and the silos' answers alone (no I/O, no clock of its own). The
``host`` carries out those moves; each running job's federation (``runtime``) is what
``coordinator serve --plan`` runs, served through the ``routing`` of one server
(``standing``). ``client`` is the operator's side (``coordinator jobs``, notebooks).

Needs no torch. The layer above ``serving`` (it runs federations on it): may import
``serving``, ``operations``, ``state``, ``rounds``, ``trellis.protos`` and ``trellis.crypto``;
never ``simulation`` or the command line. ``deployment``, ``job_plan``, ``records``, ``store``
and ``scheduler`` import neither gRPC nor ``serving``.
"""
