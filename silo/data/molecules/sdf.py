"""SD files -> prepared molecule graphs, one Refusal per record that is not one.

Records are numbered from 1 in file order (blank records, such as blank lines after the last
``$$$$``, are not counted); a refusal names the record's number as its row and, in its reason,
the line the record starts on and its name (the record's first line). Each record is read on its
own, so a broken one is that record's refusal and the next is read. A file that ends inside a
record (no ``$$$$`` after it) refuses that last record as truncated, even when RDKit could read
what there is of it. Hydrogens are removed (RDKit's default), as for SMILES.

The label comes from ``--label-property P`` (a data item ``> <P>`` of each record; a record
without it is refused) or from ``--labels FILE``: a CSV with an id column (``--id-column``,
default "id") and a label column (``--label-column``, default "label"), matched to each record
by its name. Matching by name, not by position, means a record dropped or reordered on the way
can never shift every label after it.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
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
from trellis.silo.data.molecules.smiles import column_index, read_rows, separator_for
from trellis.silo.data.prepared.model import (
    Preparation,
    PreparedGraph,
    Refusal,
    SourceOptions,
)
from trellis.silo.data.tu import DataFormatError

END = b"$$$$"
_IN_RECORD_LINE = re.compile(r"\b(on|at) line (\d+)")


@dataclass(frozen=True)
class Record:
    """One SD record's text and where it is in the file."""

    number: int         # 1-based, blank records not counted
    line: int           # the line it starts on
    text: bytes
    complete: bool      # ended by a $$$$ line

    @property
    def title(self) -> str:
        """The record's first line: the molecule's name, if it has one."""
        return self.text.split(b"\n", 1)[0].decode("utf-8", "replace").strip()


def records(source: Path) -> Iterator[Record]:
    """Every non-blank record of an SD file, in order."""
    try:
        with source.open("rb") as handle:
            lines: list[bytes] = []
            start, number = 1, 0
            for line_no, line in enumerate(handle, start=1):
                lines.append(line)
                if line.rstrip(b"\r\n").strip() != END:
                    continue
                if any(raw.strip() for raw in lines[:-1]):
                    number += 1
                    yield Record(number, start, b"".join(lines), True)
                lines, start = [], line_no + 1
            if any(raw.strip() for raw in lines):
                yield Record(number + 1, start, b"".join(lines), False)
    except OSError as exc:
        raise DataFormatError(f"{source.name}: cannot be read ({exc.strerror})") from None


def read(source: Path, options: SourceOptions) -> Preparation:
    """Read an SD file into molecule graphs; every unusable record becomes a Refusal."""
    chem = rdkit_chem(source.name)
    if bool(options.label_property) == (options.labels is not None):
        raise DataFormatError(f"{source.name}: give the labels either with --label-property "
                              "(a data item of each record) or with --labels (a CSV of "
                              "id,label), " + ("not both" if options.label_property
                                               else "one of them"))
    labels = None
    if options.labels is not None:
        labels = (options.labels.name, read_label_table(options.labels, options))
    graphs: list[PreparedGraph] = []
    refused: list[Refusal] = []
    with rdkit_messages() as log:
        for record in records(source):
            graph_or_why = _record_graph(chem, log, record, source, options, labels)
            if isinstance(graph_or_why, str):
                where = f"at line {record.line}" + (f" ({shown(record.title)})"
                                                    if record.title else "")
                refused.append(Refusal(source.name, str(record.number),
                                       f"{where}: {graph_or_why}"))
            else:
                graphs.append(graph_or_why)
    sources = [source] + ([options.labels] if options.labels is not None else [])
    return molecule_preparation(graphs, refused, options, sources, options.name or source.stem)


def read_label_table(path: Path, options: SourceOptions) -> dict[str, tuple[int, str]]:
    """--labels: molecule name -> (line, label text); DataFormatError for a name given twice."""
    rows = read_rows(path, separator_for(path, options, default=","))
    header = next(rows, None)
    id_name = options.id_column or "id"
    if header is None:
        raise DataFormatError(f"{path.name}: empty: expected a header line naming the columns "
                              f"({id_name!r}, {options.label_column!r})")
    id_at = column_index(header[1], id_name, "--id-column", path)
    label_at = column_index(header[1], options.label_column, "--label-column", path)
    table: dict[str, tuple[int, str]] = {}
    for line, cells in rows:
        if max(id_at, label_at) >= len(cells):
            raise DataFormatError(f"{path.name}: line {line}: {len(cells)} cells where the "
                                  f"header has {len(header[1])}")
        name = cells[id_at].strip()
        if name in table:
            raise DataFormatError(f"{path.name}: line {line}: id {shown(name)} again (first "
                                  f"on line {table[name][0]}); each molecule has one label")
        table[name] = (line, cells[label_at].strip())
    return table


def _record_graph(chem: ModuleType, log: list[str], record: Record, source: Path,
                  options: SourceOptions,
                  labels: tuple[str, dict[str, tuple[int, str]]] | None) -> PreparedGraph | str:
    """The record's graph, or why it is refused (one line)."""
    log.clear()
    mol = next(iter(chem.ForwardSDMolSupplier(io.BytesIO(record.text))), None)
    truncated = "" if record.complete else "truncated: the file ends inside this record, " \
                                           "before its '$$$$' line"
    if mol is None:
        # RDKit counts lines from the record's start; say the file's line instead.
        why = _IN_RECORD_LINE.sub(lambda m: f"{m[1]} line {int(m[2]) + record.line - 1}",
                                  rdkit_reason(log, "RDKit cannot read it"))
        return f"{truncated} ({why})" if truncated else why
    if truncated:
        return truncated
    if labels is None:
        prop = options.label_property
        if not mol.HasProp(prop):
            have = ", ".join(repr(p) for p in mol.GetPropNames()) or "none"
            return f"no property {prop!r} (the record has {have})"
        text, what = mol.GetProp(prop).strip(), f"property {prop!r}"
    else:
        table_name, table = labels
        name = record.title
        if not name:
            return "the record has no name (its first line), so --labels cannot label it"
        if name not in table:
            return f"no label for {shown(name)} in {table_name}"
        line, text = table[name]
        what = f"{table_name} line {line}"
    label = parse_label(text)
    if label is None:
        return f"label {shown(text)} ({what}) is not an integer (or true/false)"
    try:
        return prepared_graph(mol, label=label, origin=f"{source.name}:{record.number}",
                              options=options)
    except MoleculeRefused as exc:
        return str(exc)
