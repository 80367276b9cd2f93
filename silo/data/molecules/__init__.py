"""Molecules with RDKit: the OGB atom and bond featuriser (features.py), the SMILES table and SD
file sources (smiles.py, sdf.py) and the reference-set fingerprint a plan may name
(reference.smi, fingerprint.py).

RDKit is an optional extra (``pip install 'trellis-fgl[data]'``): nothing here imports it at
module level, so ``import trellis.silo.data`` never loads it; a source that needs it and does not
find it says so in one line (rdkit_support.py).

May import: ``trellis.protos``, ``trellis.crypto``, ``trellis.silo.progress_bar``, the rest of
``trellis.silo.data`` and RDKit; never the models, training, privacy, the federation protocol,
operations or the command line.
"""
