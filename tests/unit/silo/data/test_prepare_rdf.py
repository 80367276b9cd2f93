"""RDF -> heterogeneous graph (silo/data/rdf, docs/data/rdf.md): the conversion, its refusals,
every error line, the prepared folder, and a FedHGN training step on what it wrote."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rdflib")

from trellis.silo.data.hetero import load_hetero_folder  # noqa: E402
from trellis.silo.data.prepared.folder import write_prepared_hetero  # noqa: E402
from trellis.silo.data.prepared.model import SourceOptions  # noqa: E402
from trellis.silo.data.rdf.names import short_names  # noqa: E402
from trellis.silo.data.rdf.node_split import stratified_node_split  # noqa: E402
from trellis.silo.data.rdf.read import convert_rdf, read_rdf  # noqa: E402
from trellis.silo.data.tu import DataFormatError  # noqa: E402

EX = "http://example.org/lab#"
OPTIONS = SourceOptions(format="rdf", entity_class="ex:Person",
                        label_predicate=f"<{EX}group>")

# Persons labelled by their research group (a URI, so the label triple would be an edge), one
# of two classes, one without a label; literals and a blank node to be dropped; two name
# predicates whose local names clash.
LAB_TTL = f"""@prefix ex: <{EX}> .
@prefix foaf: <http://xmlns.com/foaf/0.1/> .

