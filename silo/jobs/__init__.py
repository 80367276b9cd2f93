"""A standing silo's jobs: deciding each job the coordinator offers, the record of answers, and
the loop of `silo serve` that takes part in the jobs approved.

``silo serve`` is offered jobs that operators submitted: a public plan with the operator's
signed statement (protos/submission.py). ``approval`` decides an offer against the federation
CA, the operator's signature and the silo's policy (its ``[jobs]`` table included), with no I/O
of its own; ``store`` keeps every offer and answer in the site's SQLite file, which ``silo
jobs`` reads and answers by hand; ``standing`` watches the coordinator's jobs over gRPC,
answers, and runs each approved job in a ``silo join --job`` process of its own.

The layer above ``federation`` (it starts federations, as processes). ``approval`` and
``store`` import only ``trellis.silo.privacy`` (the policy), ``trellis.protos`` and
``trellis.crypto``: never torch, gRPC, the federation protocol or the command line.
"""
