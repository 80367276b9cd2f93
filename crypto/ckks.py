"""Pairwise cosine similarity of silo updates under CKKS, with blinded decryption (GCFL clustering).

Flow:

1. The leader silo calls `make_ckks_contexts`: the SECRET context goes to every silo inside
   `GroupSecrets.ckks_secret` (crypto/groupkey.py), the PUBLIC one (relinearisation and Galois
   keys, no secret key) to the coordinator.
2. Each silo L2-normalises its update and encrypts it with `encrypt_unit_vector`:
   ceil(d / 4096) CKKS vectors.
3. The coordinator, holding only the public context, calls `blinded_inner_products`: for every
   pair i < j the encrypted inner product plus a random offset r_ij that it keeps.
4. One silo decrypts the blinded values with `decrypt_blinded` and returns plain floats.
5. The coordinator calls `similarity_matrix`, which subtracts the offsets: cos_ij.

Parameters: poly_modulus_degree 8192 (4096 slots), coeff_mod_bit_sizes [60, 40, 40, 60], scale
2**40, symmetric (secret-key) encryption. Symmetric encryption is chosen because only silos,
which hold the secret key anyway, ever encrypt: it makes the secret context a third of the size
(it carries no public key) and encryption twice as fast, and ciphertexts are the same size.

Measured sizes and timings (TenSEAL 0.3.18, one CPU core; d = 24,960, i.e. 7 chunks):

* secret context (secret + relinearisation keys, no Galois keys): about 233 KB;
* public context (relinearisation + Galois keys): about 34.8 MB -- the Galois keys for every
  power-of-two rotation dominate; send it once per federation, in chunks (gRPC's default message
  limit is 4 MB);
* one encrypted chunk: about 331 KB (so about 2.3 MB per silo per clustering step);
  one blinded inner product: about 235 KB;
* making the contexts: about 0.5 s; loading the secret context: about 50 ms, the public one:
  about 0.1-0.15 s (each call below loads its context once);
* encrypting a 24,960-vector: about 30 ms; one pairwise blinded inner product: about 0.12 s
  (4 silos, 6 pairs: about 0.85 s in all); decrypting one blinded value: under 1 ms;
  absolute error of a cosine: about 1e-5.

Threat model and limits:

* All silos share one CKKS secret key. The coordinator must therefore never forward a silo's
  encrypted update to another silo, and it sends the decrypting silo only blinded scalars.
  After TenSEAL's rotate-and-sum every slot holds the inner product, and TenSEAL adds the
  offset to every slot, so a silo that decrypts the whole plaintext still sees only r + c.
* The coordinator is trusted to be honest-but-curious here: a malicious one could ask for the
  decryption of <v_i, u> for a chosen u instead of <v_i, v_j>. `decrypt_blinded` bounds that to
  one scalar per expected pair (it refuses unexpected pairs and any ciphertext that is not a
  single value), but it cannot tell what was multiplied.
* Blinding is statistical: the decrypting silo sees y = r + c with r uniform in [-B, B] and
  |c| <= 1, so for any two cosines c, c' its views differ in statistical distance by at most
  |c - c'| / (2B) <= 1 / B. Larger B hides better; CKKS error is additive (about 1e-5 here,
  independent of B up to about 2**30, measured), so B = 2**20 costs no precision and leaves the
  silo an advantage of at most about 1e-6 per value. No noise flooding is applied: the CKKS
  noise in y (about 1e-5) comes mostly from encryption randomness but has terms that depend
  weakly on the two updates (m_i * e_j), a small leak this module does not quantify.
* The offsets are drawn with `secrets` (a CSPRNG): a seeded numpy generator is only for tests,
  since the decrypting silo sees the offsets almost exactly and could recover a weak PRNG's state.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import tenseal as ts  # type: ignore[import-untyped]

from trellis.crypto.errors import EncodingError, ProtocolError

POLY_MODULUS_DEGREE = 8192
COEFF_MOD_BIT_SIZES = (60, 40, 40, 60)
GLOBAL_SCALE = 2.0**40
SLOTS = POLY_MODULUS_DEGREE // 2
DEFAULT_BLINDING_BOUND = 2.0**20
# Beyond this, the blinded value would eat into the 60-bit first prime's headroom over the scale.
MAX_BLINDING_BOUND = 2.0**30
# CKKS error is about 1e-5; a "cosine" further outside [-1, 1] than this means a wrong offset or a
# corrupted ciphertext, not noise.
_COSINE_SLACK = 1e-2

Pair = tuple[str, str]


def make_ckks_contexts() -> tuple[bytes, bytes]:
    """Draw a CKKS key set; return (secret context for silos, public context for coordinator)."""
    context = ts.context(ts.SCHEME_TYPE.CKKS, poly_modulus_degree=POLY_MODULUS_DEGREE,
                         coeff_mod_bit_sizes=list(COEFF_MOD_BIT_SIZES),
                         encryption_type=ts.ENCRYPTION_TYPE.SYMMETRIC)
    context.global_scale = GLOBAL_SCALE
    # Serialised before the Galois keys exist: silos never rotate, and a secret context that
    # records Galois keys regenerates them (about 35 MB) every time it is loaded.
    secret = context.serialize(save_secret_key=True, save_galois_keys=False)
    context.generate_galois_keys()
    public = context.serialize(save_secret_key=False, save_galois_keys=True,
                               save_relin_keys=True)
    return bytes(secret), bytes(public)


def _load_context(data: bytes, what: str) -> Any:
    try:
        return ts.context_from(bytes(data))
    except Exception:  # TenSEAL raises assorted ValueError/RuntimeError types
        raise ProtocolError(f"{what} is not a serialized TenSEAL context") from None


def _load_secret(data: bytes) -> Any:
    context = _load_context(data, "the CKKS secret context")
    if not context.is_private():
        raise ProtocolError("the CKKS context holds no secret key: silos need the secret context")
    return context


def _load_public(data: bytes) -> Any:
    context = _load_context(data, "the CKKS public context")
    if context.is_private():
        raise ProtocolError("the CKKS context holds a secret key: the coordinator must only ever "
                            "hold the public context")
    if not context.has_galois_keys() or not context.has_relin_keys():
        raise ProtocolError("the CKKS public context lacks Galois or relinearisation keys")
    return context


def check_public_context(data: bytes) -> None:
    """Refuse a context the coordinator must not hold (a secret key) or cannot use."""
    _load_public(data)


def chunk_count(length: int) -> int:
    """Number of CKKS vectors a vector of this length is encrypted as."""
    return math.ceil(length / SLOTS)


def _unit(vector: np.ndarray) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise EncodingError(f"expected a non-empty 1-D vector, got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise EncodingError("vector contains NaN or infinity")
    # Scaling by the largest entry first keeps the norm from overflowing or underflowing.
    peak = float(np.max(np.abs(v)))
    if peak == 0.0:
        raise EncodingError("a zero vector has no direction: its cosine similarity is undefined")
    v = v / peak
    unit: np.ndarray = v / np.linalg.norm(v)
    return unit


def encrypt_unit_vector(context_bytes: bytes, vector: np.ndarray) -> list[bytes]:
    """L2-normalise a 1-D vector and encrypt it (secret context) as ceil(d / 4096) CKKS vectors."""
    context = _load_secret(context_bytes)
    unit = _unit(vector)
    return [bytes(ts.ckks_vector(context, unit[start:start + SLOTS].tolist()).serialize())
            for start in range(0, unit.size, SLOTS)]


def pairs_of(members: Iterable[str]) -> list[Pair]:
    """Every unordered pair of distinct members as (a, b) with a < b, sorted."""
    names = sorted(set(members))
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]


def _load_vectors(context: Any, silo: str, chunks: Sequence[bytes]) -> list[Any]:
    if isinstance(chunks, bytes | bytearray) or len(chunks) == 0:
        raise ProtocolError(f"{silo!r} sent no list of encrypted chunks")
    try:
        return [ts.ckks_vector_from(context, bytes(chunk)) for chunk in chunks]
    except Exception:  # TenSEAL raises assorted ValueError/RuntimeError types
        raise ProtocolError(f"an encrypted chunk from {silo!r} does not load under the CKKS "
                            "public context") from None


def _uniform(bound: float, rng: np.random.Generator | None) -> float:
    if rng is not None:
        return float(rng.uniform(-bound, bound))
    return (secrets.randbits(53) / 2.0**53 * 2.0 - 1.0) * bound


def blinded_inner_products(public_context: bytes, ciphertexts: Mapping[str, Sequence[bytes]],
                           rng: np.random.Generator | None = None,
                           bound: float = DEFAULT_BLINDING_BOUND,
                           ) -> tuple[dict[Pair, bytes], dict[Pair, float]]:
    """Coordinator: encrypted <v_a, v_b> + r_ab for each pair a < b; return (blinded, offsets)."""
    if not 0.0 < bound <= MAX_BLINDING_BOUND:
        raise ProtocolError(f"blinding bound must be in (0, 2**30], got {bound!r}")
    if len(ciphertexts) < 2:
        raise ProtocolError("similarities need encrypted updates from at least two silos")
    context = _load_public(public_context)
    vectors = {silo: _load_vectors(context, silo, chunks) for silo, chunks in ciphertexts.items()}
    shapes = {silo: tuple(chunk.size() for chunk in chunks) for silo, chunks in vectors.items()}
    if len(set(shapes.values())) != 1:
        layout = ", ".join(f"{silo}: {len(shape)} chunks, {sum(shape)} values"
                           for silo, shape in sorted(shapes.items()))
        raise ProtocolError(f"encrypted updates differ in chunk layout ({layout})")
    blinded: dict[Pair, bytes] = {}
    offsets: dict[Pair, float] = {}
    for a, b in pairs_of(vectors):
        total: Any = None
        for x, y in zip(vectors[a], vectors[b], strict=True):
            product = x.dot(y)
            total = product if total is None else total + product
        offset = _uniform(bound, rng)
        blinded[(a, b)] = bytes((total + offset).serialize())
        offsets[(a, b)] = offset
    return blinded, offsets


def decrypt_blinded(secret_context: bytes, blinded: Mapping[Pair, bytes],
                    members: Iterable[str] | None = None) -> dict[Pair, float]:
    """Silo: decrypt blinded scalars; with members, refuse anything but exactly their pairs."""
    context = _load_secret(secret_context)
    if members is not None:
        expected = set(pairs_of(members))
        if set(blinded) != expected:
            unexpected = sorted(set(blinded) - expected)
            missing = sorted(expected - set(blinded))
            raise ProtocolError(f"blinded values for unexpected pairs {unexpected} or missing "
                                f"pairs {missing}")
    out: dict[Pair, float] = {}
    for pair, data in blinded.items():
        if len(pair) != 2 or not pair[0] < pair[1]:
            raise ProtocolError(f"pair {pair!r} is not two silo names in ascending order")
        try:
            vector = ts.ckks_vector_from(context, bytes(data))
        except Exception:  # TenSEAL raises assorted ValueError/RuntimeError types
            raise ProtocolError(f"blinded value for {pair!r} does not load under the CKKS "
                                "secret context") from None
        # Only a scalar is ever released: a full vector here could be someone's encrypted update.
        if vector.size() != 1:
            raise ProtocolError(f"blinded value for {pair!r} holds {vector.size()} values, not 1")
        out[pair] = float(vector.decrypt()[0])
    return out


def similarity_matrix(members: Sequence[str], decrypted_blinded: Mapping[Pair, float],
                      offsets: Mapping[Pair, float]) -> np.ndarray:
    """Coordinator: unblind into a symmetric cosine matrix (rows in members' order, 1 diagonal)."""
    if len(set(members)) != len(members):
        raise ProtocolError("members must be distinct")
    index = {name: i for i, name in enumerate(members)}
    matrix = np.eye(len(members), dtype=np.float64)
    for a, b in pairs_of(members):
        if (a, b) not in decrypted_blinded or (a, b) not in offsets:
            raise ProtocolError(f"no blinded similarity or offset for pair ({a!r}, {b!r})")
        cosine = float(decrypted_blinded[(a, b)]) - float(offsets[(a, b)])
        if not math.isfinite(cosine) or abs(cosine) > 1.0 + _COSINE_SLACK:
            raise ProtocolError(f"unblinded similarity of ({a!r}, {b!r}) is {cosine!r}, not a "
                                "cosine: wrong offsets or a corrupted ciphertext")
        # Clipped to absorb CKKS noise, so downstream clustering sees a valid cosine.
        cosine = min(1.0, max(-1.0, cosine))
        matrix[index[a], index[b]] = matrix[index[b], index[a]] = cosine
    return matrix
