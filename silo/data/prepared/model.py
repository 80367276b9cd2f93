"""The in-memory values every data source returns: prepared graphs, refused rows, the featuriser
that made the features, and the options `silo data prepare` passes a source."""

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
    # one line: "invalid SMILES 'C1CC': unclosed ring", "label column 'y' is empty"
    reason: str


@dataclass
class PreparedGraph:
    """One graph as a source read it."""

    x: np.ndarray                  # float32 [n, F] node features (n >= 1)
    edge_index: np.ndarray         # int64 [2, e], both directions of every undirected edge
    edge_attr: np.ndarray | None   # float32 [e, B] or None
    label: int                     # the raw graph label as an int (class index comes later)
    origin: str                    # "molecules.csv:12" (file:row) for messages and duplicates
    key: str = ""                  # a canonical identity for duplicate detection (canonical
                                   # SMILES for molecules; "" if none)


@dataclass(frozen=True)
class Featuriser:
    """What turned the input into features: a name, a version and the options that matter."""

    name: str                      # "ogb-atom-bond", "tu-one-hot", "pyg-as-given", ...
    version: str                   # bumped whenever the features of the same input change
    settings: dict[str, Any]       # every option that changes features (standardise, ...)


@dataclass
class Preparation:
    """Everything one source read: the graphs, the refused rows and where they came from."""

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
    """Everything `silo data prepare` can pass a source."""

    # "", "tu", "smiles", "sdf", "ogb", "pyg", "networkx", "edgelist", "rdf"
    format: str = ""
    smiles_column: str = "smiles"
    label_column: str = "label"
    id_column: str = ""
    separator: str = ""            # "" = by extension: "," for .csv, "\t" for .tsv/.tab/.txt
    label_property: str = ""       # SDF: the property holding the label
    # SDF / graph files: a separate CSV of labels (id,label or row order)
    labels: Path | None = None
    standardise: bool = False      # molecules: strip salts, neutralise charges (helper F)
    scaffold_split: bool = False   # molecules: Bemis-Murcko scaffold split 80/10/10 (helper F)
    node_labels: Path | None = None      # edge list: node label file
    graph_labels: Path | None = None     # edge list: graph label file
    graph_indicator: Path | None = None  # edge list: node -> graph file
    entity_class: str = ""         # RDF: the class (URI) of the entities to classify
    label_predicate: str = ""      # RDF: the predicate (URI) holding their label
    name: str = ""                 # dataset name override
