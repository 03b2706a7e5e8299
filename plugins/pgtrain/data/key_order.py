"""The key pass of ``compute_shards`` (``pgtrain.data.manifest``): where each rank's rows and each of its batches
begin and end in key order (``shard_grid``), and the keys at those positions: ``keys_at`` on planning's
connection (a walk of the key's index, or one sort of the keys as ``percentile_disc`` does), or ``grid_walk`` on a
second one while the row check scans (``key_pass_beside``: one walk that counts the rows too).
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgtrain.core.errors import SourceError
from pgtrain.data.source.resolve import COLUMNS, Source
from pgtrain.data.source.snapshot import Beside


def balanced_positions(total: int, world_size: int) -> list[tuple[int, int]]:
    """1-based inclusive (first, last) row positions of each rank; sizes differ by at most one."""
    base, extra = divmod(total, world_size)
    positions, first = [], 1
    for rank in range(world_size):
        size = base + (1 if rank < extra else 0)
        positions.append((first, first + size - 1))
        first += size
    return positions


def shard_grid(rows: int, world_size: int, batch_rows: int
               ) -> tuple[list[tuple[int, int]], list[tuple[list[int], list[int]]], list[int]]:
    """Each rank's (first, last) row positions, each rank's batches as (first positions, last positions), and every
    position whose key the plan needs, sorted. Batches follow a global grid of ``batch_rows`` rows, split where a
    shard begins."""
    positions = balanced_positions(rows, world_size)
    grid = []
    for first, last in positions:
        starts = [first] + list(range(first - (first - 1) % batch_rows + batch_rows, last + 1, batch_rows))
        grid.append((starts, [start - 1 for start in starts[1:]] + [last]))
    return positions, grid, sorted({p for starts, ends in grid for p in starts + ends})


def keys_at(conn: psycopg.Connection, source: Source, rows: int, wanted: list[int],
            exclude: sql.Composable | None = None) -> dict[int, str]:
    """position -> key (text) of the ``wanted`` positions (sorted) in key order of the ``rows`` rows (``exclude``,
    SQL, drops bad rows from the numbering): ``index_walk`` where nothing is excluded and the key's text form is its
    output, else ``boundary_query``, one sort of the keys."""
    fit_key_sort(conn, rows)  # the walk sorts too where the key has no index (a view)
    if exclude is None and not source.key_type.startswith("character"):  # bpchar::text drops the padding
        return index_walk(conn, source, wanted)
    # The positions go as one float8[] literal (repr round-trips every float): psycopg's list dumper costs about
    # a microsecond an element, which with thousands of batch edges is a measurable part of planning.
    fractions = "{" + ",".join([repr((p - 0.5) / rows) for p in wanted]) + "}"
    (keys,) = conn.execute(boundary_query(source, exclude), (fractions,)).fetchone()
    if keys is None or len(keys) != len(wanted) or None in keys:
        raise SourceError(f"{source.qualified_name} changed while it was being planned; run compute_shards again")
    return dict(zip(wanted, keys, strict=True))


_WALK_CURSOR = "_pgtrain_key_walk"


def index_walk(conn: psycopg.Connection, source: Source, wanted: list[int]) -> dict[int, str]:
    """position -> key (text) of the ``wanted`` positions (sorted, 1-based) in key order: a cursor over the keys in
    order (a table's unique key index, read alone) is moved past the rows between them, and only the keys at those
    positions are fetched, all the moves and fetches sent as one query. Moving a cursor does not sort and sends
    nothing: it costs about half a scan of the table's rows where ``boundary_query``'s sort costs 1.4 of it
    (benchmarks/RESULTS.md). NULL keys are left out, as ``percentile_disc`` leaves them out."""
    steps, at, runs = [], 0, []
    for position in wanted:
        if runs and runs[-1][1] == position - 1:
            runs[-1][1] = position
        else:
            runs.append([position, position])
    for first, last in runs:
        if first - at > 1:
            steps.append(f"MOVE FORWARD {first - at - 1} IN {_WALK_CURSOR}")
        steps.append(f"FETCH FORWARD {last - first + 1} FROM {_WALK_CURSOR}")
        at = last
    keys: list[str] = []
    if not steps:
        return {}
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(sql.SQL("DECLARE {} NO SCROLL CURSOR FOR SELECT {key} FROM {rel} WHERE {key} IS NOT NULL "
                            "ORDER BY {key}").format(sql.Identifier(_WALK_CURSOR), key=source.key,
                                                     rel=source.relation))
        # Simple-query protocol, text results: each FETCH's keys are their output form, read as they came.
        cur.execute("; ".join(steps))
        while True:
            result = cur.pgresult
            if result is not None and result.command_status.startswith(b"FETCH"):
                keys.extend(result.get_value(i, 0).decode() for i in range(result.ntuples))
            if not cur.nextset():
                break
        cur.execute(sql.SQL("CLOSE {}").format(sql.Identifier(_WALK_CURSOR)))
    if len(keys) != len(wanted):
        raise SourceError(f"{source.qualified_name} changed while it was being planned; run compute_shards again")
    return dict(zip(wanted, keys, strict=True))


# Tables from this heap size on get the key pass beside the check: below it, the key sort takes less time than
# opening a second connection and importing the snapshot.
KEY_PASS_BESIDE_MIN_BYTES = 64 << 20


@dataclass(frozen=True)
class SortedKeys:
    """What ``key_pass_beside`` found: the rows it numbered, the batch size it cut the grid for, and the keys at the
    grid's positions (``keys_at``)."""

    rows: int
    batch_rows: int
    keys: dict[int, str]


def key_pass_beside(conn: psycopg.Connection, source: Source, world_size: int, batch_rows: int) -> Beside | None:
    """The key pass started on a second connection in the planning snapshot, so that the keys are walked (on
    another core) while the row check scans: every row counted and numbered as if the check finds none bad
    (``grid_walk``); its result a ``SortedKeys``, None with fewer rows than ranks. None for a heap below
    KEY_PASS_BESIDE_MIN_BYTES (views too) and for scalar feature columns (their batch size follows their encoding,
    known after the check)."""
    if source.feature_format == COLUMNS or heap_of(conn, source)[1] < KEY_PASS_BESIDE_MIN_BYTES:
        return None
    return Beside(conn, lambda other: grid_walk(other, source, world_size, batch_rows), "pgtrain-plan-keys",
                  "planning's key pass")


def grid_walk(conn: psycopg.Connection, source: Source, world_size: int, batch_rows: int) -> SortedKeys | None:
    """The keys at every position of ``shard_grid`` (None with fewer rows than ranks), in one walk of the key's index
    that counts the rows too, so that no count has to come first: ``pgtrain.key_grid`` (sql/020) moves a cursor over
    the keys in order to the end and returns the keys on the global batch grid (positions 1, b, b + 1, 2b, 2b + 1,
    ...), which does not depend on the row count, and the count. The few positions off that grid (where a shard
    begins or ends) are then read from the key index, each at most ``batch_rows`` keys past a grid key it follows.
    Keys in their text form (``CAST(key AS text)``, as ``boundary_query`` gives them); NULL keys left out."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(sql.SQL("DECLARE {} NO SCROLL CURSOR FOR SELECT {key} FROM {rel} WHERE {key} IS NOT NULL "
                            "ORDER BY {key}").format(sql.Identifier(_WALK_CURSOR), key=source.key,
                                                     rel=source.relation))
        keys, rows = cur.execute("SELECT keys, row_count FROM pgtrain.key_grid(%s, %s)",
                                 (_WALK_CURSOR, batch_rows)).fetchone()
        cur.execute(sql.SQL("CLOSE {}").format(sql.Identifier(_WALK_CURSOR)))
    if rows < world_size:
        return None
    on_grid = [1] + [p for step in range(batch_rows, rows + 1, batch_rows) for p in (step, step + 1) if p <= rows]
    if len(on_grid) != len(keys):
        raise SourceError(f"{source.qualified_name} changed while it was being planned; run compute_shards again")
    at = dict(zip(on_grid, keys, strict=True))
    wanted = shard_grid(rows, world_size, batch_rows)[2]
    off_grid = [p for p in wanted if p not in at]
    if off_grid:
        # Each from the grid key at or before it (the first row of its batch), at most batch_rows - 1 keys on. The
        # alias: ORDER BY a bare name would sort by the text of the output column of that name.
        after = [(p - 1) // batch_rows * batch_rows + 1 for p in off_grid]
        lookup = sql.SQL("(SELECT CAST({key} AS text) AS _pgtrain_key FROM {rel} WHERE {key} >= CAST(%s AS {type}) "
                         "ORDER BY {key} OFFSET %s LIMIT 1)").format(key=source.key, rel=source.relation,
                                                                     type=sql.SQL(source.key_type))
        lookups = sql.SQL(", ").join([lookup] * len(off_grid))
        params = [v for p, first in zip(off_grid, after, strict=True) for v in (at[first], p - first)]
        (found,) = conn.execute(sql.SQL("SELECT ARRAY[{}]::text[]").format(lookups), params).fetchone()
        if None in found:
            raise SourceError(f"{source.qualified_name} changed while it was being planned; run compute_shards again")
        at.update(zip(off_grid, found, strict=True))
    return SortedKeys(rows, batch_rows, {p: at[p] for p in wanted})


def heap_of(conn: psycopg.Connection, source: Source) -> tuple[str, int]:
    """The source relation's kind (pg_class.relkind) and heap size in bytes (0 for a view or a partitioned parent)."""
    return conn.execute(
        "SELECT c.relkind::text, pg_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s", (source.schema, source.table)).fetchone()


# The key pass sorts the keys once; in memory when they fit in this much (work_mem, for planning's transaction).
KEY_SORT_MEMORY = 256 << 20
_KEY_SORT_BYTES = 64  # per key: a sort tuple and a bigint or short key, with room


def fit_key_sort(conn: psycopg.Connection, rows: int) -> None:
    """Raise work_mem for the rest of this transaction so that sorting ``rows`` keys stays in memory (bounded by
    KEY_SORT_MEMORY; never lowered)."""
    wanted = min(rows * _KEY_SORT_BYTES, KEY_SORT_MEMORY) >> 10
    # One statement, and not pg_settings (a view that builds a row for every setting).
    conn.execute("SELECT set_config('work_mem', %s, true) WHERE pg_size_bytes(current_setting('work_mem')) < %s",
                 (f"{wanted}kB", wanted << 10))


def boundary_query(source: Source, exclude: sql.Composable | None = None) -> sql.Composed:
    """The keys (as text) at the given positions in key order; one parameter: the positions as fractions
    (position - 0.5) / rows, which ``percentile_disc`` turns back into exact positions. ``exclude`` (SQL) drops
    bad rows from the numbering."""
    return sql.SQL(
        "SELECT CAST(percentile_disc(%s::float8[]) WITHIN GROUP (ORDER BY {key}) AS text[]) FROM {rel} {where}"
    ).format(key=source.key, rel=source.relation,
             where=sql.SQL("WHERE NOT {}").format(exclude) if exclude is not None else sql.SQL(""))
