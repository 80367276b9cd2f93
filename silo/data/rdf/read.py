"""RDF triples -> one heterogeneous graph, as the RGCN benchmark graphs (AIFB, MUTAG, BGS) that
FedHGN trains on were built (docs/data/rdf.md, docs/algorithms.md §5.1).

- Entities (URIs) are nodes, typed by their ``rdf:type``. An entity of several classes takes
  the class to classify if it has it, else the first of its class URIs in sorted order; an
  entity without a class gets the node type ``_untyped``.
- Each predicate between two entities is a relation, with its reverse ``rev_<relation>`` (the
  convention of docs/hetero-format.md). ``rdf:type`` triples become the node types, not edges.
- Triples with a literal object, and triples touching a blank node (whose ids rdflib draws at
  random, so they could not be numbered the same way twice), are dropped and counted.
- The label triples are removed from the graph (else the label leaks into the input, as the
  RGCN benchmarks remove them); their distinct objects, in sorted order, are the classes.
- Targets are the entities of the class to classify; one without a label (or with several) is
  a refused row named by its URI and stays in the graph unlabelled (y = -1).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trellis.silo.data.hetero import HeteroGraph
from trellis.silo.data.hetero_split import REVERSE_PREFIX
from trellis.silo.data.prepared.model import Featuriser, Refusal, SourceOptions
from trellis.silo.data.rdf.names import short_names
from trellis.silo.data.rdf.node_split import DESCRIPTION, stratified_node_split
from trellis.silo.data.rdf.parse import load_triples
from trellis.silo.data.tu import DataFormatError

if TYPE_CHECKING:
    import rdflib

FEATURISER = "rdf-hetero"
FEATURISER_VERSION = "1"
UNTYPED = "_untyped"
NODE_TYPE_RULE = ("rdf:type; several: the class to classify if among them, else the first "
                  f"class URI in sorted order; none: {UNTYPED}")
SHOWN = 10          # how many found classes or predicates an error lists


@dataclass
class RdfConversion:
    """What `convert_rdf` read: the graph and the run report that goes in the manifest."""

    graph: HeteroGraph
    refused: list[Refusal]
    featuriser: Featuriser
    sources: list[Path]
    classes: list[str]          # label values in class-index order
    notes: list[str]


def read_rdf(source: Path, options: SourceOptions
             ) -> tuple[HeteroGraph, list[Refusal], Featuriser, list[Path]]:
    """The RDF source of `silo data prepare` (docs/data/rdf.md)."""
    done = convert_rdf(source, options)
    return done.graph, done.refused, done.featuriser, done.sources


def convert_rdf(source: Path, options: SourceOptions) -> RdfConversion:
    """Read one RDF file into a heterogeneous graph with labels, refusals and notes."""
    source = Path(source)
    if not options.entity_class or not options.label_predicate:
        raise DataFormatError(f"{source.name}: an RDF source needs --entity-class (the class of "
                              "the entities to classify) and --label-predicate (the predicate "
                              "holding their label)")
    triples = load_triples(source)
    from rdflib import RDF, BNode, Literal, URIRef

    target_class = _resolve(options.entity_class, triples)
    label_predicate = _resolve(options.label_predicate, triples)
    types: dict[Any, set[Any]] = {}
    for s, o in triples.subject_objects(RDF.type):
        if isinstance(s, URIRef) and isinstance(o, URIRef):
            types.setdefault(s, set()).add(o)
    _check_class(source, target_class, {c for cs in types.values() for c in cs})
    label_values: dict[Any, set[Any]] = {}
    for s, o in triples.subject_objects(label_predicate):
        label_values.setdefault(s, set()).add(o)
    if not label_values:
        _no_label_predicate(source, label_predicate, triples)

    edges: list[tuple[Any, Any, Any]] = []
    dropped = Counter[str]()
    for s, p, o in triples:
        if p == label_predicate:
            dropped["label"] += 1
        elif isinstance(s, BNode) or isinstance(o, BNode):
            dropped["blank"] += 1
        elif p == RDF.type:
            continue
        elif isinstance(o, Literal):
            dropped["literal"] += 1
        else:
            edges.append((s, p, o))
    targets = {e for e, cs in types.items() if target_class in cs}
    entities = targets | {s for s, _, _ in edges} | {o for _, _, o in edges}
    node_class = {e: _node_class(types.get(e, set()), target_class) for e in entities}
    type_names = short_names({str(c) for c in node_class.values() if c is not None},
                             reserved=(UNTYPED,))
    type_of = {e: type_names[str(c)] if c is not None else UNTYPED
               for e, c in node_class.items()}
    target_type = type_names[str(target_class)]
    ids = _number(type_of)
    relation_names = short_names({str(p) for _, p, _ in edges}, reverse_prefix=REVERSE_PREFIX)
    graph_edges = _edges(edges, type_of, ids, relation_names)

    ordered_targets = sorted(ids[target_type], key=ids[target_type].__getitem__)
    given = [(c, str(_resolve(c, triples))) for c in options.classes]
    labels, refused, classes = _labels(source, ordered_targets, label_values, label_predicate,
                                       target_class, given)
    train, val, test = stratified_node_split(labels)
    node_types = tuple(sorted(ids))
    graph = HeteroGraph(node_types, {t: len(ids[t]) for t in node_types}, tuple(graph_edges),
                        graph_edges, target_type, len(classes), labels, train, val, test)
    settings = {
        "entity_class": str(target_class), "label_predicate": str(label_predicate),
        "classes": classes, "node_types": {n: u for u, n in sorted(type_names.items())},
        "relations": {n: u for u, n in sorted(relation_names.items())},
        "node_type": NODE_TYPE_RULE, "reverse_relations": f"{REVERSE_PREFIX}<relation>",
        "literals": "dropped", "blank_nodes": "dropped", "split": DESCRIPTION}
    featuriser = Featuriser(FEATURISER, FEATURISER_VERSION, settings)
    notes = _notes(dropped, node_class, types, label_values, targets, target_class)
    return RdfConversion(graph, refused, featuriser, [source], classes, notes)


def _resolve(text: str, triples: rdflib.Graph) -> Any:
    """A URI as given: ``<uri>``, ``uri``, or ``prefix:local`` with a prefix the file binds."""
    from rdflib import URIRef

    text = text.strip()
    if text.startswith("<") and text.endswith(">"):
        return URIRef(text[1:-1])
    prefix, colon, local = text.partition(":")
    if colon and not local.startswith("//"):
        bound = {p: str(ns) for p, ns in triples.namespaces()}
        if prefix in bound:
            return URIRef(bound[prefix] + local)
    return URIRef(text)


def _check_class(source: Path, target_class: Any, classes: set[Any]) -> None:
    if target_class in classes:
        return
    found = (f"the classes found: {_listing(classes)}" if classes
             else "the file has no rdf:type triple between URIs")
    raise DataFormatError(f"{source.name}: no entity has rdf:type <{target_class}> ({found})")


def _no_label_predicate(source: Path, predicate: Any, triples: rdflib.Graph) -> None:
    found = set(triples.predicates(unique=True))
    raise DataFormatError(f"{source.name}: no triple has the label predicate <{predicate}> "
                          f"(the predicates found: {_listing(found)})")


def _listing(terms: set[Any]) -> str:
    names = sorted(str(t) for t in terms)
    shown = ", ".join(f"<{n}>" for n in names[:SHOWN])
    return shown + (f", ... {len(names)} in all" if len(names) > SHOWN else "")


def _node_class(classes: set[Any], target_class: Any) -> Any:
    if target_class in classes:
        return target_class
    return min(classes, key=str) if classes else None


def _number(type_of: dict[Any, str]) -> dict[str, dict[Any, int]]:
    """Per node type, entity -> id, in the sorted order of the entities' URIs."""
    by_type: dict[str, list[Any]] = {}
    for entity, node_type in type_of.items():
        by_type.setdefault(node_type, []).append(entity)
    return {t: {e: i for i, e in enumerate(sorted(es, key=str))} for t, es in by_type.items()}


