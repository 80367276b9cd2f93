"""Silo agent: what an organisation runs beside its own graphs.

Sub-packages, from the bottom up (each may import only those below it; pyproject.toml's
import-linter contracts hold it): ``data`` (reading and cutting graph folders, structure
embeddings), ``models`` (the papers' models and their kernels), ``privacy`` (the operator's
policy, differential privacy), ``training`` (local training, the final model, offline
prediction), ``operations`` (what the operator reads: status, metrics, the audit report),
``federation`` (the protocol: session, driver, gRPC link, agent) and ``cli`` (the ``silo``
command). ``progress_bar`` is a small utility any layer may use.
"""
