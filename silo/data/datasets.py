"""Find and load the graph dataset a silo operator points ``--data`` at."""

from __future__ import annotations

from pathlib import Path

from trellis.silo.data.tu import DataFormatError, GraphDataset, find_tu_prefix, load_tu_folder


def locate_tu_folder(folder: Path) -> Path:
    """The TU dataset folder: `folder` itself, or its only subfolder holding a TU dataset."""
    if not folder.is_dir():
        raise DataFormatError(f"{folder}: no such data folder")
    try:
        find_tu_prefix(folder)
        return folder
    except DataFormatError:
        candidates = []
        for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
            try:
                find_tu_prefix(sub)
            except DataFormatError:
                continue
            candidates.append(sub)
        if len(candidates) == 1:
            return candidates[0]
        if len(candidates) > 1:
            raise DataFormatError(f"{folder}: several TU datasets ("
                                  + ", ".join(c.name for c in candidates)
                                  + "); point --data at one of them") from None
        raise


def load_graph_folder(folder: Path) -> GraphDataset:
    """Load the TU dataset found by `locate_tu_folder`."""
    return load_tu_folder(locate_tu_folder(folder))
