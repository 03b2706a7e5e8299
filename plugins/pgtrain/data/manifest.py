"""compute_shards: check the source rows, then cut them into balanced keyset ranges, one per rank.

Everything happens in one REPEATABLE READ snapshot:

1. ``check_rows`` (``pgtrain.data.row_check``): one lean sequential scan that counts the rows, infers the
   label range and counts the bad rows and the rows whose xmin needs noting; only when there are some, a
   second scan names every bad row's kind with example keys and notes those xmins. NaN/infinite/too large
   feature values are left to the loader with bad_rows='fail' (``source.LOAD_KINDS``);
2. ``cut_shards``: the keys at the shard and batch boundaries (``pgtrain.data.key_order``: array features of a
   large table, one walk of the key index on a second connection while step 1 scans, which counts the rows as it
   goes (``grid_walk``), used when step 1 finds no bad row; else a walk or a sort after step 1), then each
   shard's validation and test rows: counted from the keys step 1 collected (integer keys), else in one more
   pass.

The snapshot, the bad-row report and each rank's batch boundaries are stored with the manifest
(``pgtrain.shard_plans`` / ``shard_batches``), so every rank reads exactly the planned rows, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from pgtrain.config.params import TrainingConfig
from pgtrain.core.errors import PgtrainError, SourceError
from pgtrain.data import encoding, input_record, statistics
from pgtrain.data.input_record import InputRecord
from pgtrain.data.key_order import heap_of, key_pass_beside, keys_at, shard_grid
from pgtrain.data.row_check import BadRows, RowCheck, bad_rows_message, bad_rows_report, check_rows, empty_source
from pgtrain.data.source.planned import PlannedRows
from pgtrain.data.source.resolve import COLUMNS, Source, source_from_config
from pgtrain.data.source.rows import (
    TEST,
    VALIDATION,
    bad_row,
    feature_length,
    held_out_key,
    is_held_out,
    is_validation,
    key_range,
    target_length,
)
from pgtrain.data.source.snapshot import (
    XidClock,
    read_xid_clock,
    seen_xmins,
    snapshot_transaction,
)
from pgtrain.data.upgrade import current_record
from pgtrain.data.wire import record_dtype
from pgtrain.runs import record, versions
from pgtrain.runs.record import Shard

# Rows the loader receives per COPY row: about this many bytes, within these bounds.
BATCH_BYTES = 256 * 1024
BATCH_ROWS = (16, 8192)
# Rows (in key order) the feature length is inferred from when it is not given.
LENGTH_SAMPLE = 1000


@dataclass(frozen=True)
class Plan:
    shards: list[Shard]
    input_dim: int
    num_classes: int | None  # classification only
    total_rows: int  # rows in the manifest: what the ranks read
    excluded_rows: int = 0  # bad rows left out (bad_rows='exclude')
    bad_rows: dict[str, BadRows] = field(default_factory=dict)  # kind -> count, examples; only kinds found
    snapshot: str = ""
    output_dim: int | None = None  # classes, or the regression target's width
    bad_columns: tuple[str, ...] = ()  # scalar feature columns holding NULL, NaN, infinite or too large values
    warnings: tuple[str, ...] = ()  # what planning capped or noticed (rare levels, classes only in validation)
    feature_columns: tuple[str, ...] = ()  # the scalar feature columns, in input order
    classes: tuple[str, ...] | None = None  # a class list's classes (text forms), in class order

    def summary(self) -> dict[str, object]:
        """JSON-ready figures for the DAG's report."""
        return {"rows_per_rank": [s.row_count for s in self.shards], "input_dim": self.input_dim,
                "num_classes": self.num_classes, "output_dim": self.output_dim, "total_rows": self.total_rows,
                "excluded_rows": self.excluded_rows, "bad_rows": bad_rows_report(self.bad_rows),
                "feature_columns": list(self.feature_columns), "warnings": list(self.warnings),
                **({"classes": list(self.classes)} if self.classes is not None else {})}


