"""The split of integer keys computed on the client, the same as the server's (``rows.split_part``): the part of
each row from ``hashtextextended(key::text, seed)``, for a whole batch of keys at once in numpy.

The loader reads integer keys' rows with their key instead of their part (``loader.batch_query``): hashing every
key's text form cost the server a third of the batched COPY (benchmarks/RESULTS.md), and the hash is Bob Jenkins'
lookup3 (PostgreSQL's ``hash_bytes_extended``, ``pgtrain.data.text_hash``), a few vector operations per key here.
"""

from __future__ import annotations

import numpy as np

from pgtrain.data.source.rows import SPLIT_BUCKETS, TEST, TRAIN, VALIDATION, split_bounds

INTEGER_KEYS = ("smallint", "integer", "bigint")
_DIGITS = 20  # of the largest bigint magnitude, 2**63
_POWERS = np.array([10 ** k for k in range(_DIGITS)], np.uint64)
_U32 = np.uint32


def _rot(x: np.ndarray, k: int) -> np.ndarray:
    return (x << _U32(k)) | (x >> _U32(32 - k))


def _mix(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a -= c; a ^= _rot(c, 4); c += b  # noqa: E702
    b -= a; b ^= _rot(a, 6); a += c  # noqa: E702
    c -= b; c ^= _rot(b, 8); b += a  # noqa: E702
    a -= c; a ^= _rot(c, 16); c += b  # noqa: E702
    b -= a; b ^= _rot(a, 19); a += c  # noqa: E702
    c -= b; c ^= _rot(b, 4); b += a  # noqa: E702
    return a, b, c


def _final(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    c ^= b; c -= _rot(b, 14)  # noqa: E702
    a ^= c; a -= _rot(c, 11)  # noqa: E702
    b ^= a; b -= _rot(a, 25)  # noqa: E702
    c ^= b; c -= _rot(b, 16)  # noqa: E702
    a ^= c; a -= _rot(c, 4)  # noqa: E702
    b ^= a; b -= _rot(a, 14)  # noqa: E702
    c ^= b; c -= _rot(b, 24)  # noqa: E702
    return a, b, c


def _hash_texts(text: np.ndarray, seed: int) -> np.ndarray:
    """``hash_bytes_extended`` of each row of ``text`` (n x length ASCII bytes), as signed 64-bit integers."""
    count, length = text.shape
    words = np.zeros((count, -(-(length + 1) // 12) * 12), np.uint8)  # zero-padded: a tail's missing bytes add 0
    words[:, :length] = text
    words = words.view("<u4")
    a = np.full(count, (0x9E3779B9 + length + 3923095) & 0xFFFFFFFF, _U32)
    b, c = a.copy(), a.copy()
    if seed:
        a += _U32((seed >> 32) & 0xFFFFFFFF)
        b += _U32(seed & 0xFFFFFFFF)
        a, b, c = _mix(a, b, c)
    blocks = length // 12
    for block in range(blocks):
        a += words[:, 3 * block]
        b += words[:, 3 * block + 1]
        c += words[:, 3 * block + 2]
        a, b, c = _mix(a, b, c)
    if length > 12 * blocks:  # the last 1..11 bytes: c's lowest byte is left for the length, its bytes go higher
        a += words[:, 3 * blocks]
        b += words[:, 3 * blocks + 1]
        c += words[:, 3 * blocks + 2] << _U32(8)
    a, b, c = _final(a, b, c)
    return ((b.astype(np.uint64) << np.uint64(32)) | c).view(np.int64)


def hash_key_texts(keys: np.ndarray, seed: int) -> np.ndarray:
    """``hashtextextended(key::text, seed)`` of each integer key (int64), as PostgreSQL returns it."""
    keys = np.asarray(keys, np.int64)
    negative = keys < 0
    magnitude = np.where(negative, -keys, keys).view(np.uint64)  # -(-2**63) wraps to 2**63: right as unsigned
    lengths = np.maximum(np.searchsorted(_POWERS, magnitude, side="right"), 1) + negative  # digits, and the sign
    out = np.empty(len(keys), np.int64)
    present = np.flatnonzero(np.bincount(lengths))
    for length in map(int, present):
        rows = slice(None) if len(present) == 1 else np.flatnonzero(lengths == length)
        value = magnitude[rows]
        text = np.empty((len(value), length), np.uint8)
        for place in range(length):  # from the ones digit back; a sign overwrites a leading 0
            quotient = value // 10
            text[:, length - 1 - place] = value - quotient * 10
            value = quotient
        text += 48
        text[negative[rows], 0] = ord("-")
        out[rows] = _hash_texts(text, seed)
    return out


def split_parts(keys: np.ndarray, validation_fraction: float, test_fraction: float, seed: int) -> np.ndarray:
    """Each integer key's part of the split (TRAIN, VALIDATION, TEST as uint8), as ``rows.split_part`` computes it
    on the server: abs(mod(hash, buckets)), mod truncating as PostgreSQL's does."""
    hashes = hash_key_texts(keys, seed)
    floored = hashes % SPLIT_BUCKETS
    bucket = np.where((hashes < 0) & (floored != 0), SPLIT_BUCKETS - floored, floored)
    wide = np.searchsorted(np.array(split_bounds(validation_fraction, test_fraction)), bucket, side="right")
    return _PARTS[wide]


_PARTS = np.array([VALIDATION, TEST, TRAIN], np.uint8)  # below the first bound, below the second, above
