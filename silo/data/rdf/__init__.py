"""RDF knowledge graphs (N-Triples, Turtle, N3) -> our heterogeneous graph folder, as the FedHGN
paper's datasets (AIFB, MUTAG, BGS of the RGCN benchmark) were built (docs/data/rdf.md).

May import what ``trellis.silo.data`` may; rdflib only lazily (inside `parse.load_triples`), so
importing this package never needs the optional ``data`` extra.
"""
