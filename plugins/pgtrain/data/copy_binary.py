"""PostgreSQL's binary COPY format, as far as pgtrain reads and writes it: the stream's header and trailer,
its rows, and single fields.

PostgreSQL sends one CopyData message per row, the header with the first one, so a stream read with
``rows`` is one memoryview per row with no copying; what a row holds is up to its reader (the loader views
whole batches with numpy, the tensor store and ``predict`` take a few fields with ``fields``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

from pgtrain.core.errors import PgtrainError

SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
HEADER = SIGNATURE + struct.pack(">ii", 0, 0)  # flags, header extension length: what writers send
TRAILER = struct.pack(">h", -1)
I16 = struct.Struct(">h")
I32 = struct.Struct(">i")


def rows(blocks: Iterable[memoryview | bytes]) -> Iterator[memoryview]:
    """Each row of a binary COPY stream (an iterable of CopyData messages, e.g. psycopg's ``Copy``), as it
    starts with its field count; the header is checked and skipped, the trailer left out."""
    first = True
    for block in blocks:
        block = memoryview(block)
        if first:
            block, first = skip_header(block), False
        if len(block) != 2:  # 2 bytes: the trailer (a row always holds its field count and a field)
            yield block


def skip_header(block: memoryview) -> memoryview:
    """The first message of a stream without the header (signature, flags, extension)."""
    if bytes(block[:len(SIGNATURE)]) != SIGNATURE:
        raise PgtrainError("the COPY stream does not start with the binary COPY signature")
    return block[len(SIGNATURE) + 8 + I32.unpack_from(block, len(SIGNATURE) + 4)[0]:]


def fields(row: memoryview) -> list[memoryview | None]:
    """The fields of one row (as ``rows`` yields it), None for NULL; views into the row, nothing copied."""
    count = I16.unpack_from(row, 0)[0]
    pos = 2
    out: list[memoryview | None] = []
    for _ in range(count):
        length = I32.unpack_from(row, pos)[0]
        pos += 4
        out.append(None if length < 0 else row[pos:pos + length])
        pos += max(length, 0)
    return out


def field(value: str | int | bytes) -> bytes:
    """One field to write: its length, then a str as UTF-8, an int as int4, bytes as they are."""
    data = value.encode() if isinstance(value, str) else I32.pack(value) if isinstance(value, int) else value
    return I32.pack(len(data)) + data