def _edges(edges: list[tuple[Any, Any, Any]], type_of: dict[Any, str],
           ids: dict[str, dict[Any, int]], relation_names: dict[str, str]
           ) -> dict[tuple[str, str, str], np.ndarray]:
    """Edges per canonical type, each forward type followed by its reverse, sorted."""
    grouped: dict[tuple[str, str, str], list[tuple[int, int]]] = {}
    for s, p, o in edges:
        src, dst = type_of[s], type_of[o]
        grouped.setdefault((src, relation_names[str(p)], dst), []).append(
            (ids[src][s], ids[dst][o]))
    out: dict[tuple[str, str, str], np.ndarray] = {}
    for (src, rel, dst), pairs in sorted(grouped.items()):
        index = np.array(sorted(pairs), dtype=np.int64).T.reshape(2, -1)
        out[(src, rel, dst)] = index
        out[(dst, REVERSE_PREFIX + rel, src)] = index[::-1].copy()
    return out


def _labels(source: Path, targets: list[Any], label_values: dict[Any, set[Any]],
            predicate: Any, target_class: Any, given: list[tuple[str, str]]
            ) -> tuple[np.ndarray, list[Refusal], list[str]]:
    """Class index per target (-1 when refused), the refusals, and the classes in order: the
    `given` ones (each as written and as a URI) when the site fixed them, else those found."""
    from rdflib import BNode

    if given and len(given) < 2:
        raise DataFormatError(f"{source.name}: --classes names {len(given)} value: "
                              "classification needs at least 2 classes")
    fixed = {form: i for i, pair in enumerate(given) for form in pair}
    if len({uri for _, uri in given}) < len(given):
        raise DataFormatError(f"{source.name}: --classes names a value twice")

    refused: list[Refusal] = []
    raw: list[str | None] = []
    for entity in targets:
        values = label_values.get(entity, set())
        reason = ""
        if not values:
            reason = f"no label: the entity has no <{predicate}> triple"
        elif len(values) > 1:
            shown = ", ".join(repr(str(v)) for v in sorted(values, key=str)[:3])
            reason = f"{len(values)} different labels ({shown}): which one is meant is unclear"
        elif isinstance(next(iter(values)), BNode):
            reason = "the label is a blank node, which names no value"
        elif fixed and str(next(iter(values))) not in fixed:
            reason = f"label {str(next(iter(values)))!r} is not one of --classes"
        if reason:
            refused.append(Refusal(source.name, str(entity), reason))
            raw.append(None)
        else:
            raw.append(str(next(iter(values))))
    if fixed:
        if all(v is None for v in raw):
            raise DataFormatError(f"{source.name}: no entity of class <{target_class}> has one "
                                  f"of --classes as its label ({len(refused)} refused)")
        labels = np.array([-1 if v is None else fixed[v] for v in raw], dtype=np.int64)
        # A URI in full, whatever prefix a site wrote, so every site records the same list.
        found = {v for v in raw if v is not None}
        return labels, refused, [written if written in found else uri for written, uri in given]
    classes = _class_order({v for v in raw if v is not None})
    if not classes:
        raise DataFormatError(f"{source.name}: no entity of class <{target_class}> has the "
                              f"label predicate <{predicate}> ({len(targets)} entities of the "
                              "class; every label triple is on other entities)")
    if len(classes) < 2:
        raise DataFormatError(f"{source.name}: every labelled entity of class <{target_class}> "
                              f"has the same label {classes[0]!r}: classification needs at "
                              "least 2 classes")
    index = {value: i for i, value in enumerate(classes)}
    labels = np.array([-1 if v is None else index[v] for v in raw], dtype=np.int64)
    return labels, refused, classes


