"""Which source reads each input format, and which format an input is when none is named.

Each reader is named as "module:function" and imported only when used, so a format whose
libraries (RDKit, rdflib) are not installed fails in one line naming the extra that brings
them, and the others work without them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trellis.silo.data.prepared.model import Featuriser, SourceOptions
from trellis.silo.data.tu import DataFormatError, locate_tu_folder

READERS: dict[str, str] = {
    "tu": "trellis.silo.data.prepared.tu_source:read",
    "smiles": "trellis.silo.data.molecules.smiles:read",
    "sdf": "trellis.silo.data.molecules.sdf:read",
    "ogb": "trellis.silo.data.graph_sources.ogb:read",
    "pyg": "trellis.silo.data.graph_sources.pyg:read",
    "networkx": "trellis.silo.data.graph_sources.networkx_files:read",
    "edgelist": "trellis.silo.data.graph_sources.edge_list:read",
    "rdf": "trellis.silo.data.rdf.read:read_rdf",
}
# RDF becomes one heterogeneous graph (write_prepared_hetero), not a set of graphs.
HETERO_FORMATS = frozenset({"rdf"})
# Molecules: their manifest records the reference-set fingerprint of their featuriser.
MOLECULE_FORMATS = frozenset({"smiles", "sdf"})
SUFFIXES = {".csv": "smiles", ".tsv": "smiles", ".sdf": "sdf", ".sd": "sdf", ".pt": "pyg",
            ".gml": "networkx", ".graphml": "networkx", ".gexf": "networkx",
            ".json": "networkx", ".nt": "rdf", ".ttl": "rdf", ".n3": "rdf",
            ".edgelist": "edgelist", ".edges": "edgelist"}
# The optional packages a format needs, and how to get them.
EXTRA_PACKAGES = ("rdkit", "rdflib")
INSTALL_HINT = "pip install 'trellis-fgl[data]'"
FINGERPRINT = "trellis.silo.data.molecules.fingerprint:reference_fingerprint"
MOLECULE_FEATURISER = "trellis.silo.data.molecules.features:featuriser"


class SourceUnavailable(DataFormatError):
    """A format whose reader is not part of this version, or whose libraries are missing."""


def format_choices() -> str:
    """The format names, for messages and --help."""
    return ", ".join(READERS)


def detect_format(source: Path) -> str:
    """The format of `source`, from its layout (a folder) or its extension (a file)."""
    source = Path(source)
    if not source.exists():
        raise DataFormatError(f"{source}: no such file or folder")
    if source.is_dir():
        if _is_tu_folder(source):
            return "tu"
        if _is_ogb_folder(source):
            return "ogb"
        raise DataFormatError(f"{source}: a folder that is neither a TU dataset (DS_A.txt) nor "
                              f"an OGB dataset (mapping/ and raw/); name its format with "
                              f"--format ({format_choices()})")
    suffixes = [s.lower() for s in source.suffixes]
    if suffixes[-1:] == [".gz"] and len(suffixes) > 1:
        suffixes.pop()                 # x.nt.gz: the format of what is compressed
    found = SUFFIXES.get(suffixes[-1]) if suffixes else None
    if found is None:
        raise DataFormatError(f"{source}: cannot tell the format from its name; name it with "
                              f"--format ({format_choices()})")
    return found


def reader(fmt: str) -> Callable[[Path, SourceOptions], Any]:
    """The reader function of a format, imported now (SourceUnavailable when it cannot be)."""
    if fmt not in READERS:
        raise DataFormatError(f"--format {fmt!r}: valid choices: {format_choices()}")
    return _load(READERS[fmt], f"format {fmt}")


def missing_package(exc: ModuleNotFoundError, what: str) -> SourceUnavailable:
    """The one line for a library a reader imported lazily and did not find."""
    package = (exc.name or "").split(".")[0]
    if package in EXTRA_PACKAGES:
        return SourceUnavailable(f"{what} needs {package}, which is not installed: "
                                 f"{INSTALL_HINT}")
    return SourceUnavailable(f"{what} needs the Python package {exc.name!r}, which is not "
                             "installed")


def reference_fingerprint(featuriser: Featuriser) -> str:
    """The reference-set fingerprint of a molecule featuriser (silo/data/molecules)."""
    compute = _load(FINGERPRINT, "the reference-set fingerprint")
    return str(compute(featuriser))


def molecule_featuriser(*, standardise: bool) -> Featuriser:
    """The molecule featuriser `silo data prepare` uses with these settings."""
    make = _load(MOLECULE_FEATURISER, "the molecule featuriser")
    made: Featuriser = make(standardise=standardise)
    return made


def _load(target: str, what: str) -> Callable[..., Any]:
    module_name, _, function = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # The reader's own module (or its package) missing: another version's format.
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise SourceUnavailable(f"{what} is not available in this version") from None
        raise missing_package(exc, what) from None
    found = getattr(module, function, None)
    if not callable(found):
        raise SourceUnavailable(f"{what} is not available in this version")
    return found


def _is_tu_folder(folder: Path) -> bool:
    try:
        locate_tu_folder(folder)
    except DataFormatError:
        return False
    return True


def _is_ogb_folder(folder: Path) -> bool:
    """OGB's layout (mapping/ next to raw/ or split/), or at least its raw/edge.csv[.gz]."""
    if (folder / "mapping").is_dir() and ((folder / "raw").is_dir()
                                          or (folder / "split").is_dir()):
        return True
    return any((folder / "raw" / name).is_file() for name in ("edge.csv.gz", "edge.csv"))
