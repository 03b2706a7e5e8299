"""compute_shards: check the source rows, then cut them into balanced keyset ranges, one per rank.

Everything happens in one REPEATABLE READ snapshot: the row profile (one scan), and the boundaries
(one ordered pass over the key index, keeping only the 2 x world_size boundary rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgtrain import runs
from pgtrain.errors import SourceError
from pgtrain.runs import Shard
from pgtrain.source import Source, feature_length, is_validation, resolve_source


@dataclass(frozen=True)
class Plan:
    shards: list[Shard]
    input_dim: int
    num_classes: int
    total_rows: int


def source_for(conn: psycopg.Connection, run: runs.Run) -> Source:
    c = run.config
    return resolve_source(conn, c.source_table, c.key_column, c.features_column, c.label_column)


def balanced_positions(total: int, world_size: int) -> list[tuple[int, int]]:
    """1-based inclusive (first, last) row positions of each rank; sizes differ by at most one."""
    base, extra = divmod(total, world_size)
    positions, first = [], 1
    for rank in range(world_size):
        size = base + (1 if rank < extra else 0)
        positions.append((first, first + size - 1))
        first += size
    return positions


def profile(conn: psycopg.Connection, source: Source) -> tuple[int, int, int]:
    """(row count, feature length, label bound) of the source; raises on an empty table or bad rows."""
    length = feature_length(source)
    rows = conn.execute(
        sql.SQL("SELECT {len}, count(*), max({label}) FROM {rel} GROUP BY 1").format(
            len=length, label=source.label, rel=source.relation
        )
    ).fetchall()
    total = sum(count for _, count, _ in rows)
    if total == 0:
        raise SourceError(
            f"source table {source.qualified_name} is empty: load training rows first "
            "(for the example data: make load-digits)"
        )
    input_dim = max((r for r in rows if r[0]), key=lambda r: r[1])[0]
    max_label = max(r[2] for r in rows if r[2] is not None)
    return total, input_dim, max_label + 1


def plan_shards(conn: psycopg.Connection, run: runs.Run) -> Plan:
    """Compute and write the manifest of ``run``; returns it. Fails with SourceError before writing anything."""
    config = run.config
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        source = source_for(conn, run)
        total, input_dim, inferred_classes = profile(conn, source)
        num_classes = config.num_classes or inferred_classes
        if config.world_size > total:
            raise SourceError(
                f"world_size {config.world_size} is larger than the {total} rows of {source.qualified_name}: "
                f"every rank needs at least one row; use world_size <= {total} or load more rows"
            )
        shards = boundaries(conn, source, total, config.world_size, config.validation_fraction, config.seed)
        runs.write_manifest(conn, run.run_id, shards, input_dim, num_classes)
    return Plan(shards, input_dim, num_classes, total)


def boundaries(conn: psycopg.Connection, source: Source, total: int, world_size: int,
               validation_fraction: float, seed: int) -> list[Shard]:
    positions = balanced_positions(total, world_size)
    wanted = sorted({p for pair in positions for p in pair})
    query = sql.SQL(
        """SELECT position, key::text, validation_rows FROM (
               SELECT {key} AS key,
                      row_number() OVER w AS position,
                      count(*) FILTER (WHERE {is_val}) OVER w AS validation_rows
               FROM {rel}
               WINDOW w AS (ORDER BY {key} ROWS UNBOUNDED PRECEDING)
           ) numbered
           WHERE position = ANY(%s)
           ORDER BY position"""
    ).format(key=source.key, rel=source.relation, is_val=is_validation(source, validation_fraction, seed))
    at = {position: (key, val) for position, key, val in conn.execute(query, (wanted,)).fetchall()}
    shards = []
    for rank, (first, last) in enumerate(positions):
        # Running counts include their own row; the count before `first` is the previous rank's last.
        val_before = at[first - 1][1] if first > 1 else 0
        val_count = at[last][1] - val_before
        rows = last - first + 1
        shards.append(Shard(rank, world_size, at[first][0], at[last][0], rows, rows - val_count, val_count))
    return shards
