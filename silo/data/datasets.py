"""Find and load the graph dataset a silo operator points ``--data`` at: a prepared folder
(`silo data prepare`, docs/data/format.md) or a TU folder."""

from __future__ import annotations

from pathlib import Path

from trellis.silo.data.prepared.folder import is_prepared_folder, load_prepared
from trellis.silo.data.tu import GraphDataset, load_tu_folder, locate_tu_folder

__all__ = ["load_graph_folder", "locate_tu_folder"]


def load_graph_folder(folder: Path) -> GraphDataset:
    """Load a prepared folder, or else the TU dataset found by `locate_tu_folder`."""
    if is_prepared_folder(folder):
        return load_prepared(folder)
    return load_tu_folder(locate_tu_folder(folder))
