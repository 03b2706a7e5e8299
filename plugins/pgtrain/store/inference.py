"""Use a committed version: ``load_model`` rebuilds it from its spec alone; ``predict`` scores a table with it.

``predict`` resolves the table like a training source (``source.resolve_source``: a unique index on the key,
exact column names), reads it once in key order as plain binary COPY rows of (key, features as
``source.feature_payload`` sends them to the loader), decoded a page at a time with numpy
(``scoring_read``), runs the model on each page, and COPYs (key, prediction) into the target table, all in one
transaction: the predictions land together or not at all. In its own snapshot, two more connections read
(alternate pages, in threads) while this one runs the model and writes (one COPY): reading, forward and
writing overlap, and memory holds a few pages whatever the table's size. Rows the loader would call bad (NULL key,
NULL, non-finite or out-of-range features, wrong length) stop it with a report, or are skipped when asked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from pgtrain.core import db
from pgtrain.core.errors import PgtrainError, SourceError
from pgtrain.data import encoding, input_record
from pgtrain.data.input_record import InputRecord
from pgtrain.data.source.resolve import (
    CATEGORY,
    COLUMNS,
    MissingColumnError,
    Source,
    resolve_source,
)
from pgtrain.data.source.rows import BAD_ROW_KINDS, COLUMN_KINDS, feature_checks
from pgtrain.data.source.snapshot import prefer_index_order, snapshot_transaction
from pgtrain.store import model_store, scoring_read
from pgtrain.store.prediction_rows import class_fields, label_type, page_rows, probabilities_of
from pgtrain.store.prediction_table import DEFAULT_MODE, finish, open_target, prediction_copy
from pgtrain.store.scoring_read import Alongside, Page

if TYPE_CHECKING:
    import torch

DEFAULT_BATCH_ROWS = 10_000
EXAMPLE_KEYS = 10  # as many as pgtrain.example_keys keeps


@dataclass(frozen=True)
class Prediction:
    model_name: str
    version: int
    into: str
    rows: int
    skipped: int = 0  # bad rows left out (skip_bad_rows)
    mode: str = DEFAULT_MODE


def load_model(conn_or_url: psycopg.Connection | str, name: str, version: int | str = "head") -> torch.nn.Module:
    """The version (``"head"`` or a number) as a torch module in eval mode, built by
    ``pgtrain.models.network.build_model`` from what the version records and loaded strictly with its state dict.

    A URL is opened with ``pgtrain.core.db.connect``: a malformed one is a ConfigError that does not quote its
    password."""
    with _connection(conn_or_url) as conn:
        number, spec, _ = model_store.version_layout(conn, name, _version_number(version))
        _, arrays = model_store.load_tensors(conn, name, number)
    return _build(name, number, spec, arrays)


def predict(conn: psycopg.Connection, name: str, version: int | str | None, source: str, key_column: str, into: str,
            feature_columns: Sequence[str] | None = None, batch_rows: int = DEFAULT_BATCH_ROWS, *,
            skip_bad_rows: bool = False, probabilities: bool = False, mode: str = DEFAULT_MODE) -> Prediction:
    """Score every row of ``source`` with the version and write (key, prediction) into ``into``, in one transaction
    (a failure leaves ``into`` as it was).

    ``source`` needs a unique index on ``key_column``, as a training source does. Feature columns default to
    those recorded with the version. A row the model cannot score (a NULL key; NULL, NaN, infinite or
    out-of-range features; a feature array of the wrong length) is a SourceError reporting how many and
    example keys, unless ``skip_bad_rows``: then those rows get no prediction and are counted. ``into`` is
    created when missing, with the source key's type and ``prediction`` integer (classification), double
    precision (a scalar target) or double precision[]; an existing table must have those columns, and any other
    column of it must take NULL or have a default. ``mode`` (``prediction_table``): ``upsert`` (each scored key's
    row inserted or updated), ``replace`` (the table's rows become this run's) or ``append`` (refused when the table
    holds a key of the source already). ``probabilities``: also each class's probability, the classes recorded in
    the column's comment (``prediction_table.probability_classes``).
    """
    if batch_rows < 1:
        raise PgtrainError(f"batch_rows must be at least 1, got {batch_rows}")
    with _scoring_transaction(conn) as own_snapshot:
        number, spec, _ = model_store.version_layout(conn, name, _version_number(version))
        _, arrays = model_store.load_tensors(conn, name, number)
        model = _build(name, number, spec, arrays)
        planned = input_record.of_version(spec)
        input_dim, output_dim = planned.input_dim, planned.output_dim
        scored = _scoring_source(conn, name, number, planned, source, key_column, feature_columns)
        classify = planned.task == "classification"
        if probabilities and not classify:
            raise PgtrainError(f"model {name!r} version {number} is a regression: it has no class probabilities")
        classes = planned.classes if classify else None
        prediction_type = (label_type(conn, planned.label_sql_type) if classes is not None
                           else "integer" if classify else "double precision" if output_dim == 1
                           else "double precision[]")
        fields = class_fields(conn, classes, prediction_type) if classes is not None else None
        skipped = _null_keys(conn, scored)
        if skipped and not skip_bad_rows:
            raise SourceError(_bad_rows_message(conn, scored, input_dim))
        named = (classes if classes is not None else [str(c) for c in range(output_dim)]) if probabilities else None
        target = open_target(conn, into, scored, prediction_type, mode, named)

        def score(pages: Iterator[Page], write: Callable[[bytes], None]) -> None:
            nonlocal rows, skipped
            for page in pages:
                if page.bad and not skip_bad_rows:
                    raise _BadRows
                skipped += page.bad
                if len(page.x):
                    write(page_rows(page.keys, _forward(model, page.x), classify, output_dim, fields, probabilities))
                    rows += len(page.x)

        rows = 0
        try:
            # Its own snapshot can be shared: other connections read while this one writes, in one COPY.
            alongside = Alongside(conn, scored, input_dim, batch_rows) if own_snapshot else None
            try:
                shared = alongside is not None and alongside.reading()
                if shared:
                    with prediction_copy(conn, target) as write, _torch_beside_a_reader():
                        score(alongside.pages(), write)
            finally:
                if alongside is not None:
                    alongside.close()
            if not shared:  # its pages are cut already when the second connections could not read
                for page in scoring_read.pages(conn, scored, input_dim, batch_rows, alongside and alongside.spans):
                    with prediction_copy(conn, target) as write:
                        score(iter((page,)), write)
        except _BadRows:
            raise SourceError(_bad_rows_message(conn, scored, input_dim)) from None
        finish(conn, target)
    return Prediction(name, number, into, rows, skipped, mode)


class _BadRows(Exception):
    """A page holds a row the model cannot score (and bad rows are not skipped): the report follows."""


class Predictor:
    """A committed version that scores rows given as mappings of column name -> Python value (what psycopg
    returns), encoded exactly as training encoded its rows; labels come back in the target column's type."""

    def __init__(self, name: str, version: int, spec: dict[str, Any], model: torch.nn.Module) -> None:
        self.name, self.version, self.spec, self.model = name, version, spec, model
        self.input = input_record.of_version(spec)
        self.columns = self.input.columns
        self.feature_columns = self.input.feature_columns
        self.task = self.input.task
        self.classes = self.input.classes if self.task == "classification" else None
        self.label_type = self.input.label_type

    def inputs(self, rows: Iterable[Mapping[str, Any]]) -> np.ndarray:
        """The rows as the model's input rows (float32); a value that cannot be read is a SourceError naming its
        row (index, and key when the row has the version's key column) and column."""
        rows = list(rows)
        try:
            return self._inputs(rows)
        except (ValueError, TypeError, KeyError, SourceError) as error:
            if isinstance(error, SourceError) and str(error).startswith("row "):  # named already (encoding)
                raise
            raise self._cell_error(rows, error) from None

    def _inputs(self, rows: list[Mapping[str, Any]]) -> np.ndarray:
        if not self.input.is_array_input:
            return encoding.input_rows(self.columns, rows)
        column = self.input.features_column  # one array (or packed float32 bytea) column
        out = np.empty((len(rows), self.input.input_dim), np.float32)
        for i, row in enumerate(rows):
            value = row[column]
            out[i] = np.frombuffer(value, "<f4") if isinstance(value, bytes | memoryview) else value
        return out

    def _cell(self, row: Mapping[str, Any], position: int) -> None:
        """Read one value of a row as ``_inputs`` reads it (raises as it would)."""
        if self.input.is_array_input:
            self._inputs([row])
        else:
            encoding.input_rows(self.columns[position:position + 1], [row])

    def _cell_error(self, rows: list[Mapping[str, Any]], error: Exception) -> SourceError:
        """The first (row, column) whose value fails alone as the batch did, named (values are read one at a time
        only once a batch has failed)."""
        key = self.input.key_column
        names = list(self.feature_columns)
        for i, row in enumerate(rows):
            for position, name in enumerate(names):
                try:
                    self._cell(row, position)
                except KeyError:
                    return SourceError(f"row {i}{_key_of(row, key)} has no column {name!r}; the model's input "
                                       f"columns are {', '.join(map(repr, names))}")
                except (ValueError, TypeError, SourceError) as cell:
                    return SourceError(f"row {i}{_key_of(row, key)}, column {name!r}: {row[name]!r} cannot be read "
                                       f"as the model's input ({cell})")
        return SourceError(f"the rows cannot be read as the model's input: {error}")

    def outputs(self, rows: Iterable[Mapping[str, Any]]) -> np.ndarray:
        return _forward(self.model, self.inputs(rows))

    def predict_proba(self, rows: Iterable[Mapping[str, Any]]) -> np.ndarray:
        """Classification: each row's class probabilities (rows x classes), in ``classes`` order."""
        if self.task != "classification":
            raise PgtrainError(f"model {self.name!r} version {self.version} is a regression: no probabilities")
        return probabilities_of(self.outputs(rows))

    def predict(self, rows: Iterable[Mapping[str, Any]]) -> list[Any]:
        """Each row's prediction: its class in the label's type (text, bool, int, ...), or the regression target
        (a float, or a list of floats)."""
        out = self.outputs(rows)
        if self.task != "classification":
            return out[:, 0].tolist() if out.shape[1] == 1 else out.tolist()
        best = out.argmax(axis=1).tolist()
        if self.classes is None:
            return best
        return [encoding.from_text(self.classes[i], self.label_type) for i in best]


