"""The in-memory values every data source returns and `silo data prepare` writes out.

A source is ``read(source: Path, options: SourceOptions) -> Preparation``: it turns one input
(a SMILES table, an SDF file, a TU folder, ...) into graphs with numeric features, and every
input row it could not use into a Refusal with its reason, instead of dropping it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Refusal:
    """One input row a source could not turn into a graph, and why."""

    source: str          # file name (not the full path)
    row: str             # "12" (1-based line/record/row number as the user counts it) or an id
    reason: str          # one line: "invalid SMILES 'C1CC': unclosed ring",
                         # "label column 'y' is empty"


@dataclass
class PreparedGraph:
    """One graph as arrays: node features, both directions of every edge, its raw label."""

    x: np.ndarray                  # float32 [n, F] node features (n >= 1)
    edge_index: np.ndarray         # int64 [2, e], both directions of every undirected edge
    edge_attr: np.ndarray | None   # float32 [e, B] or None
    label: int                     # the raw graph label as an int (class index comes later)
    origin: str                    # "molecules.csv:12" (file:row) for messages and duplicates
    key: str = ""                  # a canonical identity for duplicate detection (canonical
                                   # SMILES for molecules; "" if none)


@dataclass(frozen=True)
class Featuriser:
    """How inputs became features: two sites whose featurisers differ train on different inputs."""

    name: str                      # "ogb-atom-bond", "tu-one-hot", "pyg-as-given", ...
    version: str                   # bumped whenever the features of the same input change
    settings: dict[str, Any]       # every option that changes features (standardise, ...)


@dataclass
class Preparation:
    """What a source made of its input: the graphs, the refused rows and how it featurised."""

    graphs: list[PreparedGraph]
    refused: list[Refusal]
    featuriser: Featuriser
    sources: list[Path]            # every input file read (their SHA-256 go in the manifest)
    name: str                      # dataset name (default: the source's stem)
    split: dict[str, np.ndarray] | None = None   # {"train","val","test"} -> int64 indices
                                                  # into graphs (a scaffold split), or None
    split_kind: str = ""           # "scaffold" ...
    notes: list[str] = field(default_factory=list)  # e.g. "standardised: 12 salts stripped"


@dataclass(frozen=True)
class SourceOptions:
    """Everything `silo data prepare` can pass a source (each source reads what it needs)."""

    format: str = ""               # "", "tu", "smiles", "sdf", "ogb", "pyg", "networkx",
                                   # "edgelist", "rdf"
    smiles_column: str = "smiles"
    label_column: str = "label"
    id_column: str = ""
    separator: str = ""            # "" = by extension: "," for .csv, "\t" for .tsv/.tab/.txt
    label_property: str = ""       # SDF: the property holding the label
    labels: Path | None = None     # SDF / graph files: a separate CSV of labels (id,label or
                                   # row order)
    standardise: bool = False      # molecules: strip salts, neutralise charges (helper F)
    scaffold_split: bool = False   # molecules: Bemis-Murcko scaffold split 80/10/10 (helper F)
    node_labels: Path | None = None      # edge list: node label file
    graph_labels: Path | None = None     # edge list: graph label file
    graph_indicator: Path | None = None  # edge list: node -> graph file
    entity_class: str = ""         # RDF: the class (URI) of the entities to classify
    label_predicate: str = ""      # RDF: the predicate (URI) holding their label
    classes: tuple[str, ...] = ()  # RDF: the class values in index order, fixed in advance
    name: str = ""                 # dataset name override
