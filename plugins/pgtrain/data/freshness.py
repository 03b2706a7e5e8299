"""Has a model's source changed since its head version was trained? Two questions, two costs.

**New rows (the new-data trigger; cheap, polled).** A version records the watermark it was trained on
(``model_versions.spec -> watermark``: the planning snapshot and ``max_key``, the largest key planned). Rows
whose key is above it are new: ``SELECT count(*) FROM (SELECT 1 FROM t WHERE key > $max_key LIMIT $n)`` walks
the key's unique index from the watermark and stops at the threshold, and ``max(key)`` is one index probe, so
a poll costs O(new rows up to the threshold), not O(table). It only reads: the pgtrain role has SELECT on
user tables and cannot install a trigger or a NOTIFY there. The limit: keys must grow with insertion (an
identity, a sequence, a timestamp): a row committed late with a key below the watermark (a long transaction
that took its sequence value early), an UPDATE, or a DELETE is not counted. Such rows are still trained on by
the next run, whatever starts it. When an event fires, ``claim_event`` records the key it fired at in
``pgtrain.new_rows_events`` (compare-and-set, one short autocommit statement): rows up to that key never count
again, whichever triggerer asks and however often it restarts. A model with no version yet gets a baseline there
on the first look (``record_baseline``): rows already in the table when watching began are not new.

**Unchanged (a cron run may skip; exact, one scan).** ``source_unchanged`` says the source holds exactly the
rows the head version's run planned: as many rows as it planned (usable + excluded) and none that its planning
snapshot could not see, judged by that snapshot's own visibility rule on ``xmin`` (``source.planned_rows``,
sql/008). An INSERT or UPDATE leaves a row with a newer xmin; a DELETE lowers the count (and a DELETE plus an
INSERT brings a newer xmin). It reads the whole table once, so it runs once per scheduled run, not per poll.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgtrain.config.params import QUALITY_GATE, TrainingConfig
from pgtrain.core.errors import PgtrainError, SourceError
from pgtrain.data.source.resolve import keyed_relation, source_from_config
from pgtrain.data.source.snapshot import planned_rows, read_xid_clock, snapshot_transaction
from pgtrain.runs import record, versions


@dataclass(frozen=True)
class Watched:
    """A source table's key, resolved in the catalog: the quoted relation, key and the key's type."""

    oid: int
    schema: str
    table: str
    key_column: str
    key_type: str  # format_type() from the catalog, never user text

    @property
    def pinned(self) -> str:
        """The schema-qualified, quoted name (as policy.admit records it in a run's config)."""
        return sql.Identifier(self.schema, self.table).as_string(None)

    def cast(self, value: sql.Composable) -> sql.Composable:
        return sql.SQL("CAST({} AS {})").format(value, sql.SQL(self.key_type))


@dataclass(frozen=True)
class NewRows:
    """What a poll found: rows with a key above ``since_key`` (None: every row is new), counted up to the limit."""

    model_name: str
    source_table: str  # pinned
    key_column: str
    head_version: int | None
    since_key: str | None
    new_rows: int
    max_key: str | None
    fired_key: str | None  # the recorded event's key as read (the compare-and-set's expected value)


def resolve_key(conn: psycopg.Connection, table: str, key_column: str) -> Watched:
    """The table and its key column, as the catalog has them now; SourceError naming what is missing. Resolved
    on every poll: after a table swap (RENAME, DROP and CREATE) the name means another relation."""
    oid, schema, name, key_type = keyed_relation(conn, table, key_column)
    return Watched(oid, schema, name, key_column, key_type)


def count_new_rows(conn: psycopg.Connection, model_name: str, watched: Watched, limit: int) -> NewRows:
    """Rows of ``watched`` with a key above both the head version's watermark and the last event's key, counted
    up to ``limit``. Three short statements on an autocommit connection: nothing stays open between polls."""
    # A watermark of another table or key says nothing about this one (tables compared as the catalog resolves
    # them; the names were recorded by pgtrain, pinned and quoted).
    head_version, head_key, head_same = versions.head_watermark(conn, model_name, watched.oid, watched.key_column)
    fired = conn.execute(
        """SELECT fired_key, to_regclass(source_table) = %(oid)s::oid AND key_column = %(key)s
           FROM pgtrain.new_rows_events WHERE model_name = %(model)s""",
        {"model": model_name, "oid": watched.oid, "key": watched.key_column},
    ).fetchone()
    fired_key, fired_same = fired if fired is not None else (None, None)
    bounds = [k for k, same in ((head_key, head_same), (fired_key, fired_same)) if k is not None and same]
    key = sql.Identifier(watched.key_column)
    relation = sql.Identifier(watched.schema, watched.table)
    if bounds:
        since = sql.SQL("GREATEST({})").format(sql.SQL(", ").join(watched.cast(sql.Literal(b)) for b in bounds))
        newer = sql.SQL("{} > {}").format(key, since)
    else:
        since, newer = sql.NULL, sql.SQL("true")
    count, max_key, since_key = conn.execute(
        sql.SQL("""SELECT (SELECT count(*) FROM (SELECT 1 FROM {rel} WHERE {newer} LIMIT {limit}) s),
                          (SELECT max({key})::text FROM {rel}), ({since})::text""").format(
            rel=relation, newer=newer, limit=sql.Literal(int(limit)), key=key, since=since),
    ).fetchone()
    return NewRows(model_name, watched.pinned, watched.key_column, head_version, since_key, count, max_key, fired_key)


def record_baseline(conn: psycopg.Connection, found: NewRows) -> bool:
    """The first look at a model with no version and no event: record the largest key as the baseline (no event),
    so the rows already there when watching began (when its DAG was unpaused) start no run by themselves; rows
    added after count. True if this call recorded it (False: a version, an event or a baseline exists, or the
    table is empty, when every row to come is new)."""
    if found.head_version is not None or found.fired_key is not None or found.max_key is None:
        return False
    row = conn.execute(
        """INSERT INTO pgtrain.new_rows_events
               (model_name, source_table, key_column, fired_key, head_version, new_rows, events)
           VALUES (%s, %s, %s, %s, NULL, 0, 0)
           ON CONFLICT (model_name) DO NOTHING RETURNING model_name""",
        (found.model_name, found.source_table, found.key_column, found.max_key),
    ).fetchone()
    return row is not None


def claim_event(conn: psycopg.Connection, found: NewRows) -> bool:
    """Record that an event fires for the rows up to ``found.max_key``; False when another poll (another
    triggerer, or this one before a restart) recorded one since ``found`` was read: then do not fire."""
    if found.max_key is None or found.new_rows < 1:
        raise PgtrainError("claim_event needs new rows: count_new_rows found none")
    row = conn.execute(
        """INSERT INTO pgtrain.new_rows_events AS e
               (model_name, source_table, key_column, fired_key, head_version, new_rows)
           VALUES (%(model)s, %(table)s, %(key)s, %(max_key)s, %(head)s, %(rows)s)
           ON CONFLICT (model_name) DO UPDATE SET
               source_table = EXCLUDED.source_table, key_column = EXCLUDED.key_column,
               fired_key = EXCLUDED.fired_key, head_version = EXCLUDED.head_version, new_rows = EXCLUDED.new_rows,
               events = e.events + 1, fired_at = now()
           WHERE e.fired_key IS NOT DISTINCT FROM %(expected)s
           RETURNING events""",
        {"model": found.model_name, "table": found.source_table, "key": found.key_column, "max_key": found.max_key,
         "head": found.head_version, "rows": found.new_rows, "expected": found.fired_key},
    ).fetchone()
    return row is not None


def source_unchanged(conn: psycopg.Connection, model_name: str, source_table: str, key_column: str) -> str | None:
    """Why the source holds exactly the rows the model's head version was trained on, or None when it may not
    (no head, another table, the head's plan is gone, a row added, updated or deleted since)."""
    head = _head(conn, model_name)
    return None if head is None else _unchanged_since(conn, *head, source_table, key_column)


def _head(conn: psycopg.Connection, model_name: str) -> tuple[int, record.Run] | None:
    """The model's head version and the run that trained it, or None (no head, or a run this pgtrain cannot read)."""
    row = versions.head_run(conn, model_name)
    if row is None or row[1] is None:
        return None
    try:
        return row[0], record.get_run(conn, row[1])
    except PgtrainError:
        return None


def _unchanged_since(conn: psycopg.Connection, version: int, run: record.Run, source_table: str,
                     key_column: str) -> str | None:
    from pgtrain.data import manifest

    same_source = conn.execute("SELECT to_regclass(%s) = to_regclass(%s)",
                               (run.config.source_table, source_table)).fetchone()[0]
    if not same_source or run.config.key_column != key_column:
        return None
    counted = conn.execute(
        """SELECT (SELECT sum(row_count) FROM pgtrain.shard_manifest WHERE run_id = pgtrain.plan_of(%(run)s)),
                  (SELECT excluded_rows FROM pgtrain.shard_plans WHERE run_id = pgtrain.plan_of(%(run)s))""",
        {"run": run.run_id},
    ).fetchone()
    if counted[0] is None or counted[1] is None:
        return None  # the head's plan was deleted: nothing to compare with
    planned_count = int(counted[0]) + int(counted[1])
    try:
        source_from_config(conn, run.config)  # the planned source says what was; the catalog, what is
        source = manifest.source_for(conn, run)
    except PgtrainError:
        return None  # the head's columns changed since: changed
    with snapshot_transaction(conn):
        clock = read_xid_clock(conn)
        try:
            visible = planned_rows(source, clock)
        except SourceError:
            return None  # too many transactions since to tell by xmin: treat as changed
        total, newer = conn.execute(sql.SQL("SELECT count(*), count(*) FILTER (WHERE NOT ({})) FROM {}").format(
            visible, source.relation)).fetchone()
    if total != planned_count or newer:
        return None
    return (f"no row of {source_table} was added, updated or deleted since version {version} of "
            f"{run.model_name} was trained on its {planned_count} rows (run {run.run_id})")


# Runs the scheduler starts (cron, new data): they skip training when the source has not changed.
SCHEDULED_RUN_TYPES = ("scheduled", "asset_triggered")


def skip_reason(conn: psycopg.Connection, config: TrainingConfig, run_type: str) -> str | None:
    """Why a run of ``run_type`` should not train (the source is as the head version saw it), or None.

    Only runs the scheduler starts skip, and never with ``force``: whoever triggers a run by hand gets one.
    ``config`` is the admitted one (policy.admit: the source pinned)."""
    if run_type not in SCHEDULED_RUN_TYPES or config.force:
        return None
    head = _head(conn, config.model_name)
    if head is None or _definition(head[1].config) != _definition(config):
        return None  # no version yet, or the author changed the model's params: a new version is due
    unchanged = _unchanged_since(conn, *head, config.source_table, config.key_column)
    return None if unchanged is None else f"{unchanged}; set the force param to train anyway"


def _definition(config: TrainingConfig) -> dict:
    """What a run's config says about the model it trains: all of it but the run's own ``force`` and the author's
    quality gate (which judges a version, and changing it is no reason to train one)."""
    return {k: v for k, v in config.to_dict().items() if k != "force" and k not in QUALITY_GATE}