def _key_of(row: Mapping[str, Any], key: str | None) -> str:
    return f" ({key} {row[key]!r})" if key and key in row else ""


def load_predictor(conn_or_url: psycopg.Connection | str, name: str, version: int | str = "head") -> Predictor:
    """The version (``"head"`` or a number) as a :class:`Predictor`: ``predict(rows)``, ``predict_proba(rows)``."""
    with _connection(conn_or_url) as conn:
        number, spec, _ = model_store.version_layout(conn, name, _version_number(version))
        _, arrays = model_store.load_tensors(conn, name, number)
    return Predictor(name, number, spec, _build(name, number, spec, arrays))


# -- the model --------------------------------------------------------------------------------------------
def _build(name: str, version: int, spec: dict[str, Any], arrays: dict[str, np.ndarray]) -> torch.nn.Module:
    import torch

    from pgtrain.models.network import build_model

    planned = input_record.of_version(spec)
    if not spec.get("model") or not planned.input_dim or not planned.output_dim:
        raise PgtrainError(f"model {name!r} version {version} records no model spec to rebuild it from; "
                           "export its state dict instead (pgtrain-models export)")
    # The encoding the module was built with, as stored (a version from before encodings: none, no Encode layer).
    model = build_model(spec["model"], planned.input_dim, planned.output_dim, spec.get("model_options") or {},
                        seed=0, encoding=spec.get("encoding"), task=planned.task)
    # assign: the module's tensors become the arrays just read, instead of a second copy of the weights
    model.load_state_dict({n: torch.from_numpy(a) for n, a in arrays.items()}, strict=True, assign=True)
    return model.eval()


