"""Synthetic cross-domain graph classification data, written as real TU-format folders.

Three structurally different domains stand in for the papers' molecules / social / bio silos.
In each, the class is decided by the graph's STRUCTURE (so a structure encoder helps), node
labels carry a weaker class signal, and a fraction of labels is flipped so that accuracy tops
out below 100 % and methods have room to differ. Everything is drawn from
``numpy.random.default_rng(seed)``; nothing is downloaded.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DOMAINS = ("molecules", "social", "bio")

# Fraction of graphs whose label is replaced by a different, random class.
_LABEL_NOISE = 0.1


@dataclass(frozen=True)
class RawGraphs:
    """One synthetic dataset as TU-style arrays (1-based ids, labels as written to the files)."""

    edges: np.ndarray  # int64 [E, 2], both directions of every undirected edge
    graph_indicator: np.ndarray  # int64 [N], graph id of every node
    graph_labels: np.ndarray  # int64 [G]
    node_labels: np.ndarray | None  # int64 [N]; None where the domain has no node labels


# One graph: number of nodes, undirected edges [m, 2] (0-based), node types (0-based) or None.
_Graph = tuple[int, np.ndarray, np.ndarray | None]


def generate_domain(domain: str, n_graphs: int, *, seed: int) -> RawGraphs:
    """Generate ``n_graphs`` graphs of one domain as TU-style arrays, deterministically."""
    if domain not in DOMAINS:
        raise ValueError(f"domain must be one of {', '.join(DOMAINS)}; got {domain!r}")
    if n_graphs < 1:
        raise ValueError(f"n_graphs must be >= 1; got {n_graphs}")
    make, num_classes, num_types, first_type, label_values = _DOMAIN_SPECS[domain]
    rng = np.random.default_rng(seed)
    # Balanced structural classes, in random order.
    classes = rng.permutation(np.arange(n_graphs) % num_classes)
    graphs = [make(rng, int(c)) for c in classes]

    flip = rng.random(n_graphs) < _LABEL_NOISE
    shift = rng.integers(1, num_classes, size=n_graphs)
    observed = np.where(flip, (classes + shift) % num_classes, classes)

    sizes = np.array([n for n, _, _ in graphs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    pairs = np.concatenate([e + off for (_, e, _), off in zip(graphs, offsets, strict=True)])
    both = np.concatenate([pairs, pairs[:, ::-1]])
    both = both[np.lexsort((both[:, 1], both[:, 0]))]
    node_labels = None
    if num_types:
        types = np.concatenate([t for _, _, t in graphs if t is not None])
        # Every type must occur so the one-hot width does not depend on the seed.
        for t in np.setdiff1d(np.arange(num_types), types):
            types[t] = t
        node_labels = types + first_type
    return RawGraphs(
        edges=both + 1,
        graph_indicator=np.repeat(np.arange(1, n_graphs + 1), sizes),
        graph_labels=np.asarray(label_values)[observed],
        node_labels=node_labels,
    )


def write_tu_folder(
    folder: Path, name: str, domain: str, n_graphs: int, *, seed: int, gz: bool = False
) -> Path:
    """Write a synthetic dataset as TU files into ``folder/name`` (replacing any earlier copy)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ValueError(f"name must be a plain file-name prefix like 'SYN-bio'; got {name!r}")
    raw = generate_domain(domain, n_graphs, seed=seed)
    target = Path(folder) / name
    target.mkdir(parents=True, exist_ok=True)
    suffix = ".txt.gz" if gz else ".txt"
    ours = {f"{name}_A.txt", f"{name}_A.txt.gz"}
    clash = [p.name for p in target.iterdir() if p.name.endswith(("_A.txt", "_A.txt.gz"))]
    if any(n not in ours for n in clash):
        raise FileExistsError(f"{target} already holds another TU dataset: {', '.join(clash)}")
    # Replace an earlier copy completely: a stale node_labels file or the other compression
    # of a file would otherwise be read together with the new files.
    for stale in target.glob(f"{name}_*.txt*"):
        if stale.name.endswith((".txt", ".txt.gz")):
            stale.unlink()
    tables = {
        "A": "".join(f"{a}, {b}\n" for a, b in raw.edges.tolist()),
        "graph_indicator": "".join(f"{g}\n" for g in raw.graph_indicator.tolist()),
        "graph_labels": "".join(f"{y}\n" for y in raw.graph_labels.tolist()),
    }
    if raw.node_labels is not None:
        tables["node_labels"] = "".join(f"{t}\n" for t in raw.node_labels.tolist())
    for part, text in tables.items():
        path = target / f"{name}_{part}{suffix}"
        data = text.encode("ascii")
        # mtime=0 keeps the .gz bytes identical for identical seeds.
        path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return target


