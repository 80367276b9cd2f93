"""The prepared-dataset folder format (manifest.json + graphs.npz) and the values every data
source returns (model.py).

May import: ``trellis.protos``, ``trellis.crypto``, ``trellis.silo.progress_bar`` and the rest of
``trellis.silo.data``; never the models, training, privacy, the federation protocol, operations
or the command line.
"""