@contextmanager
def _torch_beside_a_reader() -> Iterator[None]:
    """One core fewer for torch's own threads while the reading threads and their backends run: with every core,
    its OpenMP threads wait on each other whenever one of them is descheduled (a page's forward took 3x as long
    on 2 cores)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads - 1))
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _forward(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def _version_number(version: int | str | None) -> int | None:
    if version is None or version == "head":
        return None
    try:
        return int(version)
    except (TypeError, ValueError):
        raise PgtrainError(f"version should be 'head' or a version number, got {version!r}") from None


@contextmanager
def _connection(conn_or_url: psycopg.Connection | str) -> Iterator[psycopg.Connection]:
    if isinstance(conn_or_url, str):
        with db.connect(conn_or_url, autocommit=True, application_name="pgtrain-load-model") as conn:
            yield conn
    else:
        yield conn_or_url


@contextmanager
def _scoring_transaction(conn: psycopg.Connection) -> Iterator[bool]:
    """One transaction; its own REPEATABLE READ snapshot (every page sees the same rows; yields True) when the
    connection is idle in autocommit, else a savepoint in the caller's transaction (yields False: the rows it
    may have changed are seen on this connection only)."""
    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        with snapshot_transaction(conn):
            prefer_index_order(conn)
            yield True
    else:
        with conn.transaction():
            yield False


# -- the source -------------------------------------------------------------------------------------------
def _scoring_source(conn: psycopg.Connection, name: str, version: int, planned: InputRecord, table: str,
                    key_column: str, feature_columns: Sequence[str] | None) -> Source:
    """The table to score, its columns in the version's input order, encoded as the version's were."""
    recorded = list(planned.feature_columns)
    columns = tuple(feature_columns or recorded)
    if not columns:
        raise PgtrainError(f"model {name!r} version {version} records no feature columns; pass feature_columns "
                           "(--feature-columns) in the model's input order")
    try:
        source = resolve_source(conn, table, key_column, None, None, feature_columns=columns,
                                missing_values=planned.missing_values)
    except MissingColumnError as error:
        if error.role != "feature_columns" or feature_columns:
            raise
        raise MissingColumnError(
            f"{error}. Model {name!r} version {version} was trained on the feature columns "
            f"{', '.join(map(repr, recorded))} (in that order): score a table that has them, or pass "
            "--feature-columns (feature_columns=) naming this table's columns in that order",
            error.role, error.columns) from None
    if planned.is_array_input != (source.feature_format != COLUMNS):
        raise SourceError(f"model {name!r} version {version} takes "
                          + (f"one array column of {planned.input_dim} features" if planned.is_array_input else
                             f"the {len(recorded)} columns {', '.join(map(repr, recorded))}")
                          + f"; {', '.join(map(repr, columns))} {'was' if len(columns) == 1 else 'were'} given")
    return source if planned.is_array_input else _encoded_source(source, planned, name, version)


def _encoded_source(source: Source, planned: InputRecord, name: str, version: int) -> Source:
    """The table's columns encoded as the version's were: each recorded column (by position) with its kind,
    levels and mean; SourceError when the table's column cannot be read as that kind."""
    if len(planned.columns) != len(source.feature_columns):
        raise SourceError(f"model {name!r} version {version} takes the {len(planned.columns)} columns "
                          f"{', '.join(repr(c.name) for c in planned.columns)}; {len(source.feature_columns)} were "
                          "given")
    columns = []
    for found, want in zip(source.feature_columns, planned.columns, strict=True):
        if want.kind != CATEGORY and found.kind != want.kind:
            raise SourceError(f"column {found.name!r} of {source.qualified_name} has type {found.type}, but model "
                              f"{name!r} version {version} was trained on a {want.kind} column of type {want.type} "
                              f"there ({want.name!r})")
        columns.append(replace(want, name=found.name, type=found.type))
    return replace(source, feature_columns=tuple(columns), classes=planned.classes, class_hashes=planned.class_hashes,
                   missing_values=planned.missing_values)


