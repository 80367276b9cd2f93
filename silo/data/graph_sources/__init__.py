"""Graph sources a site may already keep its graphs in, each read into a ``Preparation``: an OGB
graph-property folder (``ogb``), a list of PyG ``Data`` saved with torch (``pyg``), NetworkX
files -- GraphML, GML, GEXF, node-link JSON (``networkx_files``) -- and an edge list with node
and graph label files (``edge_list``). Each module is ``read(source, options) -> Preparation``:
a bad row becomes a ``Refusal``; input that cannot be trusted as a whole raises
``DataFormatError`` naming the file and line.

May import what ``trellis.silo.data`` may import (numpy, torch, torch_geometric, networkx, the
protos and crypto packages) and ``trellis.silo.data.prepared``; never the models, training,
privacy, federation, operations or command line.
"""
