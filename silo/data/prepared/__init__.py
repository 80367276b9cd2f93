"""Prepared datasets: the documented, non-pickle folder format that `silo data prepare` writes
(a manifest and numpy arrays), the values every source returns, and reading them back.

May import what ``trellis.silo.data`` may: ``trellis.protos``, ``trellis.crypto``,
``trellis.silo.progress_bar``, numpy, torch and torch_geometric; never the models, training,
privacy, the federation protocol, operations or the command line.
"""
