"""The owner of ``pgtrain.model_versions``, ``pgtrain.model_heads`` and the heads' moves
(``pgtrain.model_head_history``): every statement on the three tables is a function here, and the other modules call
it (docs/architecture.md, "Who owns which table").

It sits with the run ledger, the lowest layer that reads a version (``data.freshness`` asks for the head's
watermark, ``data.manifest`` for a base version's spec, ``runs.record`` for the head a run starts from); the store
decides when to write (under its fenced lease) and calls the writes here. A spec comes back as stored: the store's
``data.upgrade.current_record`` turns an earlier release's into today's shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb


@dataclass(frozen=True)
class RunVersion:
    """The version a run committed, and what its commit did to the head."""

    model_name: str
    version: int
    metrics: dict[str, Any] | None
    created_at: datetime
    fencing_token: int
    is_head: bool
    head_moved: bool  # this run's own commit moved the head to it (model_head_history)
    previous_version: int | None  # the head before that move


def head_version(conn: psycopg.Connection, model_name: str) -> int | None:
    """The version the model's head points at, or None (no head yet)."""
    row = conn.execute("SELECT version FROM pgtrain.model_heads WHERE model_name = %s", (model_name,)).fetchone()
    return row[0] if row else None


def head_run(conn: psycopg.Connection, model_name: str) -> tuple[int, str | None] | None:
    """(head version, the run that trained it), or None when the model has no head."""
    row = conn.execute(
        """SELECT v.version, v.run_id FROM pgtrain.model_heads h
           JOIN pgtrain.model_versions v USING (model_name, version) WHERE h.model_name = %s""",
        (model_name,),
    ).fetchone()
    return None if row is None else (row[0], row[1])


def head_watermark(conn: psycopg.Connection, model_name: str, oid: int, key_column: str
                   ) -> tuple[int | None, str | None, bool | None]:
    """(head version, its watermark's max_key as text, whether that watermark is of the relation ``oid`` and key
    ``key_column``); all None when the model has no head."""
    row = conn.execute(
        """SELECT h.version, v.spec -> 'watermark' ->> 'max_key',
                  to_regclass(v.spec ->> 'source_table') = %(oid)s::oid AND v.spec ->> 'key_column' = %(key)s
           FROM pgtrain.model_heads h
           JOIN pgtrain.model_versions v ON v.model_name = h.model_name AND v.version = h.version
           WHERE h.model_name = %(model)s""",
        {"model": model_name, "oid": oid, "key": key_column},
    ).fetchone()
    return (None, None, None) if row is None else (row[0], row[1], row[2])


def spec(conn: psycopg.Connection, model_name: str, version: int | None) -> dict[str, Any] | None:
    """The version's spec as stored, or None when the model has no such version."""
    row = conn.execute("SELECT spec FROM pgtrain.model_versions WHERE model_name = %s AND version = %s",
                       (model_name, version)).fetchone()
    return None if row is None else row[0]


def of_run(conn: psycopg.Connection, run_id: str) -> RunVersion | None:
    """The version ``run_id`` committed, or None (not committed)."""
    row = conn.execute(
        """SELECT v.model_name, v.version, v.metrics, v.created_at, v.fencing_token, h.version IS NOT NULL,
                  m.id IS NOT NULL, m.previous_version
           FROM pgtrain.model_versions v
           LEFT JOIN pgtrain.model_heads h ON h.model_name = v.model_name AND h.version = v.version
           LEFT JOIN LATERAL (SELECT id, previous_version FROM pgtrain.model_head_history
                              WHERE model_name = v.model_name AND version = v.version AND action = 'commit'
                              ORDER BY id LIMIT 1) m ON true
           WHERE v.run_id = %s""",
        (run_id,),
    ).fetchone()
    return None if row is None else RunVersion(*row)


def exists(conn: psycopg.Connection, model_name: str, version: int) -> bool:
    return conn.execute("SELECT 1 FROM pgtrain.model_versions WHERE model_name = %s AND version = %s",
                        (model_name, version)).fetchone() is not None


def numbers(conn: psycopg.Connection, model_name: str) -> list[int]:
    """The model's version numbers, oldest first."""
    return [r[0] for r in conn.execute(
        "SELECT version FROM pgtrain.model_versions WHERE model_name = %s ORDER BY version", (model_name,))]


def row(conn: psycopg.Connection, model_name: str, version: int | None) -> dict[str, Any] | None:
    """One version's row with its head mark, or None."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT v.model_name, v.version, v.run_id, v.fencing_token, v.metrics, v.spec, v.created_at,
                      h.version IS NOT NULL AS is_head
               FROM pgtrain.model_versions v
               LEFT JOIN pgtrain.model_heads h ON h.model_name = v.model_name AND h.version = v.version
               WHERE v.model_name = %s AND v.version = %s""",
            (model_name, version),
        ).fetchone()


# -- the store's fenced writes call these, inside its transaction under the model's lease --------------------
def head_for_update(conn: psycopg.Connection, model_name: str) -> dict[str, Any] | None:
    """The head (version, fencing_token, and its version's metrics and stored spec), row-locked; None without."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT h.version, h.fencing_token, v.metrics, v.spec FROM pgtrain.model_heads h
               JOIN pgtrain.model_versions v USING (model_name, version)
               WHERE h.model_name = %s FOR UPDATE OF h""",
            (model_name,),
        ).fetchone()


