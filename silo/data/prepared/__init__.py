"""The prepared-dataset folder format (manifest.json + arrays) and the values sources return.

May import what ``trellis.silo.data`` may: ``trellis.protos``, ``trellis.crypto``,
``trellis.silo.progress_bar``, numpy, torch and torch_geometric; rdkit and rdflib only lazily,
inside the sources that need them.
"""
