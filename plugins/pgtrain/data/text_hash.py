"""PostgreSQL's ``hashtextextended(text, 0)`` in Python: the 64-bit hash a categorical value travels as
(``pgtrain.data.source.rows.text_hash``), so that ``load_predictor`` maps a raw value to its level exactly as the
loader and ``predict`` do, also for a level the version stores only as its hash.

It is Bob Jenkins' lookup3 as PostgreSQL's ``hash_bytes_extended`` (src/common/hashfn.c) computes it on a
little-endian server, over the value's UTF-8 bytes (a text value in collation "C"; a UTF8 database).
"""

from __future__ import annotations

_MASK = 0xFFFFFFFF


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _MASK


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    a = (a - c) & _MASK; a ^= _rot(c, 4); c = (c + b) & _MASK  # noqa: E702
    b = (b - a) & _MASK; b ^= _rot(a, 6); a = (a + c) & _MASK  # noqa: E702
    c = (c - b) & _MASK; c ^= _rot(b, 8); b = (b + a) & _MASK  # noqa: E702
    a = (a - c) & _MASK; a ^= _rot(c, 16); c = (c + b) & _MASK  # noqa: E702
    b = (b - a) & _MASK; b ^= _rot(a, 19); a = (a + c) & _MASK  # noqa: E702
    c = (c - b) & _MASK; c ^= _rot(b, 4); b = (b + a) & _MASK  # noqa: E702
    return a, b, c


def _final(a: int, b: int, c: int) -> tuple[int, int, int]:
    c ^= b; c = (c - _rot(b, 14)) & _MASK  # noqa: E702
    a ^= c; a = (a - _rot(c, 11)) & _MASK  # noqa: E702
    b ^= a; b = (b - _rot(a, 25)) & _MASK  # noqa: E702
    c ^= b; c = (c - _rot(b, 16)) & _MASK  # noqa: E702
    a ^= c; a = (a - _rot(c, 4)) & _MASK  # noqa: E702
    b ^= a; b = (b - _rot(a, 14)) & _MASK  # noqa: E702
    c ^= b; c = (c - _rot(b, 24)) & _MASK  # noqa: E702
    return a, b, c


def _word(data: bytes, at: int) -> int:
    return int.from_bytes(data[at:at + 4], "little")


def hashtextextended(text: str) -> int:
    """``hashtextextended(text, 0)`` as PostgreSQL returns it (a signed bigint)."""
    data = text.encode("utf-8")
    length = len(data)
    a = b = c = (0x9E3779B9 + length + 3923095) & _MASK
    at = 0
    while length - at >= 12:
        a = (a + _word(data, at)) & _MASK
        b = (b + _word(data, at + 4)) & _MASK
        c = (c + _word(data, at + 8)) & _MASK
        a, b, c = _mix(a, b, c)
        at += 12
    rest = data[at:]
    # The last 0..11 bytes: a and b take theirs as little-endian words; c's lowest byte is left for the length,
    # so its bytes go one higher.
    a = (a + int.from_bytes(rest[0:4], "little")) & _MASK
    b = (b + int.from_bytes(rest[4:8], "little")) & _MASK
    c = (c + (int.from_bytes(rest[8:11], "little") << 8)) & _MASK
    a, b, c = _final(a, b, c)
    value = (b << 32) | c
    return value - (1 << 64) if value >= 1 << 63 else value
