"""Load TU-format graph classification folders with the semantics of PyG's ``TUDataset``.

Over 400 lines because loading a folder is one validation pass: the text-table reader (chunked,
vectorised, naming the first bad line) and the checks of PyG's semantics (label offsets, one-hot
widths, graph indicators) raise the same DataFormatError with file and line, and are tested as
one loader.
"""

from __future__ import annotations

import gzip
import json
import re
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trellis.silo.data.graph import Graph

FEATURE_CHOICES = ("auto", "node_labels", "node_attributes", "degree")

# Files are validated and parsed in chunks of about this many bytes (cut at line ends),
# which bounds the temporary arrays for COLLAB's 350 MB adjacency file.
_CHUNK_BYTES = 1 << 24

# Character classes for the vectorised structure check.
_INVALID, _NUMBER, _BLANK, _COMMA, _NEWLINE = 0, 1, 2, 3, 4


def _char_classes(number_chars: bytes) -> np.ndarray:
    table = np.full(256, _INVALID, dtype=np.uint8)
    table[np.frombuffer(number_chars, dtype=np.uint8)] = _NUMBER
    table[np.frombuffer(b" \t\r", dtype=np.uint8)] = _BLANK
    table[ord(",")] = _COMMA
    table[ord("\n")] = _NEWLINE
    return table


_INT_CLASSES = _char_classes(b"0123456789+-")
_FLOAT_CLASSES = _char_classes(b"0123456789+-.eE")
_DIGIT_OR_POINT = np.zeros(256, dtype=bool)
_DIGIT_OR_POINT[np.frombuffer(b"0123456789.", dtype=np.uint8)] = True
_COUNT_WORDS = {2: "two", 3: "three", 4: "four"}
# The optional per-node files: the number type of their values and how an error names one.
_NODE_TABLES: dict[str, tuple[type, str]] = {"node_labels": (int, "integer node label"),
                                             "node_attributes": (float, "number")}
