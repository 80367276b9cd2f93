"""Short, readable, unique names for the URIs that become node types and relations.

A URI's name is its local name (after the last ``#`` or ``/``); URIs whose local names clash
take more of their path (``foaf/0.1/name`` beside ``example.org/name``) until every name is
unique. The names stay on the silo (FedHGN never sends one: docs/algorithms.md §5.3).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_SEGMENT = re.compile(r"[/#]")


def _segments(uri: str) -> list[str]:
    parts = [p for p in _SEGMENT.split(uri) if p]
    return parts or [uri]


def _name(uri: str, depth: int) -> str:
    parts = _segments(uri)
    if depth >= len(parts):
        return uri
    return "/".join(parts[-depth:])


def short_names(uris: Iterable[str], reserved: Iterable[str] = (),
                reverse_prefix: str = "") -> dict[str, str]:
    """URI -> a unique short name, none equal to a `reserved` one.

    With `reverse_prefix`, the names stay unique after each gains a prefixed twin (the reverse
    relation ``rev_<name>``): no name equals another's prefix plus name.
    """
    ordered = sorted(set(uris))
    taken = set(reserved)
    depth = dict.fromkeys(ordered, 1)
    while True:
        names = {u: _name(u, depth[u]) for u in ordered}
        clashing = _clashes(names, taken, reverse_prefix)
        if not clashing:
            return names
        grown = False
        for u in clashing:
            if names[u] != u:
                depth[u] += 1
                grown = True
        if not grown:       # only full URIs clash now (impossible for distinct URIs but with a
            # reserved name); number them in sorted order
            return _numbered(names, taken, reverse_prefix)


def _clashes(names: dict[str, str], taken: set[str], reverse_prefix: str) -> list[str]:
    """URIs whose names are not unique (with their reverses, when there are any)."""
    seen: dict[str, list[str]] = {}
    for u, n in names.items():
        seen.setdefault(n, []).append(u)
        if reverse_prefix:
            seen.setdefault(reverse_prefix + n, []).append(u)
    bad = {u for n, us in seen.items() if len(us) > 1 or n in taken for u in us}
    return sorted(bad)


def _numbered(names: dict[str, str], taken: set[str], reverse_prefix: str) -> dict[str, str]:
    used = set(taken)
    out = {}
    for u, n in names.items():
        candidate, k = n, 1
        while candidate in used or (reverse_prefix and reverse_prefix + candidate in used):
            k += 1
            candidate = f"{n}_{k}"
        out[u] = candidate
        used.add(candidate)
        if reverse_prefix:
            used.add(reverse_prefix + candidate)
    return out
