"""Cut one heterogeneous graph into K silo graphs as the FedHGN paper did (docs/algorithms.md
§5.1).

random-edges: the forward edges are shuffled and cut into K + 2 equal groups; silo i owns
group i, each edge of group K goes to a random 2..K-1 silos, and the rest (last group plus the
remainder) goes to every silo. random-etypes: the same over whole edge types, so silos end
up with different schemas. Each silo keeps only the nodes its edges touch; reverse edges
(`rev_<relation>`) are removed before cutting and added back to each silo graph after.
For researchers building benchmarks; the product's silos simply read their own folder.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from trellis.silo.data.hetero import HeteroFormatError, HeteroGraph, save_hetero_folder

METHODS = ("random-edges", "random-etypes")
REVERSE_PREFIX = "rev_"

EdgeType = tuple[str, str, str]


def forward_edge_types(graph: HeteroGraph) -> list[EdgeType]:
    """Edge types that are not the added reverse of another edge type."""
    present = set(graph.edge_types)
    return [et for et in graph.edge_types
            if not (et[1].startswith(REVERSE_PREFIX)
                    and (et[2], et[1][len(REVERSE_PREFIX):], et[0]) in present)]


def split_graph(graph: HeteroGraph, method: str, clients: int, seed: int) -> list[HeteroGraph]:
    """The K silo graphs of one split (each with reverse edges added)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if clients < 3:
        raise ValueError("the FedHGN splits need at least 3 silos (p is drawn from 2..K-1)")
    rng = random.Random(seed)
    forward = forward_edge_types(graph)
    if method == "random-edges":
        items: list[tuple[EdgeType, int]] = [(et, i) for et in forward
                                             for i in range(graph.edges[et].shape[1])]
    else:
        items = [(et, -1) for et in forward]     # -1: the whole edge type
    rng.shuffle(items)
    owners = _assign(len(items), clients, rng)
    silos = []
    for k in range(clients):
        chosen: dict[EdgeType, list[int]] = {}
        for (et, i), holders in zip(items, owners, strict=True):
            if k in holders:
                chosen.setdefault(et, []).append(i)
        silos.append(_subgraph(graph, chosen, k))
    return silos


def _assign(count: int, clients: int, rng: random.Random) -> list[frozenset[int]]:
    """Which silos get each of `count` shuffled items."""
    seg = count // (clients + 2)
    everyone = frozenset(range(clients))
    owners: list[frozenset[int]] = []
    for position in range(count):
        block = position // seg if seg else clients + 1
        if block < clients:
            owners.append(frozenset({block}))
        elif block == clients:
            p = rng.randint(2, clients - 1)
            owners.append(frozenset(rng.sample(range(clients), p)))
        else:
            owners.append(everyone)
    return owners


def _subgraph(graph: HeteroGraph, chosen: dict[EdgeType, list[int]], k: int) -> HeteroGraph:
    """Keep the chosen edges (-1: all of the type) and the nodes they touch; add reverses."""
    kept: dict[EdgeType, np.ndarray] = {}
    for et in graph.edge_types:
        if et not in chosen:
            continue
        ids = chosen[et]
        index = graph.edges[et] if ids == [-1] else graph.edges[et][:, sorted(ids)]
        if index.shape[1]:
            kept[et] = index
    touched: dict[str, list[np.ndarray]] = {t: [] for t in graph.node_types}
    for (src, _, dst), index in kept.items():
        touched[src].append(index[0])
        touched[dst].append(index[1])
    present = {t: np.unique(np.concatenate(ids)) for t, ids in touched.items() if ids}
    node_types = tuple(t for t in graph.node_types if t in present)
    new_id = {}
    for t in node_types:
        new_id[t] = np.full(graph.num_nodes[t], -1, np.int64)
        new_id[t][present[t]] = np.arange(present[t].size)
    edges: dict[EdgeType, np.ndarray] = {}
    for (src, rel, dst), index in kept.items():
        mapped = np.stack([new_id[src][index[0]], new_id[dst][index[1]]])
        edges[(src, rel, dst)] = mapped
        edges[(dst, REVERSE_PREFIX + rel, src)] = mapped[::-1].copy()
    target = graph.target_type
    if target not in new_id:
        raise HeteroFormatError(f"silo {k} received no {target} node; try another seed")
    kept_targets = present[target]
    splits = []
    for idx in (graph.train_idx, graph.val_idx, graph.test_idx):
        mapped_idx = new_id[target][idx]
        splits.append(np.sort(mapped_idx[mapped_idx >= 0]))
    if any(s.size == 0 for s in splits):
        raise HeteroFormatError(f"silo {k} lacks training, validation or test {target} nodes; "
                                "try another seed or fewer silos")
    return HeteroGraph(node_types, {t: int(present[t].size) for t in node_types}, tuple(edges),
                       edges,
                       target, graph.num_classes, graph.labels[kept_targets], *splits)


def write_split(graph: HeteroGraph, method: str, clients: int, seed: int, out: Path) -> None:
    """Split and write `out/client-<k>` folders in the input format."""
    for k, silo in enumerate(split_graph(graph, method, clients, seed)):
        save_hetero_folder(silo, out / f"client-{k}", {
            "split": f"{method}_{clients}", "client": k, "num_clients": clients,
            "provenance": "regenerated",
            "note": f"silo split-hetero --method {method} --clients {clients} --seed {seed}"})
