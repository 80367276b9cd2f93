"""Pairwise additive masking (DESIGN.md §5): masks between every pair of silos cancel in the sum.

Silo ``i`` adds ``PRG(k_ij)`` for every peer ``j`` ranked after it and subtracts it for every peer
ranked before it, in the ring of the fixed-point encoding. Summing all participants' masked
vectors cancels every mask, so the coordinator learns the sum and nothing else -- provided every
participant's vector arrives. Dropout recovery (Bonawitz et al. 2017) builds on this in a later
stage of the protocol.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from crypto.errors import EncodingError, ProtocolError
from crypto.fixedpoint import FixedPointSpec
from crypto.keyagreement import EphemeralKeyPair, KeyAdvert, RoundContext, derive_key
from crypto.prg import expand_mask

MASK_PURPOSE = "pairwise-mask"


def mask_vector(
    encoded: np.ndarray,
    me: str,
    my_keys: EphemeralKeyPair,
    peers: Mapping[str, KeyAdvert],
    context: RoundContext,
) -> np.ndarray:
    """Add this silo's pairwise masks towards every verified peer advert to an encoded vector."""
    if encoded.ndim != 1:
        raise EncodingError("only flat encoded vectors can be masked")
    masked = encoded.copy()
    for peer, advert in sorted(peers.items()):
        if peer == me:
            continue
        if advert.silo != peer:
            raise ProtocolError(f"advert filed under {peer!r} names {advert.silo!r}")
        key = derive_key(my_keys.agree(advert.public_key), context, MASK_PURPOSE, me, peer)
        mask = expand_mask(key, encoded.size, encoded.dtype.type)
        if me < peer:
            masked += mask
        else:
            masked -= mask
    return masked


def sum_vectors(vectors: Iterable[np.ndarray], spec: FixedPointSpec) -> np.ndarray:
    """Ring sum of masked vectors of one length (numpy's unsigned arithmetic wraps for free)."""
    total: np.ndarray | None = None
    for vector in vectors:
        if vector.dtype != spec.dtype or vector.ndim != 1:
            raise EncodingError(f"masked vectors must be 1-d {np.dtype(spec.dtype).name}")
        if total is None:
            total = vector.copy()
        elif vector.shape != total.shape:
            raise EncodingError(f"masked vector of length {vector.size}, expected {total.size}")
        else:
            total += vector
    if total is None:
        raise EncodingError("no vectors to sum")
    return total