ex:alice a ex:Person ; ex:group ex:Graphs ; ex:wrote ex:p1, ex:p2 ; foaf:name "Alice" .
ex:bob a ex:Person ; ex:group ex:Graphs ; ex:wrote ex:p2 ; ex:name "Bob" .
ex:carol a ex:Person, ex:Student ; ex:group ex:Crypto ; ex:wrote ex:p3 .
ex:dave a ex:Person ; ex:group ex:Crypto ; ex:wrote ex:p3 ; ex:knows ex:erin .
ex:erin a ex:Person ; ex:knows ex:dave .
ex:p1 a ex:Paper ; ex:cites ex:p2 ; ex:about [ ex:topic "graphs" ] .
ex:p2 a ex:Paper .
ex:p3 a ex:Paper ; ex:cites ex:p1 .
ex:Graphs a ex:Group ; ex:head ex:alice .
ex:Crypto a ex:Group ; ex:head ex:dave .
"""


def write(folder: Path, name: str, text: str) -> Path:
    """Write one RDF file for a test and return its path."""
    path = folder / name
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def as_ntriples(turtle: Path, out: Path) -> Path:
    """The same triples as N-Triples (rdflib's own serialiser)."""
    import rdflib

    graph = rdflib.Graph().parse(turtle, format="turtle")
    out.write_text(graph.serialize(format="nt"))
    return out


def planted_ntriples(people: int = 40, seed: int = 0) -> str:
    """Persons of two classes; each is a member of its class's team (with some noise) and
    writes papers shared within the class, so the structure predicts the label."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(people):
        c = i % 2
        team = c if rng.random() > 0.1 else 1 - c
        person = f"<{EX}person{i}>"
        lines += [f"{person} <http://www.w3.org/1999/02/22-rdf-syntax-ns#type> <{EX}Person> .",
                  f"{person} <{EX}label> \"{'AB'[c]}\" .",
                  f"{person} <{EX}memberOf> <{EX}team{team}> .",
                  f"{person} <{EX}wrote> <{EX}paper{c}_{rng.integers(0, 4)}> ."]
    return "\n".join(lines) + "\n"


# -- the conversion ---------------------------------------------------------------------------
def test_turtle_becomes_typed_nodes_relations_with_reverses_and_targets(tmp_path: Path) -> None:
    done = convert_rdf(write(tmp_path, "lab.ttl", LAB_TTL), OPTIONS)
    graph = done.graph
    assert graph.node_types == ("Group", "Paper", "Person")
    # carol is a Person and a Student: she is typed by the class to classify.
    assert graph.num_nodes == {"Group": 2, "Paper": 3, "Person": 5}
    assert graph.target_type == "Person" and graph.num_classes == 2
    # Persons are numbered in URI order: alice, bob, carol, dave, erin.
    assert done.classes == [f"{EX}Crypto", f"{EX}Graphs"]
    assert graph.labels.tolist() == [1, 1, 0, 0, -1]
    forward = {et for et in graph.edge_types if not et[1].startswith("rev_")}
    assert forward == {("Paper", "cites", "Paper"), ("Person", "wrote", "Paper"),
                       ("Person", "knows", "Person"), ("Group", "head", "Person")}
    for src, rel, dst in forward:
        reverse = graph.edges[(dst, f"rev_{rel}", src)]
        assert np.array_equal(reverse, graph.edges[(src, rel, dst)][::-1])
    assert graph.edges[("Person", "wrote", "Paper")].tolist() == [[0, 0, 1, 2, 3], [0, 1, 1, 2, 2]]
    # The label triples are gone: no relation says which group a person is in.
    assert not any("group" in rel for rel in graph.relations)
    assert [(r.source, r.row) for r in done.refused] == [("lab.ttl", f"{EX}erin")]
    assert "no label" in done.refused[0].reason
    assert done.notes == ["4 label triples removed from the graph",
                          "2 triples with a literal object dropped",
                          "2 triples touching a blank node dropped",
                          "1 entity of several classes: typed by rdf:type; several: the class "
                          "to classify if among them, else the first class URI in sorted order;"
                          " none: _untyped"]
    settings = done.featuriser.settings
    assert (done.featuriser.name, done.featuriser.version) == ("rdf-hetero", "1")
    assert settings["entity_class"] == f"{EX}Person" and settings["label_predicate"] == f"{EX}group"
    assert settings["classes"] == done.classes and settings["relations"]["cites"] == f"{EX}cites"
    assert read_rdf(tmp_path / "lab.ttl", OPTIONS)[1] == done.refused


def test_ntriples_gzip_and_n3_give_the_same_graph_every_time(tmp_path: Path) -> None:
    turtle = write(tmp_path, "lab.ttl", LAB_TTL)
    nt = as_ntriples(turtle, tmp_path / "lab.nt")
    gz = write(tmp_path, "lab.nt.gz", nt.read_text())
    n3 = write(tmp_path, "lab.n3", LAB_TTL)
    # The class as a prefixed name, in angle brackets, or bare; the same file twice.
    runs = ((turtle, "ex:Person"), (nt, f"<{EX}Person>"), (gz, f"{EX}Person"),
            (n3, "ex:Person"), (turtle, "ex:Person"))
    graphs = [convert_rdf(path, SourceOptions(entity_class=cls, label_predicate=f"{EX}group")
                          ).graph for path, cls in runs]
    first = graphs[0]
    for other in graphs[1:]:
        assert other.node_types == first.node_types and other.edge_types == first.edge_types
        assert all(np.array_equal(other.edges[k], first.edges[k]) for k in first.edge_types)
        assert np.array_equal(other.labels, first.labels)
        assert np.array_equal(other.train_idx, first.train_idx)


def test_untyped_entities_and_labels_on_other_entities_are_reported(tmp_path: Path) -> None:
    text = (f"@prefix ex: <{EX}> .\n"
            f"<{EX}a> a <{EX}Person> ; <{EX}group> \"x\" ; <{EX}likes> <{EX}thing> .\n"
            f"<{EX}b> a <{EX}Person> ; <{EX}group> \"y\", \"z\" .\n"
            f"<{EX}c> a <{EX}Person> ; <{EX}group> \"y\" .\n"
            f"<{EX}thing> <{EX}group> \"x\" .\n")
    done = convert_rdf(write(tmp_path, "t.ttl", text), OPTIONS)
    assert done.graph.num_nodes == {"Person": 3, "_untyped": 1}
    assert done.graph.labels.tolist() == [0, -1, 1]
    assert done.refused[0].row == f"{EX}b"
    assert "2 different labels ('y', 'z')" in done.refused[0].reason
    assert "1 labelled entity not of class" in done.notes[1]
    assert "1 entity without rdf:type: node type _untyped" in done.notes


def test_classes_fixed_in_advance_give_every_site_the_same_indices(tmp_path: Path) -> None:
    # Two sites: one holds only Crypto people, written with a prefix; the other names the
    # classes in full. Found classes would be numbered per file; --classes fixes the order.
    only_crypto = LAB_TTL.replace("ex:group ex:Graphs", "ex:group ex:Crypto")
    order = ("ex:Graphs", f"<{EX}Crypto>", f"<{EX}Theory>")
    first = convert_rdf(write(tmp_path, "lab.ttl", LAB_TTL), replace(OPTIONS, classes=order))
    second = convert_rdf(write(tmp_path, "crypto.ttl", only_crypto),
                         replace(OPTIONS, classes=order))
    uris = [f"{EX}Graphs", f"{EX}Crypto", f"{EX}Theory"]
    assert first.classes == second.classes == uris
    assert first.graph.num_classes == second.graph.num_classes == 3
    assert first.featuriser.settings["classes"] == uris
    assert sorted(first.graph.labels[first.graph.labels >= 0].tolist()) == [0, 0, 1, 1]
    assert second.graph.labels[second.graph.labels >= 0].tolist() == [1] * 4     # Crypto
    # Without --classes the second site would call Crypto class 0 and have one class only.
    with pytest.raises(DataFormatError, match="at least 2 classes"):
        convert_rdf(tmp_path / "crypto.ttl", OPTIONS)


def test_a_label_outside_the_fixed_classes_is_a_refused_row(tmp_path: Path) -> None:
    done = convert_rdf(write(tmp_path, "lab.ttl", LAB_TTL),
                       replace(OPTIONS, classes=("ex:Graphs", "ex:Theory")))
    rows = {r.row: r.reason for r in done.refused}
    assert rows[f"{EX}carol"] == rows[f"{EX}dave"] == f"label '{EX}Crypto' is not one of --classes"
    assert f"{EX}erin" in rows and len(rows) == 3
    assert sorted(done.graph.labels[done.graph.labels >= 0].tolist()) == [0, 0]


@pytest.mark.parametrize("classes, message", [
    (("ex:Graphs",), "lab.ttl: --classes names 1 value: classification needs at least 2 classes"),
    (("ex:Graphs", f"<{EX}Graphs>"), "lab.ttl: --classes names a value twice"),
    (("ex:Theory", "ex:Art"), f"lab.ttl: no entity of class <{EX}Person> has one of --classes "
                              "as its label (5 refused)"),
])
def test_bad_fixed_classes_are_one_clear_line(tmp_path: Path, classes: tuple[str, ...],
                                              message: str) -> None:
    with pytest.raises(DataFormatError) as caught:
        convert_rdf(write(tmp_path, "lab.ttl", LAB_TTL), replace(OPTIONS, classes=classes))
    assert str(caught.value) == message


def test_names_are_local_and_unique() -> None:
    names = short_names(["http://xmlns.com/foaf/0.1/name", "http://example.org/name",
                         f"{EX}knows", "http://other.org/x#rev_knows"], reverse_prefix="rev_")
    assert names["http://example.org/name"] == "example.org/name"
    assert names["http://xmlns.com/foaf/0.1/name"] == "0.1/name"
    everything = list(names.values()) + [f"rev_{n}" for n in names.values()]
    assert len(set(everything)) == len(everything)
    assert short_names([f"{EX}_untyped", f"{EX}Paper"], reserved=("_untyped",)) == {
        f"{EX}_untyped": "lab/_untyped", f"{EX}Paper": "Paper"}


def test_split_is_stratified_seeded_and_covers_the_labelled_only() -> None:
    labels = np.array([0] * 60 + [1] * 60 + [2] * 40 + [3] * 16 + [-1] * 5)
    train, val, test = stratified_node_split(labels)
    assert (train.size, val.size, test.size) == (112, 29, 35)
    assert np.array_equal(np.sort(np.concatenate([train, val, test])), np.arange(176))
    assert np.bincount(labels[test]).tolist() == [12, 12, 8, 3]
    again = stratified_node_split(labels)
    assert all(np.array_equal(a, b) for a, b in zip((train, val, test), again, strict=True))
    tiny = stratified_node_split(np.array([0, 1, 1, -1]))      # classes too small to split
    assert [s.tolist() for s in tiny] == [[0, 1, 2], [], []]


# -- errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name, text, options, message", [
    ("bad.nt", f"<{EX}a> <{EX}p> <{EX}b> .\n\n<{EX}a> <{EX}p> \"open .\n", OPTIONS,
     "bad.nt: line 3: not valid N-Triples: unexpected text at '\"open .'"),
    ("bad.nt", f"<{EX}a> <{EX}p> <{EX}b>\n", OPTIONS,
     "bad.nt: line 1: not valid N-Triples: the line does not end with ' .'"),
    ("bad.ttl", f"@prefix ex: <{EX}> .\nex:a ex:p ex:b .\nex:a ex:p ;\n", OPTIONS,
     "bad.ttl: line 3: not valid Turtle: objectList expected"),
    ("lab.ttl", LAB_TTL, SourceOptions(entity_class="ex:Person", label_predicate="ex:team"),
     f"lab.ttl: no triple has the label predicate <{EX}team> (the predicates found: "
     f"<{EX}about>, <{EX}cites>, <{EX}group>, <{EX}head>, <{EX}knows>, <{EX}name>, "
     f"<{EX}topic>, <{EX}wrote>, <http://www.w3.org/1999/02/22-rdf-syntax-ns#type>, "
     "<http://xmlns.com/foaf/0.1/name>)"),
    ("lab.ttl", LAB_TTL, SourceOptions(entity_class="ex:Professor", label_predicate="ex:group"),
     f"lab.ttl: no entity has rdf:type <{EX}Professor> (the classes found: <{EX}Group>, "
     f"<{EX}Paper>, <{EX}Person>, <{EX}Student>)"),
    ("lab.ttl", LAB_TTL, SourceOptions(entity_class="ex:Person"),
     "lab.ttl: an RDF source needs --entity-class (the class of the entities to classify) "
     "and --label-predicate"),
    ("one.ttl", f"<{EX}a> a <{EX}P> ; <{EX}l> \"x\" .\n<{EX}b> a <{EX}P> ; <{EX}l> \"x\" .\n",
     SourceOptions(entity_class=f"{EX}P", label_predicate=f"{EX}l"),
     f"one.ttl: every labelled entity of class <{EX}P> has the same label 'x': classification "
     "needs at least 2 classes"),
    ("other.ttl", f"<{EX}a> a <{EX}P> .\n<{EX}b> <{EX}l> \"x\" .\n",
     SourceOptions(entity_class=f"{EX}P", label_predicate=f"{EX}l"),
     f"other.ttl: no entity of class <{EX}P> has the label predicate <{EX}l>"),
    ("lab.csv", "a,b\n", OPTIONS, "lab.csv: not an RDF file name: expected .nt, .ttl or .n3"),
    ("cut.nt.gz", "", OPTIONS, "cut.nt.gz: not a readable N-Triples file (Compressed file "
     "ended before the end-of-stream marker was reached)"),
])
def test_each_mistake_is_one_clear_line(tmp_path: Path, name: str, text: str,
                                        options: SourceOptions, message: str) -> None:
    path = write(tmp_path, name, text)
    if name == "cut.nt.gz":
        path.write_bytes(gzip.compress(LAB_TTL.encode())[:30])
    with pytest.raises(DataFormatError) as caught:
        convert_rdf(path, options)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_a_site_without_rdflib_is_told_what_to_install(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "lab.ttl", LAB_TTL)
    monkeypatch.setitem(sys.modules, "rdflib", None)      # `import rdflib` now fails
    with pytest.raises(DataFormatError, match=r"^lab.ttl: reading RDF needs rdflib: pip "
                                              r"install 'trellis-fgl\[data\]'$"):
        convert_rdf(path, OPTIONS)


def test_importing_the_rdf_source_does_not_load_rdflib() -> None:
    code = ("import sys, trellis.silo.data.rdf.read, trellis.silo.data.prepared.folder; "
            "assert 'rdflib' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# -- the prepared folder and FedHGN on it -----------------------------------------------------
def test_prepared_folder_has_the_graph_and_a_manifest(tmp_path: Path) -> None:
    done = convert_rdf(write(tmp_path, "lab.ttl", LAB_TTL), OPTIONS)
    out = write_rdf_prepared_interim(done, tmp_path / "prepared")
    loaded = load_hetero_folder(out)
    assert loaded.edge_types == done.graph.edge_types and loaded.num_nodes == done.graph.num_nodes
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["format"], manifest["task"], manifest["name"]) == (
        "trellis-prepared/1", "node", "lab")
    assert manifest["counts"]["classes"] == {f"{EX}Crypto": 2, f"{EX}Graphs": 2}
    assert manifest["refused"] == [{"source": "lab.ttl", "row": f"{EX}erin",
                                    "reason": done.refused[0].reason}]
    assert manifest["sources"][0]["name"] == "lab.ttl"
    assert len(manifest["sources"][0]["sha256"]) == 64
    with pytest.raises(DataFormatError, match="already exists and is not an empty folder"):
        write_rdf_prepared_interim(done, out)
    with pytest.raises(DataFormatError, match="1 row"):
        write_rdf_prepared_interim(done, tmp_path / "strict", strict=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lab.ttl", "prepared"]


def write_rdf_prepared_interim(done, out: Path, *, strict: bool = False) -> Path:  # type: ignore[no-untyped-def]
    """What `silo data prepare` does with a converted RDF file (silo/cli/data_prep.py)."""
    return write_prepared_hetero(done.graph, done.refused, done.featuriser, done.sources, out,
                                 name=done.sources[0].stem, strict=strict, notes=done.notes,
                                 meta={"dataset": done.sources[0].stem, "classes": done.classes})


def test_fedhgn_trains_on_the_converted_graph(tmp_path: Path) -> None:
    from trellis.silo.training.hgn_trainer import HeteroTrainer, HGNConfig
    from trellis.silo.training.trainers import load_silo_data

    source = write(tmp_path, "planted.nt", planted_ntriples())
    done = convert_rdf(source, SourceOptions(entity_class=f"{EX}Person",
                                             label_predicate=f"{EX}label"))
    assert done.refused == [] and done.classes == ["A", "B"]
    folder = write_rdf_prepared_interim(done, tmp_path / "planted")
    graph = load_silo_data(folder)
    assert (graph.train_idx.size, graph.val_idx.size, graph.test_idx.size) == (26, 6, 8)
    trainer = HeteroTrainer(graph, HGNConfig(hidden=16, num_bases=2, local_epochs=5, lr=1.0),
                            7, "fed", "silo-a", num_classes=2)
    trainer.set_pool(None)      # a lone silo: no other silo's coefficients to align to
    losses = [trainer.train()["train_loss"] for _ in range(6)]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0] / 2
    accuracy, loss, count = trainer.evaluate("val")
    assert count == 6 and accuracy > 0.5 and np.isfinite(loss)
    assert trainer.get_shared().dtype == np.float32
