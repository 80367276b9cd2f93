"""Local training on one silo: the trainer of each algorithm, training on several processes,
the final model file and offline prediction with it.

May import: ``trellis.silo.privacy``, ``trellis.silo.models``, ``trellis.silo.data``,
``trellis.protos`` and ``trellis.crypto``; never the federation protocol, operations or the
command line.
"""