def source_for(conn: psycopg.Connection, run: record.Run) -> Source:
    """The run's source table; once compute_shards has run, as it planned it (the loader needs it): its rows, and
    its input record (``input_record``), which names the resolved table and columns: the catalog is not looked up
    again. Before planning, as the catalog resolves the run's config."""
    plan = read_plan(conn, run.run_id)
    if plan is None:
        return source_from_config(conn, run.config)
    if not plan.encoding or plan.encoding.get("format") != input_record.FORMAT:
        raise PgtrainError(f"run {run.run_id} was planned before input records were: re-run the DAG run from "
                           "compute_shards")
    return InputRecord.from_json(plan.encoding).source(plan)


def plan_shards(conn: psycopg.Connection, run: record.Run, *, input_dim: int | None = None) -> Plan:
    """Check the source rows, compute and write the manifest of ``run``; returns it.

    ``input_dim`` (or a config ``input_dim``) fixes the feature length of array features; by default it is the
    most common length among the first rows in key order (scalar feature columns: their number). An array
    regression target's width is inferred the same way. Raises SourceError, before writing anything, when the
    source is empty or has bad rows (unless ``bad_rows='exclude'``), fewer rows than ranks, or no training rows.
    """
    config = run.config
    given_dim = input_dim or config.input_dim
    with snapshot_transaction(conn):
        source = source_from_config(conn, config)
        clock = read_xid_clock(conn)
        dim = _feature_width(conn, source, given_dim)
        outputs = _target_width(conn, source)
        split = folded_split(conn, source, config.validation_fraction, config.seed, config.test_fraction)
        parent = parent_encoding(conn, run, source)
        beside = statistics.vocabularies_beside(conn, source, config) if parent is None else None
        keys = key_pass_beside(conn, source, config.world_size, batch_size(source, dim, outputs))
        try:
            check = check_rows(conn, source, dim, config.num_classes, clock, outputs,
                               values=config.bad_rows == "exclude", split=split,
                               extra=statistics.lean_aggregates(source, config.num_classes))
            if check.bad and beside is not None:
                beside.cancel()  # it counted the bad rows too: encode counts again without them
                beside = None
            if check.bad and keys is not None:
                keys.cancel()  # it numbered the bad rows too: cut_shards sorts again without them
                keys = None
            rows = _usable_rows(source, check, dim, config, length_given=bool(given_dim), outputs=outputs)
            source = statistics.with_values(source, check.total, check.extra)
            nullable = statistics.nullable_columns(source, check.total, check.extra)
            if source.feature_format == COLUMNS:
                dim = encoding.layout(source.feature_columns).width
            # The rows the loader will leave out: the same whether num_classes is given or inferred (max + 1 of
            # the good rows), and whatever the vocabularies, which are counted while the shards are cut.
            exclude = bad_row(source, dim, config.num_classes, outputs) if check.bad else None
            # Sized by the row's width before the classes are known: a label's hash is 4 bytes more than a number.
            batch_rows = batch_size(source, dim, outputs)
            done = keys.result() if keys is not None else None
            if done is not None and (done.rows, done.batch_rows) != (rows, batch_rows):
                done = None
            shards, batches = cut_shards(conn, source, rows, config.world_size, config.validation_fraction,
                                         config.seed, batch_rows, exclude, keys=done and done.keys,
                                         held_keys=None if check.bad else check.held_keys,
                                         test_fraction=config.test_fraction)
            counted = beside.result() if beside is not None else None
        finally:
            for second in (beside, keys):
                if second is not None:
                    second.cancel()  # ended already, unless planning failed
        _check_training_rows(source, shards, config)
        _check_validation_rows(source, shards, config)
        encoded = statistics.encode(conn, source, config, check.max_label, check.extra, exclude, parent, counted)
        source = encoded.source
        num_classes = encoded.num_classes if outputs is None else None
        output_dim = outputs or num_classes
        planned = InputRecord.planned(source, config, dim, output_dim, parent["version"] if parent else None)
        record.write_manifest(conn, run.run_id, shards, dim, num_classes, output_dim, planned.to_json())
        seen, horizon = seen_xmins(check.alias_xmin_ages, clock)
        _write_plan(conn, run, clock, seen, horizon, check, batch_rows, batches, nullable)
    return Plan(shards, dim, num_classes, rows, check.bad, check.kinds, clock.snapshot, output_dim,
                check.bad_columns, encoded.warnings, source.column_names, source.classes)