def _molecule(rng: np.random.Generator, cls: int) -> _Graph:
    """Tree-like molecule, max degree 4; class 1 has 3-4 rings, class 0 has 0-1.

    Separable because every ring adds one edge beyond a tree (E - n + 1 = #rings), which a
    sum-pooled GNN reads off its degree counts, and 5/6-rings show in the return probabilities.
    """
    ring_sizes = rng.integers(5, 7, size=int(rng.integers(0, 2)) + 3 * cls)
    n = int(rng.integers(max(10, int(ring_sizes.sum()) + 1), 31))
    edges: list[tuple[int, int]] = []
    degree = np.zeros(n, dtype=np.int64)

    def bond(a: int, b: int) -> None:
        edges.append((a, b))
        degree[a] += 1
        degree[b] += 1

    used = 0
    for size in ring_sizes:
        ring = list(range(used, used + int(size)))
        for i in range(len(ring)):
            bond(ring[i], ring[(i + 1) % len(ring)])
        if used:  # join to the structure built so far by a single bond
            bond(_free_atom(rng, degree, used), ring[0])
        used += int(size)
    if used == 0:
        used = 1
    for atom in range(used, n):
        bond(_free_atom(rng, degree, atom), atom)
    # Weak feature signal: class 1 has more atoms of type 2.
    probs = [0.55, 0.15, 0.10, 0.08, 0.05, 0.04, 0.03]
    if cls:
        probs = [0.45, 0.15, 0.20, 0.08, 0.05, 0.04, 0.03]
    return n, np.array(edges, dtype=np.int64), rng.choice(7, size=n, p=probs)


def _free_atom(rng: np.random.Generator, degree: np.ndarray, count: int) -> int:
    """Pick one of the first ``count`` atoms that still has fewer than 4 bonds."""
    free = np.flatnonzero(degree[:count] < 4)
    return int(rng.choice(free))


def _social(rng: np.random.Generator, cls: int) -> _Graph:
    """Ego network: an ego tied to everyone; class 0 has one community, class 1 two.

    Densities are chosen so the edge count alone barely separates the classes; what differs
    is clustering (many more triangles inside two tight communities), which the random-walk
    return probabilities capture and degree one-hot features only partly reflect.
    """
    n = int(rng.integers(10, 41))
    others = n - 1
    if cls == 0:
        block = np.zeros(others, dtype=np.int64)
        p_in, p_out = 0.25, 0.25
    else:
        split = int(round(others * rng.uniform(0.35, 0.65)))
        block = (np.arange(others) >= split).astype(np.int64)
        p_in, p_out = 0.8, 0.03
    i, j = np.triu_indices(others, k=1)
    p = np.where(block[i] == block[j], p_in, p_out)
    keep = rng.random(i.size) < p
    friends = np.stack([i[keep], j[keep]], axis=1) + 1
    ego = np.stack([np.zeros(others, dtype=np.int64), np.arange(1, n)], axis=1)
    return n, np.concatenate([ego, friends]), None


def _bio(rng: np.random.Generator, cls: int) -> _Graph:
    """Class 0: ring of small cliques; class 1: grid with a few changes; class 2: geometric."""
    if cls == 0:
        n, edges = _ring_of_cliques(rng)
    elif cls == 1:
        n, edges = _grid(rng)
    else:
        n, edges = _geometric(rng)
    # Weak feature signal: the class's own type is a little more common.
    probs = np.full(3, 0.28)
    probs[cls] = 0.44
    return n, edges, rng.choice(3, size=n, p=probs)


def _ring_of_cliques(rng: np.random.Generator) -> tuple[int, np.ndarray]:
    size = int(rng.integers(4, 7))
    count = int(rng.integers(-(-15 // size), 40 // size + 1))
    edges = []
    for c in range(count):
        base = c * size
        i, j = np.triu_indices(size, k=1)
        # Drop about one in ten clique edges so cliques are not all perfect.
        keep = rng.random(i.size) >= 0.1
        edges.append(np.stack([i[keep], j[keep]], axis=1) + base)
        edges.append(np.array([[base, ((c + 1) % count) * size + 1]]))
    return count * size, np.concatenate(edges)


def _grid(rng: np.random.Generator) -> tuple[int, np.ndarray]:
    while True:
        rows, cols = int(rng.integers(3, 9)), int(rng.integers(3, 9))
        if 15 <= rows * cols <= 40:
            break
    ids = np.arange(rows * cols).reshape(rows, cols)
    lattice = np.concatenate(
        [
            np.stack([ids[:, :-1].ravel(), ids[:, 1:].ravel()], axis=1),
            np.stack([ids[:-1, :].ravel(), ids[1:, :].ravel()], axis=1),
        ]
    )
    lattice = lattice[rng.random(len(lattice)) >= 0.1]
    diagonals = np.stack([ids[:-1, :-1].ravel(), ids[1:, 1:].ravel()], axis=1)
    diagonals = diagonals[rng.random(len(diagonals)) < 0.1]
    return rows * cols, np.concatenate([lattice, diagonals])


def _geometric(rng: np.random.Generator) -> tuple[int, np.ndarray]:
    n = int(rng.integers(15, 41))
    points = rng.random((n, 2))
    radius = np.sqrt(6.0 / (np.pi * n))  # about 6 neighbours on average (ignoring borders)
    i, j = np.triu_indices(n, k=1)
    close = np.linalg.norm(points[i] - points[j], axis=1) < radius
    return n, np.stack([i[close], j[close]], axis=1)


# domain -> (graph maker, classes, node types, first node label in the file, graph labels in
# the file). Labels deliberately differ in style (-1/1, 0/1, 1..3) as in the real TU sets.
_Maker = Callable[[np.random.Generator, int], _Graph]
_DOMAIN_SPECS: dict[str, tuple[_Maker, int, int, int, list[int]]] = {
    "molecules": (_molecule, 2, 7, 0, [-1, 1]),
    "social": (_social, 2, 0, 0, [0, 1]),
    "bio": (_bio, 3, 3, 1, [1, 2, 3]),
}