_INT_TOKEN = re.compile(rb"[+-]?\d+")
_FLOAT_TOKEN = re.compile(rb"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


class DataFormatError(ValueError):
    """A data folder is malformed; the message names the file and (1-based) line."""


@dataclass(frozen=True)
class FeatureEncoding:
    """How a dataset's nodes and labels became tensors: what a model trained on it expects.

    ``classes`` are the raw graph labels in class-index order; for one-hot node labels,
    ``label_low`` and ``label_widths`` give each label column's smallest value and number of
    one-hot slots; for one-hot degrees, ``max_degree`` is the last slot (larger degrees share it).
    For a prepared folder (kind ``prepared``), ``featuriser`` is its manifest's featuriser (name,
    version, settings) as canonical JSON: a folder to predict on must have been featurised alike.
    """

    kind: str
    width: int
    classes: tuple[int, ...]
    label_low: tuple[int, ...] = ()
    label_widths: tuple[int, ...] = ()
    max_degree: int = 0
    featuriser: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (what a final model file carries)."""
        document: dict[str, Any] = {
            "kind": self.kind, "width": self.width, "classes": list(self.classes),
            "label_low": list(self.label_low), "label_widths": list(self.label_widths),
            "max_degree": self.max_degree}
        if self.featuriser:     # left out otherwise: a TU model's label stays as it was
            document["featuriser"] = json.loads(self.featuriser)
        return document

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> FeatureEncoding:
        """The encoding `to_json` wrote (KeyError/TypeError/ValueError when incomplete)."""
        return cls(str(document["kind"]), int(document["width"]),
                   tuple(int(c) for c in document["classes"]),
                   tuple(int(v) for v in document["label_low"]),
                   tuple(int(v) for v in document["label_widths"]),
                   int(document["max_degree"]), featuriser_json(document.get("featuriser")))


def featuriser_json(featuriser: Any) -> str:
    """A featuriser ({name, version, settings}) as canonical JSON ("" for none), for comparing."""
    if not featuriser:
        return ""
    return json.dumps(featuriser, sort_keys=True, separators=(",", ":"))


@dataclass
class GraphDataset:
    """Graphs of one dataset with their node-feature width and number of classes."""

    name: str
    graphs: list[Graph]
    num_classes: int
    num_features: int
    feature_kind: str
    encoding: FeatureEncoding | None = None
    # A prepared folder's own split ({"train", "val", "test"} -> int64 graph indices), which
    # training uses instead of the stratified one; None for a TU folder.
    split: dict[str, np.ndarray] | None = None


def find_tu_prefix(folder: Path) -> str:
    """Return the dataset prefix DS of the unique ``DS_A.txt[.gz]`` in ``folder``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataFormatError(f"{folder}: no such folder")
    prefixes = set()
    for path in folder.iterdir():
        for suffix in ("_A.txt", "_A.txt.gz"):
            if path.name.endswith(suffix) and len(path.name) > len(suffix):
                prefixes.add(path.name[: -len(suffix)])
    if not prefixes:
        raise DataFormatError(f"{folder}: no TU dataset here (no file named DS_A.txt[.gz])")
    if len(prefixes) > 1:
        names = ", ".join(sorted(prefixes))
        raise DataFormatError(f"{folder}: several TU datasets ({names}); use one per folder")
    return prefixes.pop()


def locate_tu_folder(folder: Path) -> Path:
    """The TU dataset folder: `folder` itself, or its only subfolder holding a TU dataset."""
    folder = Path(folder)
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


def load_tu_folder(
    folder: Path, *, features: str = "auto", max_degree: int | None = None,
    encoding: FeatureEncoding | None = None,
) -> GraphDataset:
    """Load the TU dataset in ``folder`` as a list of PyG graphs (self loops dropped, coalesced).

    With ``encoding`` (a trained model's), nodes and labels are encoded exactly as that
    model's training data was; a folder that does not fit it is refused (DataFormatError).
    """
    if encoding is not None:
        features, max_degree = encoding.kind, encoding.max_degree
    if features not in FEATURE_CHOICES:
        raise ValueError(f"features must be one of {', '.join(FEATURE_CHOICES)}; got {features!r}")
    if max_degree is not None and max_degree < 0:
        raise ValueError(f"max_degree must be >= 0; got {max_degree}")
    folder = Path(folder)
    structure = read_tu_structure(folder)
    prefix, raw_labels = structure.prefix, structure.graph_labels
    graph_of_node, edges = structure.graph_of_node, structure.edges
    files = {part: _find_file(folder, prefix, part) for part in ("node_labels", "node_attributes")}
    num_graphs, num_nodes = raw_labels.size, graph_of_node.size

    # Group nodes by graph (a no-op for the usual sorted files) so graphs are contiguous ranges.
    node_order = None
    if np.any(graph_of_node[1:] < graph_of_node[:-1]):
        node_order = np.argsort(graph_of_node, kind="stable")
        new_id = np.empty(num_nodes, dtype=np.int64)
        new_id[node_order] = np.arange(num_nodes)
        edges = new_id[edges]
        graph_of_node = graph_of_node[node_order]
    src, dst = _coalesce(edges, num_nodes)
    out_degree = np.bincount(src, minlength=num_nodes)

    kind = _choose_features(features, files)
    low: np.ndarray = np.zeros(0, np.int64)
    widths: np.ndarray = np.zeros(0, np.int64)
    top = 0
    # `table` holds one-hot positions (int64 [N, columns]) or raw attributes (float32 [N, F]).
    if kind == "node_labels":
        labels = _read_node_table(files[kind], num_nodes, *_NODE_TABLES[kind])
        if encoding is not None:
            _check_node_labels(labels, encoding, files[kind])
            low, widths = np.array(encoding.label_low), np.array(encoding.label_widths)
        else:
            low, widths = labels.min(axis=0), labels.max(axis=0) - labels.min(axis=0) + 1
        table, width = _one_hot_columns(labels if node_order is None else labels[node_order],
                                        low, widths)
    elif kind == "node_attributes":
        values = _read_node_table(files[kind], num_nodes, *_NODE_TABLES[kind])
        table = (values if node_order is None else values[node_order]).astype(np.float32)
        width = table.shape[1]
        if encoding is not None and width != encoding.width:
            raise DataFormatError(f"{prefix}_{kind}.txt: {width} attributes per node; the model "
                                  f"was trained on {encoding.width}")
    else:
        top = int(out_degree.max(initial=0)) if max_degree is None else max_degree
        table, width = np.minimum(out_degree, top)[:, None], top + 1
    one_hot = kind != "node_attributes"

    if encoding is None:
        classes, y = np.unique(raw_labels, return_inverse=True)
    else:
        classes, y = np.array(encoding.classes, np.int64), _class_index(raw_labels, encoding,
                                                                        folder, prefix)
    node_ptr = np.concatenate([[0], np.cumsum(np.bincount(graph_of_node, minlength=num_graphs))])
    edge_ptr = np.searchsorted(src, node_ptr)
    graphs = []
    for g in range(num_graphs):
        n0, n1, e0, e1 = node_ptr[g], node_ptr[g + 1], edge_ptr[g], edge_ptr[g + 1]
        n = int(n1 - n0)
        edge_index = torch.from_numpy(np.stack([src[e0:e1], dst[e0:e1]]) - n0)
        if one_hot:
            x = torch.zeros(n, width, dtype=torch.float32)
            x.scatter_(1, torch.from_numpy(table[n0:n1]), 1.0)
        else:
            x = torch.from_numpy(table[n0:n1].copy())
        label = torch.tensor([y[g]], dtype=torch.long)
        graphs.append(Graph(x=x, edge_index=edge_index, y=label, num_nodes=n))
    return GraphDataset(
        name=prefix,
        graphs=graphs,
        num_classes=int(classes.size),
        num_features=int(width),
        feature_kind=kind,
        encoding=FeatureEncoding(kind, int(width), tuple(int(c) for c in classes),
                                 tuple(int(v) for v in low), tuple(int(v) for v in widths),
                                 top),
    )


def _check_node_labels(labels: np.ndarray, encoding: FeatureEncoding, path: Path | None
                       ) -> None:
    """Refuse node labels a model trained with `encoding` has no one-hot slot for."""
    name = path.name if path is not None else "node_labels"
    if labels.shape[1] != len(encoding.label_low):
        raise DataFormatError(f"{name}: {labels.shape[1]} label column(s) per node; the model "
                              f"was trained on {len(encoding.label_low)}")
    low = np.array(encoding.label_low)
    high = low + np.array(encoding.label_widths) - 1
    bad = np.flatnonzero(((labels < low) | (labels > high)).any(axis=1))
    if bad.size:
        line = int(bad[0])
        raise DataFormatError(
            f"{name} line {line + 1}: node label {labels[line].tolist()} is outside the "
            f"labels the model was trained on ({_ranges(low, high)}); the model cannot encode it")


def _class_index(raw_labels: np.ndarray, encoding: FeatureEncoding, folder: Path, prefix: str
                 ) -> np.ndarray:
    """Each graph's class index under a trained model's classes; unknown labels refused."""
    classes = np.array(encoding.classes, np.int64)
    position = np.searchsorted(classes, raw_labels).clip(0, max(classes.size - 1, 0))
    bad = np.flatnonzero(classes[position] != raw_labels) if classes.size else np.arange(
        raw_labels.size)
    if bad.size:
        line = int(bad[0])
        raise DataFormatError(
            f"{folder / (prefix + '_graph_labels.txt')} line {line + 1}: graph label "
            f"{raw_labels[line]} is not one of the model's classes "
            f"({', '.join(map(str, encoding.classes))}); for graphs whose class is unknown, "
            "write any of them")
    return position


def _ranges(low: np.ndarray, high: np.ndarray) -> str:
    return ", ".join(f"{a}..{b}" for a, b in zip(low.tolist(), high.tolist(), strict=True))


@dataclass(frozen=True, eq=False)
class TuStructure:
    """The checked raw tables every TU folder has (ids 0-based, labels as written)."""

    prefix: str
    graph_labels: np.ndarray  # int64 [G]
    graph_of_node: np.ndarray  # int64 [N]
    edges: np.ndarray  # int64 [E, 2], as listed in the A file


def read_tu_structure(folder: Path) -> TuStructure:
    """Read and check the A, graph_indicator and graph_labels files of a TU folder."""
    folder = Path(folder)
    prefix = find_tu_prefix(folder)
    adjacency, indicator, labels_file = (
        _required_file(folder, prefix, part) for part in ("A", "graph_indicator", "graph_labels")
    )
    graph_labels = _read_table(labels_file, 1, int, "integer graph label")[:, 0]
    graph_of_node = _read_graph_indicator(indicator, graph_labels.size)
    edges = _read_edges(adjacency, graph_of_node, indicator.name)
    return TuStructure(prefix, graph_labels, graph_of_node, edges)


def read_tu_node_table(folder: Path, structure: TuStructure, part: str) -> np.ndarray | None:
    """The node_labels (int) or node_attributes (float) table of a TU folder, if it has one."""
    path = _find_file(Path(folder), structure.prefix, part)
    if path is None:
        return None
    return _read_node_table(path, structure.graph_of_node.size, *_NODE_TABLES[part])


def _required_file(folder: Path, prefix: str, part: str) -> Path:
    path = _find_file(folder, prefix, part)
    if path is None:
        raise DataFormatError(f"{folder}: missing required file {prefix}_{part}.txt[.gz]")
    return path


def _find_file(folder: Path, prefix: str, part: str) -> Path | None:
    plain = folder / f"{prefix}_{part}.txt"
    packed = folder / f"{prefix}_{part}.txt.gz"
    if plain.is_file() and packed.is_file():
        raise DataFormatError(f"{folder}: both {plain.name} and {packed.name} exist; keep one")
    if plain.is_file():
        return plain
    return packed if packed.is_file() else None


def _choose_features(features: str, files: dict[str, Path | None]) -> str:
    if features == "auto":
        if files["node_labels"] is not None:
            return "node_labels"
        return "node_attributes" if files["node_attributes"] is not None else "degree"
    if features != "degree" and files[features] is None:
        raise DataFormatError(f"features={features!r} needs a {features} file, which is missing")
    return features


def _read_graph_indicator(path: Path, num_graphs: int) -> np.ndarray:
    """Return the 0-based graph of every node, checked against the number of graphs."""
    ids = _read_table(path, 1, int, "integer graph id")[:, 0]
    bad = np.flatnonzero((ids < 1) | (ids > num_graphs))
    if bad.size:
        line = int(bad[0])
        raise DataFormatError(
            f"{path.name} line {line + 1}: graph id {ids[line]} is outside 1..{num_graphs} "
            f"(the graph_labels file has {num_graphs} lines)"
        )
    missing = np.flatnonzero(np.bincount(ids - 1, minlength=num_graphs) == 0)
    if missing.size:
        raise DataFormatError(
            f"{path.name}: graph ids must cover 1..{num_graphs}, but graph {missing[0] + 1} "
            f"has no nodes ({missing.size} graph(s) without nodes)"
        )
    return ids - 1


def _read_edges(path: Path, graph_of_node: np.ndarray, indicator_name: str) -> np.ndarray:
    """Return the 0-based edge list [E, 2], with ids in range and no edge between graphs."""
    edges = _read_table(path, 2, int, "node id")
    num_nodes = graph_of_node.size
    bad = np.flatnonzero(((edges < 1) | (edges > num_nodes)).any(axis=1))
    if bad.size:
        line = int(bad[0])
        raise DataFormatError(
            f"{path.name} line {line + 1}: node id out of range 1..{num_nodes} "
            f"({indicator_name} has {num_nodes} nodes), got '{edges[line, 0]}, {edges[line, 1]}'"
        )
    edges = edges - 1
    graphs = graph_of_node[edges]
    bad = np.flatnonzero(graphs[:, 0] != graphs[:, 1])
    if bad.size:
        line = int(bad[0])
        raise DataFormatError(
            f"{path.name} line {line + 1}: edge '{edges[line, 0] + 1}, {edges[line, 1] + 1}' "
            f"joins graph {graphs[line, 0] + 1} and graph {graphs[line, 1] + 1}"
        )
    return edges


def _coalesce(edges: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Drop self loops and duplicates; return (src, dst) sorted by (src, dst) like PyG."""
    edges = edges[edges[:, 0] != edges[:, 1]]
    key = edges[:, 0] * num_nodes + edges[:, 1]
    # Most files are already sorted without duplicates; skip the sort for them.
    if key.size > 1 and not np.all(key[1:] > key[:-1]):
        key = np.unique(key)
    return key // num_nodes, key % num_nodes


def _read_node_table(path: Path | None, num_nodes: int, kind: type, what: str) -> np.ndarray:
    if path is None:
        raise DataFormatError(f"missing node file for {what}")
    table = _read_table(path, None, kind, what)
    if table.shape[0] != num_nodes:
        raise DataFormatError(
            f"{path.name}: has {table.shape[0]} lines, but the graph_indicator file lists "
            f"{num_nodes} nodes"
        )
    return table


def _one_hot_columns(labels: np.ndarray, low: np.ndarray, widths: np.ndarray
                     ) -> tuple[np.ndarray, int]:
    """Return the hot position of every node per label column and the total width."""
    shifted = labels - low
    offsets = np.concatenate([[0], np.cumsum(widths)[:-1]])
    return shifted + offsets, int(widths.sum())


def _read_table(path: Path, num_columns: int | None, kind: type, what: str) -> np.ndarray:
    """Parse a comma-separated numeric file into a [lines, columns] array.

    ``num_columns=None`` takes the column count from the first line. The fast path checks
    the line structure with vectorised character classes and parses with ``np.fromstring``;
    only when that fails is the failing chunk scanned line by line to name the first bad line.
    """
    data = _read_bytes(path).rstrip()
    if not data:
        raise DataFormatError(f"{path.name}: file is empty")
    inferred = num_columns is None
    if num_columns is None:
        end = data.find(b"\n")
        num_columns = (data if end < 0 else data[:end]).count(b",") + 1
    count = _COUNT_WORDS.get(num_columns, str(num_columns))
    if num_columns == 1:
        expect = f"expected one {what}"
    else:
        expect = f"expected {count} comma-separated {what}s"
    if inferred:
        expect += " (as on line 1)"
    dtype = np.int64 if kind is int else np.float64
    classes = _INT_CLASSES if kind is int else _FLOAT_CLASSES
    token = _INT_TOKEN if kind is int else _FLOAT_TOKEN
    pattern = np.array([_NUMBER] + [_COMMA, _NUMBER] * (num_columns - 1) + [_NEWLINE], np.uint8)

    parts = []
    first_line = 0
    for chunk, is_last in _chunks(data):
        num_lines = chunk.count(b"\n") + (1 if is_last else 0)
        values = _parse_chunk(chunk, is_last, num_lines, num_columns, classes, pattern, dtype)
        if values is None:
            line, text = _first_bad_line(chunk, num_columns, token)
            raise DataFormatError(f"{path.name} line {first_line + line}: {expect}, got '{text}'")
        parts.append(values.reshape(num_lines, num_columns))
        first_line += num_lines
    return np.concatenate(parts)


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
        return gzip.decompress(raw) if path.name.endswith(".gz") else raw
    except (OSError, EOFError, zlib.error) as exc:
        raise DataFormatError(f"{path.name}: cannot be read ({exc})") from exc


def _chunks(data: bytes) -> Iterator[tuple[bytes, bool]]:
    """Yield pieces of ``data`` that end right after a newline, plus the final piece."""
    start = 0
    while start < len(data):
        end = data.find(b"\n", start + _CHUNK_BYTES)
        if end < 0:
            yield data[start:], True
            return
        yield data[start : end + 1], False
        start = end + 1


def _parse_chunk(
    chunk: bytes,
    is_last: bool,
    num_lines: int,
    num_columns: int,
    classes: np.ndarray,
    pattern: np.ndarray,
    dtype: type,
) -> np.ndarray | None:
    """Return the chunk's numbers, or None if any line deviates from the expected layout."""
    raw = np.frombuffer(chunk, dtype=np.uint8)
    cls = classes[raw]
    if np.any(cls == _INVALID):
        return None
    # np.fromstring silently reads a lone sign ("2, -") as 0: a sign must precede a digit.
    after_sign = np.flatnonzero((raw == ord("-")) | (raw == ord("+"))) + 1
    if after_sign.size and (
        after_sign[-1] == raw.size or not np.all(_DIGIT_OR_POINT[raw[after_sign]])
    ):
        return None
    number = cls == _NUMBER
    token_start = number.copy()
    token_start[1:] &= ~number[:-1]
    # Every line must read: number (comma number)* newline, ignoring blanks.
    events = cls[np.flatnonzero(token_start | (cls >= _COMMA))]
    expected = np.tile(pattern, num_lines)
    if is_last:
        expected = expected[:-1]
    if events.size != expected.size or not np.array_equal(events, expected):
        return None
    with warnings.catch_warnings():
        # np.fromstring warns (and stops) on a token it cannot parse, e.g. "1-2" or "1.2.3".
        warnings.simplefilter("error", DeprecationWarning)
        try:
            values: np.ndarray = np.fromstring(chunk.replace(b",", b" "), dtype=dtype, sep=" ")
        except (ValueError, DeprecationWarning):
            return None
    return values if values.size == num_lines * num_columns else None


def _first_bad_line(chunk: bytes, num_columns: int, token: re.Pattern[bytes]) -> tuple[int, str]:
    """Return the 1-based line (within the chunk) and text of the first malformed line."""
    lines = chunk.split(b"\n")
    for number, line in enumerate(lines, start=1):
        fields = line.split(b",")
        ok = len(fields) == num_columns and all(token.fullmatch(f.strip(b" \t\r")) for f in fields)
        if not ok:
            text = line.decode("utf-8", errors="replace").rstrip("\r")
            return number, text if len(text) <= 80 else text[:77] + "..."
    # Unreachable in practice: the line rules above accept exactly what the fast path does.
    return 1, lines[0].decode("utf-8", errors="replace")