def parent_encoding(conn: psycopg.Connection, run: record.Run, source: Source) -> dict[str, Any] | None:
    """The encoding of the version a warm start (``init_from``) begins from, with its number as "version": the
    version it names, or for "head" the run's base version (the head when plan_run recorded the run); one from
    before input records as it was trained (``input_record.of_version``, its columns typed as ``source`` has them);
    None for scratch or no such version."""
    config = run.config
    version = config.init_version if config.init_from != "head" else run.base_version
    if version is None:
        return None
    stored = versions.spec(conn, run.model_name, version)
    if stored is None:
        return None
    types = {c.name: c.type for c in source.feature_columns}
    return {**input_record.of_version(current_record(stored), types).to_json(), "version": version}


# Key types whose keys the check scan can hand over as int8s (their order is the integers' order).
_INTEGER_KEYS = ("smallint", "integer", "bigint")
# The most held-out-key bytes the check scan may collect into one bytea (far below bytea's 1 GB limit).
FOLDED_KEYS_MAX_BYTES = 256 << 20
HELD_KEY = np.dtype([("key", ">i8"), ("part", "u1")])  # one held-out key as check_rows collects it
_MIN_HEAP_TUPLE_BYTES = 32  # tuple header and the smallest key, aligned: heap bytes / this >= the row count


def folded_split(conn: psycopg.Connection, source: Source, validation_fraction: float, seed: int,
                 test_fraction: float = 0.0) -> sql.Composable | None:
    """The split for ``check_rows(split=...)`` (``held_out_key``: each held-out row's key and part) when the check
    scan can collect the held-out keys (``_keys_fold_into_the_check``), else None (``cut_shards`` counts them in a
    pass of its own)."""
    if not _keys_fold_into_the_check(conn, source, validation_fraction + test_fraction):
        return None
    return held_out_key(source, validation_fraction, test_fraction, seed)


def _keys_fold_into_the_check(conn: psycopg.Connection, source: Source, held_fraction: float) -> bool:
    """Whether the check scan collects the held-out rows' keys: integer keys, PostgreSQL 16 and later (whose
    string_agg(bytea) runs in parallel: before 16 it would make the check scan serial), and a plain table whose
    heap bounds those keys to FOLDED_KEYS_MAX_BYTES (a larger table counts them in a pass of its own)."""
    if held_fraction <= 0 or source.key_type not in _INTEGER_KEYS or conn.info.server_version < 160000:
        return False
    kind, heap_bytes = heap_of(conn, source)
    most_rows = heap_bytes // _MIN_HEAP_TUPLE_BYTES
    return kind in ("r", "m") and held_fraction * most_rows * HELD_KEY.itemsize <= FOLDED_KEYS_MAX_BYTES


