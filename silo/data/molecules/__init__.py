"""Molecules with RDKit: reading SMILES and SDF, the OGB atom and bond featuriser, optional
standardisation and Bemis-Murcko scaffold splits.

RDKit is an optional extra (``pip install 'trellis-fgl[data]'``): its modules import it, and
nothing outside this package does, so ``import trellis.silo.data`` never loads it. May import
what ``trellis.silo.data`` may, and rdkit.
"""
