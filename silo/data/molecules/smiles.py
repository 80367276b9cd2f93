"""SMILES tables (CSV/TSV) -> prepared molecule graphs, one Refusal per row that is not one.

Rows are counted as the file's lines, the header being line 1, so the first molecule is
"line 2" (a quoted cell running over several lines counts them all; a row's number is the line
it ends on). Blank lines are skipped. The separator comes from ``--separator`` or the extension:
"," for .csv, a tab for .tsv, .tab and .txt. A row is refused, never fatal, for: an empty SMILES
cell, a SMILES with a space inside, a SMILES RDKit cannot read (with RDKit's reason), an empty
or non-integer label (integers, or true/false), a row with more or fewer cells than the header.
A missing column, an empty file or text that is not UTF-8 stops the whole file
(DataFormatError).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from trellis.protos.fields import shown
from trellis.silo.data.molecules.features import (
    MoleculeRefused,
    molecule_preparation,
    prepared_graph,
)
from trellis.silo.data.molecules.labels import parse_label
from trellis.silo.data.molecules.rdkit_support import rdkit_chem, rdkit_messages, rdkit_reason
from trellis.silo.data.prepared.model import (
    Preparation,
    PreparedGraph,
    Refusal,
    SourceOptions,
)
from trellis.silo.data.tu import DataFormatError

SEPARATORS = {".csv": ",", ".tsv": "\t", ".tab": "\t", ".txt": "\t"}


def separator_for(source: Path, options: SourceOptions, default: str = "") -> str:
    """The cell separator: the option's, else the extension's, else `default`."""
    if options.separator:
        return "\t" if options.separator in ("\\t", "tab") else options.separator
    found = SEPARATORS.get(source.suffix.lower(), default)
    if not found:
        raise DataFormatError(f"{source.name}: cannot tell the separator from the extension "
                              f"{source.suffix or '(none)'!r}; name it with --separator "
                              "(',' or 'tab')")
    return found


def read_rows(source: Path, separator: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) of every non-blank row, the header first; DataFormatError when the
    file cannot be read as text."""
    reader = None
    try:
        with source.open(encoding="utf-8-sig", newline="") as handle:
            reader = csv.reader(handle, delimiter=separator, strict=True)
            for cells in reader:
                if any(cell.strip() for cell in cells):
                    yield reader.line_num, cells
    except OSError as exc:
        raise DataFormatError(f"{source.name}: cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError:
        after = f" after line {reader.line_num}" if reader is not None else ""
        raise DataFormatError(f"{source.name}: not UTF-8 text (a byte that is not UTF-8"
                              f"{after}); save it as UTF-8") from None
    except csv.Error as exc:
        line = reader.line_num if reader is not None else 1
        raise DataFormatError(f"{source.name}: line {line}: {exc}") from None


def column_index(header: list[str], column: str, option: str, source: Path) -> int:
    """Where `column` is in the header, or DataFormatError naming the columns there are."""
    names = [name.strip() for name in header]
    if column in names:
        return names.index(column)
    found = ", ".join(repr(n) for n in names) or "none"
    raise DataFormatError(f"{source.name}: line 1: no column {column!r} (the header has "
                          f"{found}); name the right one with {option}")


def read(source: Path, options: SourceOptions) -> Preparation:
    """Read a SMILES table into molecule graphs; every unusable row becomes a Refusal."""
    chem = rdkit_chem(source.name)
    rows = read_rows(source, separator_for(source, options))
    header = next(rows, None)
    if header is None:
        raise DataFormatError(f"{source.name}: empty: expected a header line naming the "
                              f"columns ({options.smiles_column!r}, {options.label_column!r})")
    names = header[1]
    smiles_at = column_index(names, options.smiles_column, "--smiles-column", source)
    label_at = column_index(names, options.label_column, "--label-column", source)
    id_at = (column_index(names, options.id_column, "--id-column", source)
             if options.id_column else None)
    graphs: list[PreparedGraph] = []
    refused: list[Refusal] = []
    with rdkit_messages() as log:
        for line, cells in rows:
            where = f"{source.name}:{line}"
            if id_at is not None and id_at < len(cells) and cells[id_at].strip():
                where += f" (id {cells[id_at].strip()})"
            graph_or_why = _row_graph(chem, log, cells, len(names), smiles_at, label_at,
                                      where, options)
            if isinstance(graph_or_why, str):
                refused.append(Refusal(source.name, str(line), graph_or_why))
            else:
                graphs.append(graph_or_why)
    return molecule_preparation(graphs, refused, options, [source], options.name or source.stem)


def _row_graph(chem: ModuleType, log: list[str], cells: list[str], width: int,
               smiles_at: int, label_at: int, where: str,
               options: SourceOptions) -> PreparedGraph | str:
    """The row's graph, or why it is refused (one line)."""
    if len(cells) != width:
        return f"{len(cells)} cells where the header has {width}"
    text = cells[smiles_at].strip()
    if not text:
        return f"SMILES column {options.smiles_column!r} is empty"
    if len(text.split()) > 1:
        # RDKit would read up to the first space and take the rest as a name: refuse instead.
        return f"SMILES {shown(text)} has a space or line break inside it"
    label_text = cells[label_at].strip()
    if not label_text:
        return f"label column {options.label_column!r} is empty"
    label = parse_label(label_text)
    if label is None:
        return (f"label {shown(label_text)} in column {options.label_column!r} is not an "
                "integer (or true/false)")
    log.clear()
    mol = chem.MolFromSmiles(text)
    if mol is None:
        return f"invalid SMILES {shown(text)}: {rdkit_reason(log, 'RDKit cannot read it')}"
    try:
        return prepared_graph(mol, label=label, origin=where, options=options)
    except MoleculeRefused as exc:
        return f"SMILES {shown(text)}: {exc}"
