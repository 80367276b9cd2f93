"""Tests for the synthetic cross-domain TU folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from trellis.silo.data.synthetic import DOMAINS, generate_domain, write_tu_folder
from trellis.silo.data.tu import load_tu_folder

# domain -> (number of classes, feature kind, feature width or None when it depends on data)
EXPECTED = {
    "molecules": (2, "node_labels", 7),
    "social": (2, "degree", None),
    "bio": (3, "node_labels", 3),
}


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
@pytest.mark.parametrize("domain", DOMAINS)
def test_write_then_load(tmp_path: Path, domain: str, gz: bool) -> None:
    folder = write_tu_folder(tmp_path, f"SYN-{domain}", domain, 40, seed=3, gz=gz)
    assert folder == tmp_path / f"SYN-{domain}"
    suffix = ".txt.gz" if gz else ".txt"
    assert (folder / f"SYN-{domain}_A{suffix}").is_file()
    ds = load_tu_folder(folder)
    classes, kind, width = EXPECTED[domain]
    assert ds.name == f"SYN-{domain}" and len(ds.graphs) == 40
    assert ds.num_classes == classes and ds.feature_kind == kind
    if width is not None:
        assert ds.num_features == width
    assert {int(g.y) for g in ds.graphs} == set(range(classes))


def test_structural_regimes() -> None:
    def degrees(domain: str) -> tuple[np.ndarray, np.ndarray]:
        raw = generate_domain(domain, 60, seed=1)
        sizes = np.bincount(raw.graph_indicator)[1:]
        return sizes, np.bincount(raw.edges[:, 0])[1:]

    sizes, degree = degrees("molecules")
    assert sizes.min() >= 10 and sizes.max() <= 30 and degree.max() <= 4
    sizes, _ = degrees("social")
    assert sizes.min() >= 10 and sizes.max() <= 40
    sizes, _ = degrees("bio")
    assert sizes.min() >= 15 and sizes.max() <= 40
    raw = generate_domain("molecules", 60, seed=1)
    assert set(np.unique(raw.graph_labels)) == {-1, 1}
    assert generate_domain("social", 5, seed=1).node_labels is None


def test_edges_are_symmetric_without_loops_or_duplicates() -> None:
    for domain in DOMAINS:
        edges = generate_domain(domain, 30, seed=2).edges
        pairs = set(map(tuple, edges.tolist()))
        assert len(pairs) == len(edges)
        assert pairs == {(b, a) for a, b in pairs}
        assert all(a != b for a, b in pairs)


def test_deterministic_per_seed_and_different_across_seeds(tmp_path: Path) -> None:
    for domain in DOMAINS:
        a = write_tu_folder(tmp_path / "a", "S", domain, 20, seed=5, gz=True)
        b = write_tu_folder(tmp_path / "b", "S", domain, 20, seed=5, gz=True)
        c = write_tu_folder(tmp_path / "c", "S", domain, 20, seed=6, gz=True)
        same = [(a / f.name).read_bytes() == f.read_bytes() for f in b.iterdir()]
        assert all(same) and len(same) >= 3
        assert (a / "S_A.txt.gz").read_bytes() != (c / "S_A.txt.gz").read_bytes()
        first, second = load_tu_folder(a), load_tu_folder(c)
        assert not all(
            torch.equal(g.edge_index, h.edge_index)
            for g, h in zip(first.graphs, second.graphs, strict=True)
        )


def test_every_node_type_occurs_even_for_tiny_sets() -> None:
    for domain, types in (("molecules", 7), ("bio", 3)):
        for seed in range(5):
            labels = generate_domain(domain, 1, seed=seed).node_labels
            assert labels is not None and np.unique(labels).size == types


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="domain must be one of"):
        generate_domain("vision", 10, seed=0)
    with pytest.raises(ValueError, match="n_graphs"):
        generate_domain("bio", 0, seed=0)
    with pytest.raises(ValueError, match="name"):
        write_tu_folder(tmp_path, "a/b", "bio", 5, seed=0)
    write_tu_folder(tmp_path, "X", "bio", 5, seed=0)
    (tmp_path / "X" / "Y_A.txt").write_text("1, 2\n")
    with pytest.raises(FileExistsError, match="another TU dataset"):
        write_tu_folder(tmp_path, "X", "bio", 5, seed=0)


def test_rewriting_replaces_the_earlier_copy(tmp_path: Path) -> None:
    write_tu_folder(tmp_path, "S", "molecules", 10, seed=0)
    folder = write_tu_folder(tmp_path, "S", "social", 10, seed=0, gz=True)
    assert sorted(p.name for p in folder.iterdir()) == [
        "S_A.txt.gz",
        "S_graph_indicator.txt.gz",
        "S_graph_labels.txt.gz",
    ]
    assert load_tu_folder(folder).feature_kind == "degree"
