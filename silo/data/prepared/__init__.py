"""A site's own data, prepared once into the documented folder format that training reads.

`model` holds the values every source returns (graphs, refused rows, the featuriser); `folder`
writes and reads a prepared folder (manifest.json + graphs.npz, docs/data/format.md); `registry`
names the source of each input format and guesses the format of an input; `tu_source` is the TU
folder as a source; `inspect` tells what the federation will see of a prepared folder.

Part of the data layer: may import ``trellis.protos``, ``trellis.crypto``,
``trellis.silo.progress_bar`` and the rest of ``trellis.silo.data``; never the models, training,
privacy, the federation protocol, operations or the command line. RDKit and rdflib are imported
only by the sources that need them, lazily, so importing this package never loads them.
"""
