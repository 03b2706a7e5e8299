"""How ``predict`` reads the table it scores: every row with a key, in key order, a page of keys at a time, each
page one binary COPY message holding its rows as ``record_send(ROW(key, features))`` (the features as
``source.feature_payload`` sends them to the loader), decoded with numpy.

A page whose records all have one width (a fixed-width key such as integer, bigint or uuid, and well-formed
features) is one numpy view: its keys stay binary COPY fields, ready to be written back, and its features go
through the loader's layout (``wire.fill_features``). A page with a wider or narrower record (a text key, a
NULL or wrong-length feature array) is walked record by record. Rows are judged on the client, as the loader
judges them: a NULL payload, a wrong shape, a NULL element or a non-finite float32 value (a value beyond
float32's range is one once stored) makes a row bad; only scalar columns are checked in SQL first
(``feature_checks`` without the per-value kinds), so that no payload is built from a NULL the model cannot
score.

``Alongside`` reads the pages on two more connections, in threads, while the first writes; ``pages`` reads
them on the transaction's own connection, when it cannot be shared.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import psycopg
from psycopg import sql

from pgtrain.core.errors import PgtrainError
from pgtrain.data import copy_binary
from pgtrain.data.loader import non_finite_rows
from pgtrain.data.source.resolve import COLUMNS, Source
from pgtrain.data.source.rows import feature_checks, feature_payload
from pgtrain.data.source.snapshot import Beside, prefer_index_order
from pgtrain.data.wire import feature_arrays, feature_groups_of, fill_features, source_feature_fields, well_formed


@dataclass(frozen=True)
class Page:
    """The good rows of a page: their keys as binary COPY fields (length word and value; a numpy ``V`` array
    when they share one width, else bytes each) and their features, float32 (rows, dim); how many were bad."""

    keys: np.ndarray | list[bytes]
    x: np.ndarray
    bad: int


class PageDecoder:
    """Binary COPY rows of (key, payload), as ``page_query`` selects them, into a ``Page``."""

    def __init__(self, source: Source, dim: int) -> None:
        self.dim = dim
        self.layout = np.dtype(source_feature_fields(source, dim))
        self.groups = feature_groups_of(source, dim)
        self.arrays = feature_arrays(self.layout, self.groups, dim)

    def page(self, data: memoryview | None) -> Page:
        """The page ``page_query`` sent: its rows as ``record_send(ROW(key, payload))`` back to back (None: none)."""
        if data is None:
            return Page([], np.empty((0, self.dim), np.float32), 0)
        # A record: column count, then per column its type oid, length and value.
        width, size = copy_binary.I32.unpack_from(data, 8)[0], self.layout.itemsize
        row_type = np.dtype({"names": ["n", "klen", "plen", "p"], "formats": [">i4", ">i4", ">i4", self.layout],
                             "offsets": [0, 8, 16 + width, 20 + width], "itemsize": 20 + width + size})
        if len(data) % row_type.itemsize == 0:
            records = np.frombuffer(data, row_type)
            # Every record of this width where the one before it ended: the view is the rows, none misread.
            if ((records["n"] == 2) & (records["klen"] == width) & (records["plen"] == size)).all():
                keys = np.frombuffer(data, np.dtype({"names": ["k"], "formats": [f"V{4 + width}"], "offsets": [8],
                                                     "itemsize": row_type.itemsize}))["k"]
                # Keys copied out: a page in flight holds its features and keys, not the message they came in.
                return self._judge(keys.copy(), records["p"], len(records))
        return self._walk(data)

    def _walk(self, data: memoryview) -> Page:
        """A page of uneven records, one at a time: rows whose payload has the layout's width are candidates."""
        keys, payloads, total, pos, size = [], [], 0, 0, self.layout.itemsize
        while pos < len(data):
            width = copy_binary.I32.unpack_from(data, pos + 8)[0]  # a key is never NULL
            key, pos = data[pos + 8:pos + 12 + width], pos + 12 + width
            length, pos = copy_binary.I32.unpack_from(data, pos + 4)[0], pos + 8
            if length == size:
                keys.append(bytes(key))
                payloads.append(data[pos:pos + length])
            pos, total = pos + max(length, 0), total + 1
        records = np.frombuffer(b"".join(payloads), self.layout, len(payloads))
        return self._judge(keys, records, total)

    def _judge(self, keys: np.ndarray | list[bytes], records: np.ndarray, total: int) -> Page:
        """The page's good rows of the candidate ``records``: flat arrays of the right length without NULLs
        (whose values were checked as read), then only finite values."""
        good = np.ones(len(records), bool)
        for prefix, count in self.arrays:
            good &= well_formed(records, prefix, count)
        if not good.all():
            records, keys = records[good], _select(keys, good)
        x = np.empty((len(records), self.dim), np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            fill_features(records, x, self.groups)
        if non_finite_rows(x):
            finite = np.isfinite(x).all(axis=1)
            x, keys = x[finite], _select(keys, finite)
        return Page(keys, x, total - len(x))


def _select(keys: np.ndarray | list[bytes], mask: np.ndarray) -> np.ndarray | list[bytes]:
    return keys[mask] if isinstance(keys, np.ndarray) else list(itertools.compress(keys, mask.tolist()))


def page_query(source: Source, dim: int, after: str | None = None, upto: str | None = None) -> sql.Composed:
    """COPY of one row, one field: the rows with a key in (after, upto] (the keys' text form; None: unbounded) as
    ``record_send(ROW(key, payload))`` back to back, in key order (one aggregate over a range scan of the key's
    index: no sort), so that the client handles a message per page, not per row."""
    payload = feature_payload(source)
    if source.feature_format == COLUMNS:
        checks = [c for kind, c in feature_checks(source, dim, values=False).items() if kind != "null_key"]
        if checks:
            payload = sql.SQL("CASE WHEN {} THEN NULL ELSE {} END").format(sql.SQL(" OR ").join(checks), payload)
    return sql.SQL("COPY (SELECT string_agg(record_send(ROW({key}, {payload})), ''::bytea ORDER BY {key}) FROM {rel} "
                   "WHERE {bounds}) TO STDOUT (FORMAT BINARY)").format(
        key=source.key, payload=payload, rel=source.relation, bounds=_bounds(source, after, upto))


def _bounds(source: Source, after: str | None, upto: str | None) -> sql.Composable:
    key_type = sql.SQL(source.key_type)  # format_type() of the key, from the catalog
    return sql.SQL(" AND ").join([sql.SQL("{} IS NOT NULL").format(source.key)] + [
        sql.SQL("{} {} CAST({} AS {})").format(source.key, sql.SQL(op), sql.Literal(value), key_type)
        for op, value in ((">", after), ("<=", upto)) if value is not None])


def page_ends(conn: psycopg.Connection, source: Source, page_rows: int) -> list[str]:
    """The last key (text form) of each full page of ``page_rows`` keys, in key order: one scan of the key's
    index. Rows / page_rows keys: 50 for 500,000 rows in pages of 10,000."""
    found = conn.execute(sql.SQL(
        "SELECT _pgtrain_i, CAST(_pgtrain_k AS text) FROM (SELECT {key} AS _pgtrain_k, row_number() OVER (ORDER BY "
        "{key}) AS _pgtrain_i FROM {rel} WHERE {key} IS NOT NULL) AS _pgtrain_keys WHERE _pgtrain_i % {n} = 0").format(
        key=source.key, rel=source.relation, n=sql.Literal(page_rows))).fetchall()
    return [key for _, key in sorted(found)]


def read_pages(conn: psycopg.Connection, source: Source, dim: int, spans: list[tuple[str | None, str | None]]
               ) -> Iterator[Page]:
    """One page per span of keys (after, upto] (None: unbounded), a COPY each, in the order given."""
    decoder = PageDecoder(source, dim)
    for after, upto in spans:
        with conn.cursor() as cur, cur.copy(page_query(source, dim, after, upto)) as copy:
            (row,) = copy_binary.rows(copy)
        page = decoder.page(copy_binary.fields(row)[0])
        del row  # the message is not held while the page waits to be taken
        yield page


def page_spans(conn: psycopg.Connection, source: Source, page_rows: int) -> list[tuple[str | None, str | None]]:
    """Every row's page as a span of keys (after, upto] of ``page_rows`` keys (None: unbounded), in key order, cut
    by ``page_ends``."""
    ends = page_ends(conn, source, page_rows)
    return list(zip([None, *ends], [*ends, None], strict=True))


def pages(conn: psycopg.Connection, source: Source, dim: int, page_rows: int,
          spans: list[tuple[str | None, str | None]] | None = None) -> Iterator[Page]:
    """Every row, a COPY per page of ``page_rows`` keys (``spans``: as ``page_spans`` cut them, if they are known
    already), the connection free between pages; pages without a row are not yielded."""
    for page in read_pages(conn, source, dim, spans if spans is not None else page_spans(conn, source, page_rows)):
        if page.bad or len(page.x):
            yield page


class _Stopped(Exception):
    """The caller stopped taking pages: the reading thread ends."""


class _Reader:
    """``read_pages`` of some spans on a second connection in the snapshot of ``conn``'s transaction (``Beside``),
    in a thread that hands each page over through a queue of ``depth``."""

    def __init__(self, conn: psycopg.Connection, source: Source, dim: int,
                 spans: list[tuple[str | None, str | None]], depth: int) -> None:
        self._queue: queue.Queue[Page] = queue.Queue(depth)
        self._stop = threading.Event()
        self._held: Page | None = None
        self._beside = Beside(conn, lambda other: self._read(other, source, dim, spans), "pgtrain-predict",
                              "reading the rows to score")

    def _read(self, conn: psycopg.Connection, source: Source, dim: int,
              spans: list[tuple[str | None, str | None]]) -> bool:
        prefer_index_order(conn)
        for page in read_pages(conn, source, dim, spans):
            while not self._stop.is_set():
                try:
                    self._queue.put(page, timeout=0.1)
                    break
                except queue.Full:
                    continue
            else:
                raise _Stopped
        return True

    def reading(self) -> bool:
        """Wait for the first page: False when the second connection could not read (it gave its work back)."""
        if self._held is None:
            self._held = self._take()
        return self._held is not None

    def next(self) -> Page:
        page, self._held = self._held or self._take(), None
        if page is None:
            raise PgtrainError("a connection reading the rows to score stopped midway; run predict again")
        return page

    def _take(self) -> Page | None:
        while True:
            try:
                return self._queue.get(timeout=0.1)
            except queue.Empty:
                if not self._beside.running() and self._queue.empty():
                    self._beside.result()  # raises the reading thread's error
                    return None

    def close(self) -> None:
        self._stop.set()
        self._beside.cancel()


class Alongside:
    """The pages, read by ``readers`` second connections in the snapshot of ``conn``'s open REPEATABLE READ
    transaction, in threads, each taking every readers-th page (``page_ends`` cut them first): reading and
    decoding run on other backends and threads while the caller runs the model and writes on ``conn``. Each
    reader holds at most depth + 1 pages, whatever the table's size."""

    def __init__(self, conn: psycopg.Connection, source: Source, dim: int, page_rows: int, readers: int = 2,
                 depth: int = 1) -> None:
        self.spans = page_spans(conn, source, page_rows)
        self._readers: list[_Reader] = []
        try:
            for r in range(min(readers, len(self.spans))):
                self._readers.append(_Reader(conn, source, dim, self.spans[r::readers], depth))
        except BaseException:
            self.close()
            raise

    def reading(self) -> bool:
        """Whether every reader has its first page: False when one could not read (the caller then closes this
        and reads on its own: ``pages``, with these ``spans``)."""
        return all(reader.reading() for reader in self._readers)

    def pages(self) -> Iterator[Page]:
        """Every page, in key order (call ``reading`` first)."""
        for i in range(len(self.spans)):
            yield self._readers[i % len(self._readers)].next()

    def close(self) -> None:
        """Stop reading (the caller is done or failed) and wait for the threads."""
        for reader in self._readers:
            reader.close()
