"""The models a silo trains and the kernels under them: the papers' graph classifiers, FedHGN's
RGCN, dense and sparse products, packed mini-batches, dropout masks shared across processes.

May import: ``trellis.silo.data``, ``trellis.protos`` and ``trellis.crypto`` (its durable files
and locks, for the dense layers' kernel choice); never training, privacy, the federation protocol,
operations or the command line.
"""
