"""Graph data on a silo: reading TU-format and heterogeneous folders, cutting them into silos
and splits, synthetic demo data, and FedStar's structure embeddings.

May import: ``trellis.protos``, ``trellis.crypto`` and ``trellis.silo.progress_bar``; never the
models, training, privacy, the federation protocol, operations or the command line.
"""