def batch_size(source: Source, dim: int, output_dim: int | None = None) -> int:
    row_bytes = record_dtype(source, dim, output_dim).itemsize + 4  # + string_agg's share per row
    return max(BATCH_ROWS[0], min(BATCH_ROWS[1], BATCH_BYTES // row_bytes))


def sample_length(conn: psycopg.Connection, source: Source, length: sql.Composable | None = None) -> int | None:
    """The most common feature length (or ``length``, SQL) among the first rows in key order (None if none is
    usable)."""
    row = conn.execute(
        sql.SQL("""SELECT length FROM (SELECT {length} AS length FROM {rel} ORDER BY {key} LIMIT {n}) sample
                   WHERE length > 0 GROUP BY length ORDER BY count(*) DESC, length LIMIT 1""").format(
            length=length if length is not None else feature_length(source), rel=source.relation, key=source.key,
            n=sql.Literal(LENGTH_SAMPLE))
    ).fetchone()
    return row[0] if row else None


def cut_shards(conn: psycopg.Connection, source: Source, rows: int, world_size: int, validation_fraction: float,
               seed: int, batch_rows: int, exclude: sql.Composable | None, *, held_keys: bytes | None = None,
               keys: dict[int, str] | None = None, test_fraction: float = 0.0
               ) -> tuple[list[Shard], list[tuple[list[str], list[str]]]]:
    """The shards, and each shard's batches as (first keys, last keys) (``shard_grid``), in two passes that read
    only the key:

    1. ``keys_at``: the keys at the shard edges and at the first and last row of each batch, by position in key
       order (one sort of the keys, as ``percentile_disc`` does; only those keys come back), unless given as
       ``keys`` (``key_pass_beside``);
    2. ``validation_query``: each shard's validation and test rows (the split hashes every key once, the held-out
       ones twice).

    ``exclude`` (SQL) drops bad rows from the numbering. ``held_keys`` (integer keys, from ``check_rows`` with a
    split, none of them excluded): the held-out rows' keys and parts (HELD_KEY), counted per shard here instead of
    by the second pass.
    """
    positions, grid, wanted = shard_grid(rows, world_size, batch_rows)
    at = keys if keys is not None else keys_at(conn, source, rows, wanted, exclude)
    edges = [(at[first], at[last]) for first, last in positions]
    if held_keys is not None:
        held = np.frombuffer(held_keys, HELD_KEY)
        # The shards cover every key the check saw, contiguously: a key's shard is the first whose last key is not
        # below it (no sort of the held-out keys needed).
        shard_of = np.searchsorted(np.array([int(hi) for _, hi in edges], np.int64), held["key"].astype(np.int64))
        if shard_of.size and shard_of.max() >= len(edges):  # both passes read one snapshot: never, unless a bug
            raise PgtrainError(f"planning saw a held-out key above the last shard's key {edges[-1][1]} (the key pass "
                               "and the check disagree); plan the run again, and report this if it repeats")
        validation, test = (np.bincount(shard_of[held["part"] == part], minlength=len(edges)).tolist()
                            for part in (VALIDATION, TEST))
    else:
        counts = conn.execute(validation_query(source, validation_fraction, seed, edges, exclude,
                                               test_fraction)).fetchone()
        validation, test = counts[:len(edges)], counts[len(edges):]
    shards, batches = [], []
    for rank, (first, last) in enumerate(positions):
        size, val_count, test_count = last - first + 1, validation[rank], test[rank]
        shards.append(Shard(rank, world_size, at[first], at[last], size, size - val_count - test_count, val_count,
                            test_count))
        starts, ends = grid[rank]
        batches.append(([at[p] for p in starts], [at[p] for p in ends]))
    return shards, batches


def validation_query(source: Source, validation_fraction: float, seed: int, edges: list[tuple[str, str]],
                     exclude: sql.Composable | None = None, test_fraction: float = 0.0) -> sql.Composed:
    """One row: each shard's validation rows, then each shard's test rows, the shards given by their (first key,
    last key). One pass that hashes every key once (PostgreSQL may run it in parallel, or on the key index alone)
    and the held-out ones once more; only held-out rows are placed in their shard."""
    validation = is_validation(source, validation_fraction, seed)
    counts = sql.SQL(", ").join(
        sql.SQL("count(*) FILTER (WHERE {} AND {})").format(key_range(source, lo, hi), part)
        for part in (validation, sql.SQL("NOT {}").format(validation)) for lo, hi in edges)
    return sql.SQL("SELECT {counts} FROM {rel} WHERE {is_val}{exclude}").format(
        counts=counts, rel=source.relation, is_val=is_held_out(source, validation_fraction, test_fraction, seed),
        exclude=sql.SQL(" AND NOT {}").format(exclude) if exclude is not None else sql.SQL(""))


def read_plan(conn: psycopg.Connection, run_id: str) -> PlannedRows | None:
    """The plan the run reads (``pgtrain.plan_of``: a search's trial reads its search run's), named by the run that
    planned it; None before planning."""
    row = conn.execute(
        """SELECT p.run_id, p.snapshot::text, pg_snapshot_xmin(p.snapshot)::text::bigint,
                  pg_snapshot_xmax(p.snapshot)::text::bigint,
                  array(SELECT x::text::bigint FROM pg_snapshot_xip(p.snapshot) AS x ORDER BY 1),
                  p.seen_xmins::text[], p.xid_horizon, p.excluded_rows > 0, p.batch_rows, p.nullable_columns
           FROM pgtrain.shard_plans p WHERE p.run_id = pgtrain.plan_of(%s)""",
        (run_id,),
    ).fetchone()
    if row is None:
        return None
    planned, snapshot, xmin, xmax, in_progress, seen, horizon, exclude, batch_rows, nullable = row
    run = record.get_run(conn, planned)  # what the plan recorded with the run: its widths and encoding
    return PlannedRows(planned, snapshot, xmin, xmax, tuple(x % (1 << 32) for x in in_progress),
                       tuple(int(x) for x in seen), horizon, run.input_dim, run.num_classes, exclude, batch_rows,
                       run.output_dim, run.encoding, None if nullable is None else tuple(nullable))


def _write_plan(conn: psycopg.Connection, run: record.Run, clock: XidClock, seen: tuple[int, ...], horizon: int,
                check: RowCheck, batch_rows: int, batches: list[tuple[list[str], list[str]]],
                nullable: tuple[str, ...]) -> None:
    conn.execute(
        """INSERT INTO pgtrain.shard_plans (run_id, snapshot, seen_xmins, xid_horizon, excluded_rows, bad_rows,
                                            batch_rows, nullable_columns)
           VALUES (%(run)s, %(snapshot)s::pg_snapshot, %(seen)s::xid[], %(horizon)s, %(excluded)s, %(report)s,
                   %(batch)s, %(nullable)s::text[])
           ON CONFLICT (run_id) DO UPDATE SET
             snapshot = EXCLUDED.snapshot, seen_xmins = EXCLUDED.seen_xmins, xid_horizon = EXCLUDED.xid_horizon,
             excluded_rows = EXCLUDED.excluded_rows, bad_rows = EXCLUDED.bad_rows,
             batch_rows = EXCLUDED.batch_rows, nullable_columns = EXCLUDED.nullable_columns, planned_at = now()""",
        {"run": run.run_id, "snapshot": clock.snapshot, "seen": "{" + ",".join(map(str, seen)) + "}",
         "horizon": horizon, "excluded": check.bad, "report": Jsonb(bad_rows_report(check.kinds)),
         "batch": batch_rows, "nullable": list(nullable)},
    )
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO pgtrain.shard_batches (run_id, rank, batch_lo, batch_hi) "
            "VALUES (%s, %s, %s::text[], %s::text[])",
            [(run.run_id, rank, text_array(lo), text_array(hi)) for rank, (lo, hi) in enumerate(batches)],
        )


def text_array(values: list[str]) -> str:
    """A text[] literal of ``values`` (none of them None), every element quoted: built with str methods, where
    psycopg's list dumper tests each element with a regular expression (a few thousand keys a plan)."""
    joined = '","'.join(values)
    if "\\" in joined or '"' in joined:  # rare (text keys): escape each value
        joined = '","'.join([v.replace("\\", "\\\\").replace('"', '\\"') for v in values])
    return '{"' + joined + '"}' if values else "{}"


def _feature_width(conn: psycopg.Connection, source: Source, given: int | None) -> int:
    if source.feature_format != COLUMNS:
        return given or _inferred_length(conn, source)
    if given:
        raise SourceError(f"input_dim is {given}, but with feature_columns the input's width follows from the "
                          "columns and their encoding; leave input_dim empty")
    return len(source.feature_columns)


def _target_width(conn: psycopg.Connection, source: Source) -> int | None:
    """Regression: the target's width (1 for a scalar column, else the most common array length among the first
    rows); None for classification."""
    if source.task == "classification":
        return None
    if source.target_format == "scalar":
        return 1
    width = sample_length(conn, source, target_length(source))
    if width is not None:
        return width
    if conn.execute(sql.SQL("SELECT EXISTS (SELECT FROM {})").format(source.relation)).fetchone()[0]:
        raise SourceError(
            f"the first {LENGTH_SAMPLE} rows of {source.qualified_name} (in key order) have no usable target array "
            f"in {source.label_column!r} (NULL, empty or not a flat array); fix them")
    raise empty_source(source)


def _check_training_rows(source: Source, shards: list[Shard], config: TrainingConfig) -> None:
    """A rank may hold only held-out rows (it then trains on none), but the run as a whole needs some."""
    rows = sum(s.row_count for s in shards)
    if rows and not sum(s.train_count for s in shards):
        raise SourceError(
            f"validation_fraction {config.validation_fraction} and test_fraction {config.test_fraction} hold out "
            f"all {rows} usable rows of {source.qualified_name} (rows are chosen by a hash of the key and the seed): "
            "nothing is left to train on; lower validation_fraction or test_fraction, change the seed, or load more "
            "rows")


def _check_validation_rows(source: Source, shards: list[Shard], config: TrainingConfig) -> None:
    """A run without validation rows has no metric for the quality gate: planned only when the author allows it."""
    if config.allow_unvalidated or sum(s.val_count for s in shards):
        return
    rows = sum(s.row_count for s in shards)
    raise SourceError(
        f"validation_fraction {config.validation_fraction} holds out none of the {rows} usable rows of "
        f"{source.qualified_name} (rows are chosen by a hash of the key and the seed): the run would have no "
        "validation metric for the quality gate, and its version could not become the head. Load more rows or raise "
        "validation_fraction; or, if the DAG's author accepts unvalidated versions, set quality_gate: "
        "{allow_unvalidated: true} in the settings file or the model's entry")


def _inferred_length(conn: psycopg.Connection, source: Source) -> int:
    dim = sample_length(conn, source)
    if dim is not None:
        return dim
    if conn.execute(sql.SQL("SELECT EXISTS (SELECT FROM {})").format(source.relation)).fetchone()[0]:
        raise SourceError(
            f"the first {LENGTH_SAMPLE} rows of {source.qualified_name} (in key order) have no usable feature "
            "vector (NULL, empty, or not a flat vector of float32 values); fix them, or set input_dim to the "
            "feature length"
        )
    raise empty_source(source)


def _usable_rows(source: Source, check: RowCheck, dim: int, config: TrainingConfig, length_given: bool,
                 outputs: int | None = None) -> int:
    """The rows the manifest will hold; raises SourceError when they cannot be trained on as configured."""
    if check.total == 0:
        raise empty_source(source)
    if check.kinds and config.bad_rows != "exclude":
        raise SourceError(bad_rows_message(source, check, dim, config.num_classes, outputs=outputs))
    wrong_length = check.kinds.get("wrong_length")
    if wrong_length and not length_given and 2 * wrong_length.count > check.total:
        raise SourceError(
            f"{wrong_length.count} of {check.total} rows of {source.qualified_name} do not have {dim} features "
            "(the length most common among the first rows); set input_dim"
        )
    rows = check.total - check.bad
    if rows == 0:
        raise SourceError(f"all {check.total} rows of {source.qualified_name} are bad, nothing is left to train "
                          "on:\n" + bad_rows_message(source, check, dim, config.num_classes, details=True,
                                                       outputs=outputs))
    if config.world_size > rows:
        left = f" left after excluding {check.bad} bad rows" if check.bad else ""
        raise SourceError(
            f"world_size {config.world_size} is larger than the {rows} rows of {source.qualified_name}{left}: "
            f"every rank needs at least one row; use world_size <= {rows} or load more rows"
        )
    return rows