def _null_keys(conn: psycopg.Connection, source: Source) -> int:
    """Rows whose key is NULL: keyset pages never reach them, so they are counted (an index scan) up front."""
    return conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE {} IS NULL").format(
        source.relation, source.key)).fetchone()[0]


def _bad_rows_message(conn: psycopg.Connection, source: Source, dim: int) -> str:
    """How many rows of the source cannot be scored, by kind, with example keys (one more scan of the table)."""
    checks = feature_checks(source, dim)
    flags = [sql.Identifier(f"_pgtrain_{kind}") for kind in checks]
    total, *found = conn.execute(sql.SQL(
        """SELECT count(*), {per_kind}
           FROM (SELECT {key}::text AS _pgtrain_key, {checks} FROM {rel} OFFSET 0) AS _pgtrain_checked"""
    ).format(per_kind=sql.SQL(", ").join(
        sql.SQL("count(*) FILTER (WHERE {f}), pgtrain.example_keys(_pgtrain_key) FILTER (WHERE {f})").format(f=f)
        for f in flags),
        key=source.key, rel=source.relation,
        checks=sql.SQL(", ").join(sql.SQL("coalesce({}, false) AS {}").format(c, f)
                                  for c, f in zip(checks.values(), flags, strict=True)))).fetchone()
    meanings = BAD_ROW_KINDS | (COLUMN_KINDS if source.feature_format == COLUMNS else {})
    lines, bad = [], 0
    for kind, count, examples in zip(checks, found[::2], found[1::2], strict=True):
        if count:
            bad += count
            shown = [k for k in examples or [] if k is not None][:EXAMPLE_KEYS]
            lines.append(f"  {kind}: {count} rows ({meanings[kind].format(dim=dim)})"
                         + (", e.g. keys " + ", ".join(shown) if shown else ""))
    return "\n".join([f"{bad} rows of {source.qualified_name} (of {total}) cannot be scored; fix or delete them, "
                       "or pass --skip-bad-rows (skip_bad_rows=True) to score the others without them:", *lines])