def newest(conn: psycopg.Connection, model_name: str) -> tuple[int, int]:
    """(newest version, newest fencing token) of the model's versions, 0 for none."""
    version, token = conn.execute(
        """SELECT coalesce(max(version), 0), coalesce(max(fencing_token), 0)
           FROM pgtrain.model_versions WHERE model_name = %s""",
        (model_name,),
    ).fetchone()
    return version, token


def insert(conn: psycopg.Connection, model_name: str, version: int, run_id: str, token: int,
           metrics: dict[str, Any], spec: dict[str, Any]) -> None:
    conn.execute(
        """INSERT INTO pgtrain.model_versions (model_name, version, run_id, fencing_token, metrics, spec)
           VALUES (%s, %s, %s, %s, %s, %s)""",
        (model_name, version, run_id, token, Jsonb(metrics), Jsonb(spec)),
    )


def point_head(conn: psycopg.Connection, model_name: str, version: int, token: int) -> bool:
    """Point the head at ``version`` unless it was moved with a newer token than ``token``; True if it moved."""
    return conn.execute(
        """INSERT INTO pgtrain.model_heads AS h (model_name, version, fencing_token)
           VALUES (%s, %s, %s)
           ON CONFLICT (model_name) DO UPDATE
              SET version = EXCLUDED.version, fencing_token = EXCLUDED.fencing_token, updated_at = now()
              WHERE h.fencing_token <= EXCLUDED.fencing_token
           RETURNING version""",
        (model_name, version, token),
    ).fetchone() is not None


def record_head_move(conn: psycopg.Connection, model_name: str, version: int, previous_version: int | None,
                     token: int, action: str, owner: dict[str, Any]) -> None:
    """Add a move of the model's head (from ``previous_version`` to ``version``) to its history."""
    conn.execute(
        """INSERT INTO pgtrain.model_head_history
           (model_name, version, previous_version, fencing_token, action, owner)
           VALUES (%s, %s, %s, %s, %s, %s)""",
        (model_name, version, previous_version, token, action, Jsonb(owner)),
    )


def ever_head(conn: psycopg.Connection, model_name: str) -> set[int]:
    """Every version the model's head has pointed at (moved to or from)."""
    return {v for row in conn.execute(
        """SELECT version, previous_version FROM pgtrain.model_head_history
           WHERE model_name = %s""", (model_name,)) for v in row if v is not None}


def delete(conn: psycopg.Connection, model_name: str, doomed: list[int]) -> None:
    """Delete the version rows (their tensors first: the caller's)."""
    conn.execute("DELETE FROM pgtrain.model_versions WHERE model_name = %s AND version = ANY(%s)",
                 (model_name, doomed))


# -- what the catalog shows people -------------------------------------------------------------------------
def models(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """One row per model with a version (``store.catalog.list_models``)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT v.model_name, count(*) AS versions, max(v.version) AS newest_version,
                      max(v.created_at) AS newest_at, h.version AS head_version, h.updated_at AS head_moved_at,
                      (SELECT hv.metrics FROM pgtrain.model_versions hv
                        WHERE hv.model_name = h.model_name AND hv.version = h.version) AS head_metrics
               FROM pgtrain.model_versions v
               LEFT JOIN pgtrain.model_heads h ON h.model_name = v.model_name
               GROUP BY v.model_name, h.model_name, h.version, h.updated_at
               ORDER BY v.model_name"""
        ).fetchall()


def listed(conn: psycopg.Connection, model_name: str | None) -> list[dict[str, Any]]:
    """Versions (of one model, or all), oldest first, with their head mark and parent version."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT v.model_name, v.version, v.run_id, v.fencing_token, v.metrics, v.created_at,
                      h.version IS NOT NULL AS is_head, (v.spec ->> 'parent_version')::integer AS parent_version
               FROM pgtrain.model_versions v
               LEFT JOIN pgtrain.model_heads h ON h.model_name = v.model_name AND h.version = v.version
               WHERE %(model)s::text IS NULL OR v.model_name = %(model)s
               ORDER BY v.model_name, v.version""",
            {"model": model_name},
        ).fetchall()


def head_moves(conn: psycopg.Connection, model_name: str) -> list[dict[str, Any]]:
    """Every move of the model's head, oldest first."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT version, previous_version, fencing_token, action, owner, moved_at
               FROM pgtrain.model_head_history WHERE model_name = %s ORDER BY id""",
            (model_name,),
        ).fetchall()


def details(conn: psycopg.Connection, model_name: str, numbers: list[int]) -> list[dict[str, Any]]:
    """The given versions of a model (any order), each with its head mark and the rows its run planned."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT v.version, v.run_id, v.metrics, v.spec, v.created_at, h.version IS NOT NULL AS is_head,
                      p.excluded_rows, p.planned_at,
                      m.rows, m.train_rows, m.val_rows, m.test_rows, m.world_size
               FROM pgtrain.model_versions v
               LEFT JOIN pgtrain.model_heads h ON h.model_name = v.model_name AND h.version = v.version
               LEFT JOIN pgtrain.shard_plans p ON p.run_id = pgtrain.plan_of(v.run_id)
               LEFT JOIN LATERAL (
                   SELECT sum(row_count)::bigint AS rows, sum(train_count)::bigint AS train_rows,
                          sum(val_count)::bigint AS val_rows, sum(test_count)::bigint AS test_rows,
                          max(world_size) AS world_size
                   FROM pgtrain.shard_manifest s WHERE s.run_id = pgtrain.plan_of(v.run_id)) m ON true
               WHERE v.model_name = %s AND v.version = ANY(%s)""",
            (model_name, numbers),
        ).fetchall()