def _class_order(values: set[str]) -> list[str]:
    """Label values in class-index order: numerically if all are integers, else as text."""
    try:
        return sorted(values, key=int)
    except ValueError:
        return sorted(values)


def _notes(dropped: Counter[str], node_class: dict[Any, Any], types: dict[Any, set[Any]],
           label_values: dict[Any, set[Any]], targets: set[Any], target_class: Any
           ) -> list[str]:
    """The run report's lines: what was dropped or decided, with counts."""
    notes = [f"{_count(dropped['label'], 'label triple')} removed from the graph"]
    elsewhere = sum(1 for e in label_values if e not in targets)
    if elsewhere:
        notes.append(f"{_count(elsewhere, 'labelled entity', 'labelled entities')} not of "
                     f"class <{target_class}>: not targets (their label triples removed too)")
    if dropped["literal"]:
        notes.append(f"{_count(dropped['literal'], 'triple')} with a literal object dropped")
    if dropped["blank"]:
        notes.append(f"{_count(dropped['blank'], 'triple')} touching a blank node dropped")
    several = sum(1 for e in node_class if len(types.get(e, ())) > 1)
    if several:
        notes.append(f"{_count(several, 'entity', 'entities')} of several classes: typed by "
                     f"{NODE_TYPE_RULE}")
    untyped = sum(1 for c in node_class.values() if c is None)
    if untyped:
        notes.append(f"{_count(untyped, 'entity', 'entities')} without rdf:type: node type "
                     f"{UNTYPED}")
    return notes


def _count(n: int, one: str, many: str = "") -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"
