"""A TU-format folder as a data source: the graphs today's TU loader makes, as a Preparation.

The node features are exactly those `silo join` builds from the folder directly (one-hot node
labels, else the node attributes, else one-hot degrees; silo/data/tu.py), so a prepared TU
folder trains as the folder itself does. The TU reader accepts a folder whole or not at all, so
nothing is refused row by row: a bad line is a DataFormatError naming file and line.
"""

from __future__ import annotations

from pathlib import Path

from trellis.silo.data.prepared.model import Featuriser, Preparation, PreparedGraph, SourceOptions
from trellis.silo.data.tu import find_tu_prefix, load_tu_folder, locate_tu_folder

FEATURISER = "tu-one-hot"
VERSION = "1"


def read(source: Path, options: SourceOptions) -> Preparation:
    """The TU dataset in `source` (or its only TU subfolder) as prepared graphs."""
    folder = locate_tu_folder(Path(source))
    prefix = find_tu_prefix(folder)
    dataset = load_tu_folder(folder)
    encoding = dataset.encoding                 # always recorded by load_tu_folder
    classes = encoding.classes if encoding is not None else tuple(range(dataset.num_classes))
    labels_file = next(folder.glob(f"{prefix}_graph_labels.txt*")).name
    graphs = [PreparedGraph(x=data.x.numpy(), edge_index=data.edge_index.numpy(),
                            edge_attr=None, label=classes[int(data.y.view(-1)[0])],
                            origin=f"{labels_file}:{line}")
              for line, data in enumerate(dataset.graphs, start=1)]
    files = sorted(p for p in folder.iterdir()
                   if p.is_file() and p.name.startswith(f"{prefix}_")
                   and p.name.endswith((".txt", ".txt.gz")))
    return Preparation(graphs=graphs, refused=[],
                       featuriser=Featuriser(FEATURISER, VERSION,
                                             {"features": dataset.feature_kind}),
                       sources=files, name=options.name or prefix)
